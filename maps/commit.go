package maps

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// Committing: a sync's writeSet reaches the maps in the order that never
// shows a packet a half-written Service (backends, slots, scheduler tables
// and member sets, then the heads that make frontends visible; deletes
// last), and the per-ID counters follow the IDs in use.

// writeSet collects one sync's map operations in commit order.
type writeSet struct {
	backendKeys []uint32
	backendVals []xbpf.Backend
	slotKeys    []xbpf.SvcKey
	slotVals    []xbpf.SvcValue
	headKeys    []xbpf.SvcKey
	headVals    []xbpf.SvcValue
	delSlots    []xbpf.SvcKey // heads of removed frontends first, then slots
	delBackends []uint32      // their IDs, which also key their counters
	delSvcIDs   []uint32      // service IDs released: their counters go
	freshSvcs   []uint32
	freshBEs    []uint32
	undo        []backendUndo // backend entries changed for the current frontend

	tables     []tableWrite
	delTables  []xbpf.SchedKey
	addMembers []xbpf.MemberKey
	delMembers []xbpf.MemberKey
	addRanges  []xbpf.LPMKey
	delRanges  []xbpf.LPMKey
}

type tableWrite struct {
	key     xbpf.SchedKey
	entries []uint32
}

// flushSlots is how many planned slots a sync holds before writing them
// (a variable for tests).
var flushSlots = 64 << 10

// commit writes a sync's entries, then deletes what it removes.
func (d *Datapath) commit(ws *writeSet) error {
	if err := d.commitWrites(ws); err != nil {
		return err
	}
	return d.commitDeletes(ws)
}

// commitWrites writes the entries planned so far in commit order and
// forgets them; the deletes wait for commitDeletes, after every write.
func (d *Datapath) commitWrites(ws *writeSet) error {
	if err := d.resetStats(d.m.SvcStats, ws.freshSvcs); err != nil {
		return err
	}
	if err := d.resetStats(d.m.BackendStats, ws.freshBEs); err != nil {
		return err
	}
	if err := d.resetHeld(ws.freshBEs); err != nil {
		return err
	}
	if err := updateMany(d.m.Backends, ws.backendKeys, ws.backendVals); err != nil {
		return err
	}
	if err := updateMany(d.m.Services, ws.slotKeys, ws.slotVals); err != nil {
		return err
	}
	present := make([]uint32, len(ws.addMembers))
	if err := updateMany(d.m.Members, ws.addMembers, present); err != nil {
		return err
	}
	for _, t := range ws.tables {
		if err := d.swapTable(t); err != nil {
			return err
		}
	}
	one := make([]uint32, len(ws.addRanges))
	if err := updateMany(d.m.SourceRanges, ws.addRanges, one); err != nil {
		return err
	}
	if err := updateMany(d.m.Services, ws.headKeys, ws.headVals); err != nil {
		return err
	}
	ws.freshSvcs, ws.freshBEs = ws.freshSvcs[:0], ws.freshBEs[:0]
	ws.backendKeys, ws.backendVals = ws.backendKeys[:0], ws.backendVals[:0]
	ws.slotKeys, ws.slotVals = ws.slotKeys[:0], ws.slotVals[:0]
	ws.addMembers, ws.tables, ws.addRanges = ws.addMembers[:0], ws.tables[:0], ws.addRanges[:0]
	ws.headKeys, ws.headVals = ws.headKeys[:0], ws.headVals[:0]
	return nil
}

// commitDeletes removes entries after every write: slots beyond their
// head's new count, then removed frontends (heads first), members,
// tables, ranges and backends.
func (d *Datapath) commitDeletes(ws *writeSet) error {
	if err := deleteMany(d.m.Services, ws.delSlots); err != nil {
		return err
	}
	if err := deleteMany(d.m.Members, ws.delMembers); err != nil {
		return err
	}
	if err := deleteMany(d.m.SchedTables, ws.delTables); err != nil {
		return err
	}
	if err := deleteMany(d.m.SourceRanges, ws.delRanges); err != nil {
		return err
	}
	if err := deleteMany(d.m.Backends, ws.delBackends); err != nil {
		return err
	}
	// Counters last, of IDs still free: a flow to a removed backend may
	// flush into them until here, and finds none after.
	gone := slices.DeleteFunc(ws.delSvcIDs, d.svcIDs.isTaken)
	if err := deleteMany(d.m.SvcStats, gone); err != nil {
		return err
	}
	return deleteMany(d.m.BackendStats, slices.DeleteFunc(ws.delBackends, d.backendIDs.isTaken))
}

// swapTable builds a complete inner map and then replaces the outer entry
// with it in one update: a packet sees the old table or the new one,
// never a partial one.
func (d *Datapath) swapTable(t tableWrite) error {
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "xvs_sched_tbl", Type: ebpf.Array, KeySize: 4, ValueSize: 4,
		MaxEntries: uint32(len(t.entries)), Flags: unix.BPF_F_INNER_MAP,
	})
	if err != nil {
		return fmt.Errorf("create scheduler table: %w", err)
	}
	defer inner.Close() // the outer map holds its own reference
	keys := make([]uint32, len(t.entries))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if err := updateMany(inner, keys, t.entries); err != nil {
		return err
	}
	if err := d.m.SchedTables.Update(&t.key, uint32(inner.FD()), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swap scheduler table of service %d: %w", t.key.SvcId, err)
	}
	return nil
}

// resetHeld zeroes the least-connection counts of fresh backend IDs.
func (d *Datapath) resetHeld(ids []uint32) error {
	zero := make([]xbpf.Conns, len(ids))
	if err := updateMany(d.m.BackendHeld, ids, zero); err != nil {
		return err
	}
	return updateMany(d.m.BackendReaped, ids, zero)
}

// resetStats zeroes the counters of freshly allocated IDs, which may hold
// the figures of a previous owner.
func (d *Datapath) resetStats(m *ebpf.Map, ids []uint32) error {
	return zeroPerCPU[xbpf.Stats](m, ids)
}

// reconcileStats makes the counter maps hold an entry for exactly the IDs
// recovered from the pinned maps: a zeroed one where it is missing (maps
// pinned by a build that kept the counters elsewhere, an agent stopped
// between writes), none for IDs nothing uses.
func (d *Datapath) reconcileStats() error {
	svcs := make([]uint32, 0, len(d.svcIDs.ids))
	for _, id := range d.svcIDs.ids {
		svcs = append(svcs, id)
	}
	bes := make([]uint32, 0, len(d.backends))
	for _, e := range d.backends {
		bes = append(bes, e.id)
	}
	for _, t := range []struct {
		m     *ebpf.Map
		ids   []uint32
		taken func(uint32) bool
	}{{d.m.SvcStats, svcs, d.svcIDs.isTaken}, {d.m.BackendStats, bes, d.backendIDs.isTaken}} {
		have, err := perCPUKeys[xbpf.Stats](t.m)
		if err != nil {
			return err
		}
		var stale []uint32
		for id := range have {
			if !t.taken(id) {
				stale = append(stale, id)
			}
		}
		if err := deleteMany(t.m, stale); err != nil {
			return err
		}
		missing := slices.DeleteFunc(t.ids, func(id uint32) bool { return have[id] })
		if err := zeroPerCPU[xbpf.Stats](t.m, missing); err != nil {
			return err
		}
	}
	return nil
}
