package reconcile

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// Planning: what a ServicePort's frontends need in the maps (backends,
// slots, scheduler tables and member sets, with their IDs), written into
// the sync's writeSet; nothing reaches the maps here (commit.go).

// frontendSets returns the endpoint sets a frontend balances to, by scope
// (0: traffic subject to the policy, 1: the pod and host short-circuit of
// eTP=Local), and how many scopes it has.
func frontendSets(sp *model.ServicePort, f model.Frontend) (sets [2][]model.Endpoint, scopes int) {
	sets[0] = sp.EndpointsFor(f.Kind)
	if sp.ShortCircuits(f.Kind) {
		sets[1] = sp.ClusterEndpoints
		return sets, 2
	}
	return sets, 1
}

// backendOf is the backend an endpoint of frontend fk is; false when the
// endpoint is of the other family (a frontend only balances to its own).
func backendOf(fk maps.FrontendKey, ep model.Endpoint) (maps.BackendKey, bool) {
	a := ep.Addr.Unmap()
	if a.Is4() != fk.Addr.Is4() {
		return maps.BackendKey{}, false
	}
	return maps.NewBackendKey(a, ep.Port, fk.Proto), true
}

// plan computes the entries of one ServicePort. It takes a frontend only
// once every ID it needs is allocated, so that release can recompute what
// it took from sp and the frontends it owns.
func (d *Datapath) plan(name model.ServicePortName, sp *model.ServicePort, ws *writeSet, released map[maps.FrontendKey]bool) error {
	prev := d.previous[name]
	err := d.planFitting(name, sp, ws, released)
	if errors.Is(err, errNoRoom) && prev != nil && prev.sp != nil && prev.sp != sp {
		// Refused alone, the port keeps what it had (which fits: it is
		// there) and is tried again.
		if perr := d.planFitting(name, prev.sp, ws, released); perr != nil {
			return errors.Join(err, perr)
		}
	}
	return err
}

// errNoRoom: a map cannot take a ServicePort's entries.
var errNoRoom = errors.New("no room")

// planFitting is plan for sp, if the services and source-ranges maps can
// take its entries.
func (d *Datapath) planFitting(name model.ServicePortName, sp *model.ServicePort, ws *writeSet, released map[maps.FrontendKey]bool) error {
	a := &appliedService{sp: sp}
	d.applied[name] = a
	if sp == nil {
		return nil
	}
	if err := d.reserve(name, sp, ws); err != nil {
		a.sp = nil // nothing of it is programmed
		return err
	}
	sched, err := maps.SchedulerByName(sp.Scheduler)
	if err != nil {
		// One bad annotation must not stop the other services.
		d.problem(name, "%s: %v; using random", name, err)
	}
	groupID, err := d.groupID(name, sp)
	if err != nil {
		return fmt.Errorf("group id: %w", err)
	}
	pp := &portPlan{name: name, sp: sp, a: a, sched: sched, groupID: groupID, ws: ws, released: released}
	for _, f := range sp.Frontends {
		fk := maps.KeyOf(f)
		if owner, ok := d.owners[fk]; ok && owner != name {
			d.problem(name, "%s %s is already served by %s", name, f, owner)
			continue
		}
		if slices.ContainsFunc(a.frontends, func(o model.Frontend) bool { return maps.KeyOf(o) == fk }) {
			continue // the same address listed twice
		}
		if err := d.planFrontend(pp, f); err != nil {
			return err
		}
	}
	return nil
}

// reserve counts sp's growth of the services and source-ranges maps
// against what the sync has left of them, or says which is full.
func (d *Datapath) reserve(name model.ServicePortName, sp *model.ServicePort, ws *writeSet) error {
	grow, rangeGrow := d.growth(name, sp)
	if d.slotCap > 0 && d.slotsAtStart+ws.grown+grow > d.slotCap {
		return fmt.Errorf("%w: the services map is full: this port needs %d more entries, %d of %d are free (raise --bpf-max-service-slots)",
			errNoRoom, grow, max(0, d.slotCap-d.slotsAtStart-ws.grown), d.slotCap)
	}
	if d.rangeCap > 0 && d.rangesAtStart+ws.rangesGrown+rangeGrow > d.rangeCap {
		return fmt.Errorf("%w: the source-ranges map is full: this port's loadBalancerSourceRanges need %d more entries, %d of %d are free (raise --bpf-max-services)",
			errNoRoom, rangeGrow, max(0, d.rangeCap-d.rangesAtStart-ws.rangesGrown), d.rangeCap)
	}
	ws.rangesGrown += rangeGrow
	ws.grown += grow
	return nil
}

