package reconcile

import (
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
)

// The reconciler (Datapath) reads and writes the maps only through the
// narrow interfaces below: batched puts and deletes, a full read, and the
// two special kinds (scheduler tables swapped whole, per-CPU counters).
// In the agent they are the pinned BPF maps (bpfMaps); in tests an
// in-memory copy that records every operation, so that planning and the
// commit order are tested without root (memmaps_test.go).

// kvMap is one map of keys K to values V.
type kvMap[K comparable, V any] interface {
	// put writes keys[i] -> vals[i].
	put(keys []K, vals []V) error
	// add writes k -> v unless k has an entry (false, nil then); a map
	// without room fails with errMapFull.
	add(k K, v V) (bool, error)
	// del removes keys; keys already gone are not an error.
	del(keys []K) error
	// each calls fn with every entry; fn must not keep its pointers.
	each(fn func(k *K, v *V)) error
}

// schedMap is the map of scheduler tables: each entry an inner array,
// replaced whole so that a packet sees the old table or the new one.
type schedMap interface {
	swap(key xbpf.SchedKey, entries []uint32) error
	del(keys []xbpf.SchedKey) error
	each(fn func(xbpf.SchedKey)) error
}

// counterMap is a per-CPU counter map keyed by service or backend ID.
type counterMap interface {
	// del deletes the entries ids have. The datapath creates an ID's
	// entry when it first counts for it (stats_of), so a fresh ID is
	// deleted too: it may hold a previous owner's figures.
	del(ids []uint32) error
	// ids is the set of IDs with an entry.
	ids() (map[uint32]bool, error)
}

// mapSet is every map the reconciler touches.
type mapSet struct {
	services     kvMap[xbpf.SvcKey, xbpf.SvcValue]
	backends     kvMap[uint32, xbpf.Backend]
	members      kvMap[xbpf.MemberKey, uint32]
	sourceRanges kvMap[xbpf.LPMKey, uint32]
	clusterIPs   kvMap[xbpf.VIPKey, uint32]
	podCIDRs     kvMap[xbpf.LPMKey, uint32]
	serviceCIDRs kvMap[xbpf.LPMKey, uint32]
	nodeConfig   kvMap[uint32, xbpf.NodeConf]
	ifSNAT       kvMap[uint32, xbpf.IfAddrs]
	held, reaped kvMap[uint32, xbpf.Conns]
	// conntrack: the established and the unreplied table.
	conntrack    [2]kvMap[xbpf.CtKey, xbpf.CtEntry]
	sockFwd      kvMap[xbpf.XvsXvsSockKey, xbpf.XvsXvsSockValue]
	schedTables  schedMap
	svcStats     counterMap
	backendStats counterMap
}

// bpfMaps is the mapSet over the loaded maps.
func bpfMaps(m *maps.Maps) *mapSet {
	return &mapSet{
		services:     bpfMap[xbpf.SvcKey, xbpf.SvcValue]{m.Services},
		backends:     bpfMap[uint32, xbpf.Backend]{m.Backends},
		members:      bpfMap[xbpf.MemberKey, uint32]{m.Members},
		sourceRanges: bpfMap[xbpf.LPMKey, uint32]{m.SourceRanges},
		clusterIPs:   bpfMap[xbpf.VIPKey, uint32]{m.ClusterIPs},
		podCIDRs:     bpfMap[xbpf.LPMKey, uint32]{m.PodCIDRs},
		serviceCIDRs: bpfMap[xbpf.LPMKey, uint32]{m.ServiceCIDRs},
		nodeConfig:   bpfMap[uint32, xbpf.NodeConf]{m.NodeConfig},
		ifSNAT:       bpfMap[uint32, xbpf.IfAddrs]{m.IfSNAT},
		held:         bpfMap[uint32, xbpf.Conns]{m.BackendHeld},
		reaped:       bpfMap[uint32, xbpf.Conns]{m.BackendReaped},
		conntrack: [2]kvMap[xbpf.CtKey, xbpf.CtEntry]{
			bpfMap[xbpf.CtKey, xbpf.CtEntry]{m.Conntrack}, bpfMap[xbpf.CtKey, xbpf.CtEntry]{m.CtUnreplied},
		},
		sockFwd:      bpfMap[xbpf.XvsXvsSockKey, xbpf.XvsXvsSockValue]{m.SockFwd},
		schedTables:  bpfSchedMap{m.SchedTables},
		svcStats:     bpfCounters{m.SvcStats},
		backendStats: bpfCounters{m.BackendStats},
	}
}

type bpfMap[K comparable, V any] struct{ m *ebpf.Map }

func (b bpfMap[K, V]) put(keys []K, vals []V) error { return maps.UpdateMany(b.m, keys, vals) }
func (b bpfMap[K, V]) add(k K, v V) (bool, error)   { return addNew(b.m, k, v) }
func (b bpfMap[K, V]) del(keys []K) error           { return maps.DeleteMany(b.m, keys) }
func (b bpfMap[K, V]) each(fn func(k *K, v *V)) error {
	if b.m.Type() == ebpf.Hash || b.m.Type() == ebpf.LRUHash {
		return maps.Walk(b.m, fn) // batched reads
	}
	if err := maps.WalkOneByOne(b.m, fn); err != nil {
		return fmt.Errorf("read %s: %w", b.m, err)
	}
	return nil
}

type bpfSchedMap struct{ m *ebpf.Map }

// swap builds a complete inner map and then replaces the outer entry with
// it in one update.
func (b bpfSchedMap) swap(key xbpf.SchedKey, entries []uint32) error {
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "xvs_sched_tbl", Type: ebpf.Array, KeySize: 4, ValueSize: 4,
		MaxEntries: uint32(len(entries)), Flags: unix.BPF_F_INNER_MAP,
	})
	if err != nil {
		return fmt.Errorf("create scheduler table: %w", err)
	}
	defer inner.Close() // the outer map holds its own reference
	keys := make([]uint32, len(entries))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if err := maps.UpdateMany(inner, keys, entries); err != nil {
		return err
	}
	if err := b.m.Update(&key, uint32(inner.FD()), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swap scheduler table of service %d: %w", key.SvcId, err)
	}
	return nil
}

func (b bpfSchedMap) del(keys []xbpf.SchedKey) error { return maps.DeleteMany(b.m, keys) }

func (b bpfSchedMap) each(fn func(xbpf.SchedKey)) error {
	var k xbpf.SchedKey
	var fd uint32
	it := b.m.Iterate()
	for it.Next(&k, &fd) {
		fn(k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read scheduler tables: %w", err)
	}
	return nil
}

type bpfCounters struct{ m *ebpf.Map }

func (b bpfCounters) del(ids []uint32) error        { return maps.DeletePerCPU[xbpf.Stats](b.m, ids) }
func (b bpfCounters) ids() (map[uint32]bool, error) { return maps.PerCPUKeys[xbpf.Stats](b.m) }

// keysOf reads every key of m.
func keysOf[K comparable, V any](m kvMap[K, V]) ([]K, error) {
	var out []K
	err := m.each(func(k *K, _ *V) { out = append(out, *k) })
	return out, err
}

// clearAll removes every entry of m.
func clearAll[K comparable, V any](m kvMap[K, V]) error {
	keys, err := keysOf(m)
	if err != nil {
		return err
	}
	return m.del(keys)
}
