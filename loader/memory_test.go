package loader

import (
	"testing"

	"github.com/cilium/ebpf"
)

// TestPrivMapMemory: the loaded maps' memory is the sum of every map's
// memlock, and the conntrack tables, taken up front as LRU maps, are in it.
func TestPrivMapMemory(t *testing.T) {
	cfg := testConfig(t, "memtest")
	objs, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	memlock := func(m *ebpf.Map) uint64 {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		n, ok := info.Memlock()
		if !ok {
			t.Fatal("no memlock in the map's info")
		}
		return n
	}
	ct := memlock(objs.XvsConntrack) + memlock(objs.XvsCtUnreplied)
	total := objs.MapMemory()
	if total <= ct || ct < uint64(cfg.ConntrackSize)*64 {
		t.Fatalf("map memory %d bytes, conntrack tables %d (for %d entries): want the tables and more", total, ct, cfg.ConntrackSize)
	}
	t.Logf("map memory %d MiB, conntrack tables %d MiB", total>>20, ct>>20)
}