// portPlan is what planning one ServicePort's frontends shares.
type portPlan struct {
	name     model.ServicePortName
	sp       *model.ServicePort
	a        *appliedService
	sched    xbpf.Sched
	groupID  uint32
	ws       *writeSet
	released map[maps.FrontendKey]bool
	ids      [2][]uint32 // backend IDs per scope, reused from frontend to frontend
}

// planFrontend takes the IDs one frontend needs (undoing its backend writes
// if one is missing), claims it for the port, and queues its head, slots,
// scheduler table, members and source ranges.
func (d *Datapath) planFrontend(pp *portPlan, f model.Frontend) error {
	ws, sp, name := pp.ws, pp.sp, pp.name
	fk := maps.KeyOf(f)
	sets, scopes := frontendSets(sp, f)
	ws.undo = ws.undo[:0] // only this frontend's writes can be undone
	mark := ws.mark()
	var err error
	for scope := range scopes {
		if len(sets[scope]) > 0xffff-1 {
			err = fmt.Errorf("%s: %d endpoints exceed the slot limit", f, len(sets[scope]))
		} else {
			pp.ids[scope], err = d.backendIDsFor(fk, sets[scope], pp.ids[scope][:0], ws)
		}
		if err != nil {
			d.undoBackends(ws, mark)
			return err
		}
	}
	svcID, fresh, err := d.svcIDs.get(fk)
	if err != nil {
		d.undoBackends(ws, mark)
		return fmt.Errorf("service id: %w", err)
	}
	if fresh {
		ws.freshSvcs = append(ws.freshSvcs, svcID)
	}
	if f.Proto == model.SCTP {
		for _, ep := range sp.EndpointsForFrontend(f) {
			if ep.Port != f.Port {
				d.problem(name, "%s %s: SCTP port translation (to %s) is not supported by the ebpf datapath (its CRC32c covers the ports): such packets are dropped; use targetPort = port, or ipvs mode", name, f, ep)
				break
			}
		}
	}
	d.owners[fk] = name
	delete(pp.released, fk)
	pp.a.frontends = append(pp.a.frontends, f)
	if f.Kind == model.ClusterIP {
		d.node.clusterIPs[fk.Addr]++
		d.node.dirtyIPs[fk.Addr] = true
	}

	head := headOf(sp, f, svcID, pp.groupID, pp.sched, scopes)
	var ranges map[xbpf.LPMKey]bool
	if head.Flags&uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SOURCE_RANGES) != 0 {
		ranges = sourceRangeKeys(svcID, sp, f, d.nodeAddrs)
	}
	d.planRanges(svcID, ranges, ws)
	var written slotCounts
	for scope := range scopes {
		set := d.planSlots(fk, uint8(scope), sets[scope], pp.ids[scope], svcID, ws)
		n := uint16(len(set))
		h := head
		h.Count = n
		sk := xbpf.SchedKey{SvcId: svcID, Scope: uint8(scope)}
		if h.TableSize, err = d.planTable(sk, pp.sched, set, ws); err != nil {
			// Slots and references are taken: keep the frontend,
			// balancing at random until the retry builds the table.
			d.problem(name, "%s %s: %v", name, f, err)
			d.retry[name] = true
			h.Sched = uint8(xbpf.XvsXvsSchedXVS_SCHED_RANDOM)
		}
		d.planMembers(sk, sp.Affinity.ClientIP, set, ws)
		ws.headKeys = append(ws.headKeys, fk.SvcKey(uint8(scope), 0))
		ws.headVals = append(ws.headVals, h)
		written.n[scope] = n
		written.shortCircuit = written.shortCircuit || scope == 1
	}
	d.dropStaleSlots(fk, svcID, written, ws)
	return nil
}

