package reconcile

import (
	"errors"
	"fmt"
	"strings"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// An in-memory mapSet for tests without root: every map a plain Go map,
// and every write or delete recorded, in order, in one opLog, so that a
// test reads what a sync did as the kernel would have seen it.

// op is one recorded put or del: the map, and the class of each key in
// the order given (for the services map: "head" for slot 0, "slot"
// otherwise; other maps: the map's name).
type op struct {
	kind, name string
	classes    []string
}

func (o op) String() string { return o.kind + " " + o.name + " " + strings.Join(o.classes, ",") }

type opLog struct{ ops []op }

// index is the position of the first op matching kind, name and (when not
// empty) class, or -1.
func (l *opLog) index(kind, name, class string) int {
	for i, o := range l.ops {
		if o.kind == kind && o.name == name && (class == "" || containsStr(o.classes, class)) {
			return i
		}
	}
	return -1
}

func containsStr(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

var errMemFull = errors.New("map full (E2BIG)")

type memMap[K comparable, V any] struct {
	name  string
	m     map[K]V
	log   *opLog
	class func(K) string
	// max, when nonzero, is the map's capacity; fail makes every write
	// fail (a map a test breaks).
	max  int
	fail bool
}

func newMem[K comparable, V any](name string, log *opLog) *memMap[K, V] {
	return &memMap[K, V]{name: name, m: map[K]V{}, log: log}
}

func (t *memMap[K, V]) classes(keys []K) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = t.name
		if t.class != nil {
			out[i] = t.class(k)
		}
	}
	return out
}

func (t *memMap[K, V]) put(keys []K, vals []V) error {
	if len(keys) == 0 {
		return nil
	}
	if t.fail {
		return fmt.Errorf("update %s: injected failure", t.name)
	}
	t.log.ops = append(t.log.ops, op{"put", t.name, t.classes(keys)})
	for i, k := range keys {
		if _, ok := t.m[k]; !ok && t.max > 0 && len(t.m) >= t.max {
			return fmt.Errorf("update %s: %w", t.name, errMemFull)
		}
		t.m[k] = vals[i]
	}
	return nil
}

func (t *memMap[K, V]) add(k K, v V) (bool, error) {
	if t.fail {
		return false, fmt.Errorf("update %s: injected failure", t.name)
	}
	if _, ok := t.m[k]; ok {
		return false, nil
	}
	if t.max > 0 && len(t.m) >= t.max {
		return false, fmt.Errorf("update %s: %w: %w", t.name, errMapFull, errMemFull)
	}
	t.log.ops = append(t.log.ops, op{"add", t.name, t.classes([]K{k})})
	t.m[k] = v
	return true, nil
}

func (t *memMap[K, V]) del(keys []K) error {
	if len(keys) == 0 {
		return nil
	}
	t.log.ops = append(t.log.ops, op{"del", t.name, t.classes(keys)})
	for _, k := range keys {
		delete(t.m, k)
	}
	return nil
}

func (t *memMap[K, V]) each(fn func(k *K, v *V)) error {
	for k, v := range t.m {
		fn(&k, &v)
	}
	return nil
}

type memSched struct {
	m   map[xbpf.SchedKey][]uint32
	log *opLog
}

func (s *memSched) swap(key xbpf.SchedKey, entries []uint32) error {
	s.log.ops = append(s.log.ops, op{"put", "sched_tables", []string{"sched_tables"}})
	s.m[key] = append([]uint32(nil), entries...)
	return nil
}

func (s *memSched) del(keys []xbpf.SchedKey) error {
	if len(keys) == 0 {
		return nil
	}
	s.log.ops = append(s.log.ops, op{"del", "sched_tables", []string{"sched_tables"}})
	for _, k := range keys {
		delete(s.m, k)
	}
	return nil
}

func (s *memSched) each(fn func(xbpf.SchedKey)) error {
	for k := range s.m {
		fn(k)
	}
	return nil
}

type memCounters struct {
	name string
	m    map[uint32]bool
	log  *opLog
}

func (c *memCounters) del(ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	c.log.ops = append(c.log.ops, op{"del", c.name, []string{c.name}})
	for _, id := range ids {
		delete(c.m, id)
	}
	return nil
}

func (c *memCounters) ids() (map[uint32]bool, error) {
	out := map[uint32]bool{}
	for id := range c.m {
		out[id] = true
	}
	return out, nil
}

// memSet is an in-memory mapSet with its maps at hand.
type memSet struct {
	*mapSet
	log      *opLog
	services *memMap[xbpf.SvcKey, xbpf.SvcValue]
	backends *memMap[uint32, xbpf.Backend]
	members  *memMap[xbpf.MemberKey, uint32]
	ranges   *memMap[xbpf.LPMKey, uint32]
	vips     *memMap[xbpf.VIPKey, uint32]
	sched    *memSched
	svcStats *memCounters
	beStats  *memCounters
}

func newMemSet() *memSet {
	log := &opLog{}
	s := &memSet{
		log:      log,
		services: newMem[xbpf.SvcKey, xbpf.SvcValue]("services", log),
		backends: newMem[uint32, xbpf.Backend]("backends", log),
		members:  newMem[xbpf.MemberKey, uint32]("members", log),
		ranges:   newMem[xbpf.LPMKey, uint32]("source_ranges", log),
		vips:     newMem[xbpf.VIPKey, uint32]("cluster_ips", log),
		sched:    &memSched{m: map[xbpf.SchedKey][]uint32{}, log: log},
		svcStats: &memCounters{name: "svc_stats", m: map[uint32]bool{}, log: log},
		beStats:  &memCounters{name: "backend_stats", m: map[uint32]bool{}, log: log},
	}
	s.services.class = func(k xbpf.SvcKey) string {
		if k.Slot == 0 {
			return "head"
		}
		return "slot"
	}
	s.mapSet = &mapSet{
		services:     s.services,
		backends:     s.backends,
		members:      s.members,
		sourceRanges: s.ranges,
		clusterIPs:   s.vips,
		podCIDRs:     newMem[xbpf.LPMKey, uint32]("pod_cidrs", log),
		serviceCIDRs: newMem[xbpf.LPMKey, uint32]("service_cidrs", log),
		nodeConfig:   newMem[uint32, xbpf.NodeConf]("node_config", log),
		ifSNAT:       newMem[uint32, xbpf.IfAddrs]("if_snat", log),
		held:         newMem[uint32, xbpf.Conns]("backend_held", log),
		reaped:       newMem[uint32, xbpf.Conns]("backend_reaped", log),
		conntrack: [2]kvMap[xbpf.CtKey, xbpf.CtEntry]{
			newMem[xbpf.CtKey, xbpf.CtEntry]("conntrack", log), newMem[xbpf.CtKey, xbpf.CtEntry]("ct_unreplied", log),
		},
		sockFwd:      newMem[xbpf.XvsXvsSockKey, xbpf.XvsXvsSockValue]("sock_fwd", log),
		schedTables:  s.sched,
		svcStats:     s.svcStats,
		backendStats: s.beStats,
	}
	return s
}
