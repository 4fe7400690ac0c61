package loader

import (
	"reflect"

	"github.com/cilium/ebpf"
)

// MapMemory is the kernel memory the loaded maps take (their memlock, as
// `bpftool map show` gives it), the old maps of an unfinished resize
// included. Since Linux 5.11 it is charged to the memory cgroup of the
// process that created each map, so a container's memory limit has to hold
// it beside the Go heap. The inner maps the agent creates at run time (the
// weighted schedulers' tables) are not counted: they are small beside the
// conntrack tables, which dominate.
func (o *Objects) MapMemory() uint64 {
	var total uint64
	add := func(m *ebpf.Map) {
		if m == nil {
			return
		}
		if info, err := m.Info(); err == nil {
			if n, ok := info.Memlock(); ok {
				total += n
			}
		}
	}
	v := reflect.ValueOf(&o.XvsMaps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok {
			add(m)
		}
	}
	for _, m := range o.resizing {
		add(m)
	}
	for _, g := range o.regrowing {
		add(g.old)
	}
	return total
}