// headOf is frontend f's head (slot 0) without its count and table size:
// its IDs, scheduler, kind and the flags the program tests.
func headOf(sp *model.ServicePort, f model.Frontend, svcID, groupID uint32, sched xbpf.Sched, scopes int) xbpf.SvcValue {
	head := xbpf.SvcValue{SvcId: svcID, GroupId: groupID, Sched: uint8(sched), Kind: maps.KindOf(f.Kind)}
	if sp.HasEndpointsFor(f.Addr) {
		head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS)
	}
	if sp.Affinity.ClientIP {
		head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_AFFINITY)
		head.AffinityTimeout = sp.Affinity.TimeoutSeconds
	}
	if f.Kind == model.LoadBalancer && len(sp.SourceRangesFor(f.Addr)) > 0 {
		head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SOURCE_RANGES)
	}
	if sp.LocalPolicy(f.Kind) {
		head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_LOCAL)
	}
	if scopes == 2 {
		// Pods and the host short-circuit to the cluster set.
		head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT)
	}
	return head
}

// growth is how many services-map and source-ranges entries planning sp
// would add to what its frontends hold now: each frontend it would claim
// needs a head and a slot per backend of its family, per scope, and an LB
// frontend one entry per source range (sourceRangeKeys).
func (d *Datapath) growth(name model.ServicePortName, sp *model.ServicePort) (slots, ranges int) {
	seen := make(map[maps.FrontendKey]bool, len(sp.Frontends))
	for _, f := range sp.Frontends {
		fk := maps.KeyOf(f)
		if owner, ok := d.owners[fk]; ok && owner != name || seen[fk] {
			continue
		}
		seen[fk] = true
		sets, scopes := frontendSets(sp, f)
		need := 0
		for scope := range scopes {
			need++
			for _, ep := range sets[scope] {
				if _, ok := backendOf(fk, ep); ok {
					need++
				}
			}
		}
		have := 0
		if c, ok := d.counts[fk]; ok {
			have = c.entries()
		}
		slots += max(0, need-have)
		if f.Kind == model.LoadBalancer && len(sp.SourceRangesFor(f.Addr)) > 0 {
			id, _ := d.svcIDs.lookup(fk) // a fresh frontend holds none
			held := d.node.ranges[id]
			for k := range sourceRangeKeys(id, sp, f, d.nodeAddrs) {
				if !held[k] {
					ranges++
				}
			}
		}
	}
	return slots, ranges
}

