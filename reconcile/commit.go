package reconcile

import (
	"slices"

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
	// grown is how many services-map entries the sync's writes add
	// (before its deletes free any).
	grown int
	// rangesGrown is the same for the source-ranges map.
	rangesGrown int

	tables []tableWrite
	// builtTables: the tables this sync built, by scheduler and
	// fingerprint; a Service's addresses (ClusterIP, external and LB
	// IPs) with the same backends share one build.
	builtTables map[string][]uint32
	delTables   []xbpf.SchedKey
	addMembers  []xbpf.MemberKey
	delMembers  []xbpf.MemberKey
	addRanges   []xbpf.LPMKey
	delRanges   []xbpf.LPMKey
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
	if err := d.w.svcStats.del(ws.freshSvcs); err != nil {
		return err
	}
	if err := d.w.backendStats.del(ws.freshBEs); err != nil {
		return err
	}
	if err := d.resetHeld(ws.freshBEs); err != nil {
		return err
	}
	if err := d.w.backends.put(ws.backendKeys, ws.backendVals); err != nil {
		return err
	}
	if err := d.w.services.put(ws.slotKeys, ws.slotVals); err != nil {
		return err
	}
	present := make([]uint32, len(ws.addMembers))
	if err := d.w.members.put(ws.addMembers, present); err != nil {
		return err
	}
	for _, t := range ws.tables {
		if err := d.w.schedTables.swap(t.key, t.entries); err != nil {
			return err
		}
	}
	// Members and ranges count by presence: their values are unused.
	if err := d.w.sourceRanges.put(ws.addRanges, make([]uint32, len(ws.addRanges))); err != nil {
		return err
	}
	if err := d.w.services.put(ws.headKeys, ws.headVals); err != nil {
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
	if err := d.w.services.del(ws.delSlots); err != nil {
		return err
	}
	if err := d.w.members.del(ws.delMembers); err != nil {
		return err
	}
	if err := d.w.schedTables.del(ws.delTables); err != nil {
		return err
	}
	if err := d.w.sourceRanges.del(ws.delRanges); err != nil {
		return err
	}
	if err := d.w.backends.del(ws.delBackends); err != nil {
		return err
	}
	// Counters last, of IDs still free: a flow to a removed backend may
	// flush into them until here. A later flush creates the entry again;
	// the ID's next holder deletes it as a fresh ID, a restart as unused.
	gone := slices.DeleteFunc(ws.delSvcIDs, d.svcIDs.isTaken)
	if err := d.w.svcStats.del(gone); err != nil {
		return err
	}
	return d.w.backendStats.del(slices.DeleteFunc(ws.delBackends, d.backendIDs.isTaken))
}

// resetHeld zeroes the least-connection counts of fresh backend IDs.
func (d *Datapath) resetHeld(ids []uint32) error {
	zero := make([]xbpf.Conns, len(ids))
	if err := d.w.held.put(ids, zero); err != nil {
		return err
	}
	return d.w.reaped.put(ids, zero)
}

// reconcileStats deletes the counters of IDs that nothing recovered from
// the pinned maps uses (an agent stopped between writes, a flush that
// raced an ID's release). IDs in use need no entry: the datapath creates
// one when it first counts for the ID.
func (d *Datapath) reconcileStats() error {
	for _, t := range []struct {
		m     counterMap
		taken func(uint32) bool
	}{{d.w.svcStats, d.svcIDs.isTaken}, {d.w.backendStats, d.backendIDs.isTaken}} {
		have, err := t.m.ids()
		if err != nil {
			return err
		}
		var stale []uint32
		for id := range have {
			if !t.taken(id) {
				stale = append(stale, id)
			}
		}
		if err := t.m.del(stale); err != nil {
			return err
		}
	}
	return nil
}