// backendIDsFor returns the IDs of a set's backends of fk's family, in
// slot order, allocating and queueing the writes of new or changed ones.
// It takes no reference: the caller takes them, or undoes the
// allocations.
func (d *Datapath) backendIDsFor(fk maps.FrontendKey, eps []model.Endpoint, ids []uint32, ws *writeSet) ([]uint32, error) {
	for _, ep := range eps {
		bk, ok := backendOf(fk, ep)
		if !ok {
			continue
		}
		id, err := d.backend(bk, ep, ws)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// planSlots queues slots 1..N of one (frontend, scope), takes a reference
// on each backend, and returns the backends in slot order.
func (d *Datapath) planSlots(fk maps.FrontendKey, scope uint8, eps []model.Endpoint, ids []uint32, svcID uint32, ws *writeSet) []tableBackend {
	set := make([]tableBackend, 0, len(ids))
	for _, ep := range eps {
		bk, ok := backendOf(fk, ep)
		if !ok {
			continue
		}
		d.backends.addRef(bk, 1)
		id := ids[len(set)]
		n := uint16(len(set) + 1)
		ws.slotKeys = append(ws.slotKeys, fk.SvcKey(scope, n))
		ws.slotVals = append(ws.slotVals, xbpf.SvcValue{BackendId: id, SvcId: svcID})
		set = append(set, tableBackend{id: id, weight: ep.SchedWeight(), key: bk})
	}
	return set
}

// planTable queues the scheduler table of one (frontend, scope) when its
// scheduler has one and its backends changed, or its removal when it no
// longer needs one. It returns the table's size for the service head.
func (d *Datapath) planTable(sk xbpf.SchedKey, sched xbpf.Sched, set []tableBackend, ws *writeSet) (uint32, error) {
	have, exists := d.tables[sk]
	if len(set) == 0 || (sched != xbpf.XvsXvsSchedXVS_SCHED_WRR && sched != xbpf.XvsXvsSchedXVS_SCHED_MH) {
		if exists {
			delete(d.tables, sk)
			ws.delTables = append(ws.delTables, sk)
		}
		return 0, nil
	}
	for i := range set {
		if set[i].name == "" {
			set[i].name = set[i].key.String()
		}
	}
	want := tableState{sched: sched, backends: tableFingerprint(set)}
	if exists && have.sched == want.sched && have.backends == want.backends {
		return have.size, nil
	}
	built := fmt.Sprintf("%d|%s", sched, want.backends)
	entries, ok := ws.builtTables[built]
	switch {
	case ok:
	case sched == xbpf.XvsXvsSchedXVS_SCHED_WRR:
		entries = wrrSequence(set)
	default:
		var err error
		if entries, err = maglevTable(set, d.maglevSize); err != nil {
			return 0, err
		}
	}
	if ws.builtTables == nil {
		ws.builtTables = map[string][]uint32{}
	}
	ws.builtTables[built] = entries
	want.size = uint32(len(entries))
	d.tables[sk] = want
	ws.tables = append(ws.tables, tableWrite{key: sk, entries: entries})
	return want.size, nil
}

// tableFingerprint is what a table is built from: IDs, weights and names
// in slot order (order matters to wrr).
func tableFingerprint(set []tableBackend) string {
	var b strings.Builder
	for _, t := range set {
		fmt.Fprintf(&b, "%d/%d/%s,", t.id, t.weight, t.name)
	}
	return b.String()
}

// planMembers keeps the membership entries of an affinity frontend equal
// to its slot set; frontends without affinity have none.
func (d *Datapath) planMembers(sk xbpf.SchedKey, affinity bool, set []tableBackend, ws *writeSet) {
	have := d.members[sk]
	want := map[uint32]bool{}
	if affinity {
		for _, t := range set {
			want[t.id] = true
		}
	}
	for id := range want {
		if !have[id] {
			ws.addMembers = append(ws.addMembers, xbpf.MemberKey{SvcId: sk.SvcId, BackendId: id, Scope: sk.Scope})
		}
	}
	for id := range have {
		if !want[id] {
			ws.delMembers = append(ws.delMembers, xbpf.MemberKey{SvcId: sk.SvcId, BackendId: id, Scope: sk.Scope})
		}
	}
	if len(want) == 0 {
		delete(d.members, sk)
	} else {
		d.members[sk] = want
	}
}

// sweepSchedState queues the removal of scheduler tables and membership
// entries that no frontend wants (left by a previous agent).
func (d *Datapath) sweepSchedState(ws *writeSet) error {
	err := d.w.schedTables.each(func(sk xbpf.SchedKey) {
		if _, ok := d.tables[sk]; !ok && !slices.Contains(ws.delTables, sk) {
			ws.delTables = append(ws.delTables, sk)
		}
	})
	if err != nil {
		return err
	}
	err = d.w.members.each(func(mk *xbpf.MemberKey, _ *uint32) {
		if !d.members[xbpf.SchedKey{SvcId: mk.SvcId, Scope: mk.Scope}][mk.BackendId] {
			ws.delMembers = append(ws.delMembers, *mk)
		}
	})
	if err != nil {
		return fmt.Errorf("read members: %w", err)
	}
	return nil
}

// dropSchedState queues the removal of a (frontend, scope)'s table and
// membership entries.
func (d *Datapath) dropSchedState(sk xbpf.SchedKey, ws *writeSet) {
	if _, ok := d.tables[sk]; ok {
		delete(d.tables, sk)
		ws.delTables = append(ws.delTables, sk)
	}
	d.planMembers(sk, false, nil, ws)
}

// wsMark is where a writeSet's backend writes stood, to undo a frontend
// whose backends did not all get an ID.
type wsMark struct{ backends, fresh, undo int }

func (ws *writeSet) mark() wsMark {
	return wsMark{len(ws.backendKeys), len(ws.freshBEs), len(ws.undo)}
}

// backendUndo is a backend entry as it was before this sync changed it.
type backendUndo struct {
	key     maps.BackendKey
	entry   backendEntry
	existed bool
}

// undoBackends takes back the backend writes and allocations made since
// mark: the IDs go back to the free space at once, so that the next
// services of this sync can have them (they were never written).
func (d *Datapath) undoBackends(ws *writeSet, m wsMark) {
	for i := len(ws.undo) - 1; i >= m.undo; i-- {
		u := ws.undo[i]
		if u.existed {
			d.backends.set(u.key, u.entry)
			continue
		}
		e, _ := d.backends.get(u.key)
		d.backendIDs.free(e.id)
		d.backends.delete(u.key)
		delete(d.unreferenced, u.key)
	}
	ws.undo = ws.undo[:m.undo]
	ws.backendKeys, ws.backendVals = ws.backendKeys[:m.backends], ws.backendVals[:m.backends]
	ws.freshBEs = ws.freshBEs[:m.fresh]
}

// backend returns bk's ID, allocating one for a new backend and queueing
// a write when the backend is new or its attributes changed.
func (d *Datapath) backend(bk maps.BackendKey, ep model.Endpoint, ws *writeSet) (uint32, error) {
	e, ok := d.backends.get(bk)
	old := e
	if !ok {
		id, err := d.backendIDs.alloc()
		if err != nil {
			return 0, fmt.Errorf("backend %s: %w", bk, err)
		}
		ws.freshBEs = append(ws.freshBEs, id)
		e = backendEntry{id: id}
	}
	var flags uint8
	if ep.Local {
		flags |= uint8(xbpf.XvsXvsBackendFlagsXVS_BACKEND_F_LOCAL)
	}
	if slices.Contains(d.nodeAddrs, bk.Addr()) {
		flags |= uint8(xbpf.XvsXvsBackendFlagsXVS_BACKEND_F_HOST)
		d.node.hostBackends[bk] = struct{}{}
	}
	weight := ep.SchedWeight()
	if !ok || e.weight != weight || e.flags != flags {
		ws.undo = append(ws.undo, backendUndo{key: bk, entry: old, existed: ok})
		e.weight, e.flags = weight, flags
		d.backends.set(bk, e)
		addr, fam := maps.EncodeAddr(bk.Addr())
		ws.backendKeys = append(ws.backendKeys, e.id)
		ws.backendVals = append(ws.backendVals, xbpf.Backend{
			Addr: addr, Port: maps.Htons(bk.Port), Family: fam, Proto: uint8(bk.Proto), Weight: weight, Flags: flags,
		})
	}
	return e.id, nil
}

// groupID keeps a ServicePort's affinity group stable, taking it over from
// the maps after a restart.
func (d *Datapath) groupID(name model.ServicePortName, sp *model.ServicePort) (uint32, error) {
	if id, ok := d.groupIDs.lookup(name); ok {
		return id, nil
	}
	for _, f := range sp.Frontends {
		if gid, ok := d.recovered[maps.KeyOf(f)]; ok && gid != 0 {
			if !d.groupIDs.isTaken(gid) {
				d.groupIDs.restore(name, gid)
				return gid, nil
			}
		}
	}
	id, _, err := d.groupIDs.get(name)
	return id, err
}

// dropStaleSlots deletes slots beyond the new counts, after slot 0 shrank.
func (d *Datapath) dropStaleSlots(fk maps.FrontendKey, svcID uint32, written slotCounts, ws *writeSet) {
	old := d.counts[fk]
	if old.shortCircuit && !written.shortCircuit {
		ws.delSlots = append(ws.delSlots, fk.SvcKey(1, 0))
		d.dropSchedState(xbpf.SchedKey{SvcId: svcID, Scope: 1}, ws)
	}
	for scope := range 2 {
		for s := written.n[scope] + 1; s <= old.n[scope]; s++ {
			ws.delSlots = append(ws.delSlots, fk.SvcKey(uint8(scope), s))
		}
	}
	if _, ok := d.counts[fk]; ok {
		d.slotsUsed -= old.entries()
	}
	d.slotsUsed += written.entries()
	d.counts[fk] = written
}

// dropFrontend deletes a frontend: heads first, so packets stop finding it
// before its slots go.
func (d *Datapath) dropFrontend(fk maps.FrontendKey, ws *writeSet) {
	old := d.counts[fk]
	ws.delSlots = append(ws.delSlots, fk.SvcKey(0, 0))
	if old.shortCircuit {
		ws.delSlots = append(ws.delSlots, fk.SvcKey(1, 0))
	}
	for scope := range 2 {
		for s := uint16(1); s <= old.n[scope]; s++ {
			ws.delSlots = append(ws.delSlots, fk.SvcKey(uint8(scope), s))
		}
	}
	if _, ok := d.counts[fk]; ok {
		d.slotsUsed -= old.entries()
	}
	delete(d.counts, fk)
	if id, ok := d.svcIDs.lookup(fk); ok {
		for scope := range uint8(2) {
			d.dropSchedState(xbpf.SchedKey{SvcId: id, Scope: scope}, ws)
		}
		d.planRanges(id, nil, ws)
		ws.delSvcIDs = append(ws.delSvcIDs, id)
	}
	d.svcIDs.release(fk)
}
