package maps

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Config sizes the ID spaces; it must match the loaded maps.
type Config struct {
	MaxServices uint32
	MaxBackends uint32
	// MaglevSize is the mh lookup table size (a prime); 0 means
	// DefaultMaglevSize.
	MaglevSize uint32
	// SNATPortMin and SNATPortMax bound masquerade source ports; zero
	// means DefaultSNATPortMin..DefaultSNATPortMax.
	SNATPortMin, SNATPortMax uint16
}

// Datapath realises a model.State in the BPF maps (model.Datapath).
//
// Each Sync diffs the desired services against what it applied last, by
// *model.ServicePort pointer (the controller reuses the pointers of
// unchanged services), so a sync costs O(changed services). Writes follow
// the commit protocol: backends, then slots 1..N, then slot 0, then deletes;
// a packet therefore never sees a slot 0 whose slots are not written yet.
type Datapath struct {
	m          *Maps
	svcIDs     *idAlloc[frontendKey]
	groupIDs   *idAlloc[model.ServicePortName]
	backendIDs *idAlloc[backendKey]

	applied     map[model.ServicePortName]*appliedService
	owners      map[frontendKey]model.ServicePortName
	counts      map[frontendKey]slotCounts
	backendRefs map[backendKey]int
	backends    map[backendKey]xbpf.Backend

	// recovered holds group IDs read back from the maps at start, until
	// the first sync hands them to the ServicePorts that own the frontends.
	recovered map[frontendKey]uint32
	fullSync  bool
	problems  []string

	maglevSize uint32
	// tables and members record the scheduler tables and the slot
	// membership entries written per (frontend, scope).
	tables  map[xbpf.SchedKey]tableState
	members map[xbpf.SchedKey]map[uint32]bool

	node                     nodeState
	nodeAddrs                []netip.Addr
	snatPortMin, snatPortMax uint16
	netnsCookie              uint64
}

// tableState identifies a written scheduler table by what it was built
// from, so that it is rebuilt only when its backends change.
type tableState struct {
	sched    xbpf.Sched
	backends string
	size     uint32
}

// slotCounts records what a frontend has in the map: slot counts per
// scope, and whether a short-circuit head (scope 1) exists.
type slotCounts struct {
	n            [2]uint16
	shortCircuit bool
}

type appliedService struct {
	sp         *model.ServicePort
	frontends  []frontendKey
	backends   []backendKey
	clusterIPs []netip.Addr
}

// NewDatapath takes over the maps, recovering service, group and backend
// IDs from their content so that IDs (and the counters they index) stay
// stable across agent restarts. The first Sync is a full reconcile that
// removes whatever the maps hold beyond the desired state.
func NewDatapath(m *Maps, cfg Config) (*Datapath, error) {
	d := &Datapath{
		m:           m,
		svcIDs:      newIDAlloc[frontendKey](cfg.MaxServices),
		groupIDs:    newIDAlloc[model.ServicePortName](cfg.MaxServices),
		backendIDs:  newIDAlloc[backendKey](cfg.MaxBackends),
		applied:     map[model.ServicePortName]*appliedService{},
		owners:      map[frontendKey]model.ServicePortName{},
		counts:      map[frontendKey]slotCounts{},
		backendRefs: map[backendKey]int{},
		backends:    map[backendKey]xbpf.Backend{},
		recovered:   map[frontendKey]uint32{},
		fullSync:    true,
		maglevSize:  cfg.MaglevSize,
		tables:      map[xbpf.SchedKey]tableState{},
		members:     map[xbpf.SchedKey]map[uint32]bool{},
		node:        newNodeState(),
		snatPortMin: cfg.SNATPortMin,
		snatPortMax: cfg.SNATPortMax,
		netnsCookie: netnsCookie(),
	}
	if d.snatPortMin == 0 && d.snatPortMax == 0 {
		d.snatPortMin, d.snatPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if d.snatPortMin == 0 || d.snatPortMax < d.snatPortMin {
		return nil, fmt.Errorf("masquerade port range %d-%d is empty", d.snatPortMin, d.snatPortMax)
	}
	if d.maglevSize == 0 {
		d.maglevSize = DefaultMaglevSize
	}
	if err := ValidMaglevSize(d.maglevSize); err != nil {
		return nil, err
	}
	if err := d.recover(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Datapath) recover() error {
	var k xbpf.SvcKey
	var v xbpf.SvcValue
	it := d.m.Services.Iterate()
	for it.Next(&k, &v) {
		fk := frontendOf(k)
		if k.Slot == 0 {
			d.svcIDs.restore(fk, v.SvcId)
			d.recovered[fk] = v.GroupId
			if k.Scope < 2 {
				c := d.counts[fk]
				c.n[k.Scope] = v.Count
				c.shortCircuit = c.shortCircuit || k.Scope == 1
				d.counts[fk] = c
			}
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read services map: %w", err)
	}
	var id uint32
	var b xbpf.Backend
	bit := d.m.Backends.Iterate()
	for bit.Next(&id, &b) {
		bk := backendKey{addr: decodeAddr(b.Addr, b.Family), port: ntohs(b.Port), proto: model.Protocol(b.Proto)}
		d.backendIDs.restore(bk, id)
		d.backends[bk] = b
	}
	if err := bit.Err(); err != nil {
		return fmt.Errorf("read backends map: %w", err)
	}
	return nil
}

func (d *Datapath) Mode() string { return "ebpf" }

// ForceFullSync makes the next Sync rewrite every entry it owns and remove
// whatever else the maps hold, as at start: it repairs maps changed behind
// the agent's back. Ordinary Syncs only touch ServicePorts that changed.
func (d *Datapath) ForceFullSync() { d.fullSync = true }

// Problems lists what the last sync could not program as asked: frontends
// claimed by more than one ServicePort (the first in name order keeps it),
// schedulers the datapath does not have.
func (d *Datapath) Problems() []string { return d.problems }

// writeSet collects one sync's map operations in commit order.
type writeSet struct {
	backendKeys []uint32
	backendVals []xbpf.Backend
	slotKeys    []xbpf.SvcKey
	slotVals    []xbpf.SvcValue
	headKeys    []xbpf.SvcKey
	headVals    []xbpf.SvcValue
	delSlots    []xbpf.SvcKey // heads of removed frontends first, then slots
	delBackends []uint32
	freshSvcs   []uint32
	freshBEs    []uint32

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

// Sync makes the maps match st.
func (d *Datapath) Sync(ctx context.Context, st *model.State) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.nodeAddrs = st.Node.Addresses
	if err := d.syncNode(st); err != nil {
		d.fullSync = true
		return err
	}
	var changed []model.ServicePortName
	for name, sp := range st.Services {
		if a, ok := d.applied[name]; d.fullSync || !ok || a.sp != sp {
			changed = append(changed, name)
		}
	}
	// Name order makes frontend conflicts resolve the same way every time.
	slices.SortFunc(changed, cmpName)

	released := map[frontendKey]bool{}
	for name, a := range d.applied {
		if sp, ok := st.Services[name]; ok && sp == a.sp && !d.fullSync {
			continue
		}
		d.release(name, a, released)
	}

	ws := &writeSet{}
	d.problems = nil
	for _, name := range changed {
		if err := d.plan(name, st.Services[name], ws, released); err != nil {
			return err
		}
	}
	if d.fullSync {
		// Anything the maps hold that nobody wants is stale (a service
		// deleted while the agent was down).
		for fk := range d.counts {
			if _, ok := d.owners[fk]; !ok {
				released[fk] = true
			}
		}
		if err := d.sweepSchedState(ws); err != nil {
			return err
		}
		if err := d.sweepNodeState(ws); err != nil {
			return err
		}
		// Give recovered backends a (zero) reference count, so that the
		// sweep below deletes those nobody uses.
		for bk := range d.backends {
			d.backendRefs[bk] += 0
		}
	}
	for fk := range released {
		if _, ok := d.owners[fk]; ok {
			continue // re-claimed in this sync
		}
		d.dropFrontend(fk, ws)
	}
	for bk, n := range d.backendRefs {
		if n > 0 {
			continue
		}
		delete(d.backendRefs, bk)
		if id, ok := d.backendIDs.lookup(bk); ok {
			ws.delBackends = append(ws.delBackends, id)
			d.backendIDs.release(bk)
		}
		delete(d.backends, bk)
	}
	if err := d.commit(ws); err != nil {
		d.fullSync = true
		return err
	}
	if err := d.syncClusterIPs(); err != nil {
		d.fullSync = true
		return err
	}
	d.fullSync = false
	clear(d.recovered)
	return nil
}

// release forgets what a ServicePort applied: its frontends become
// candidates for deletion, its backend references drop.
func (d *Datapath) release(name model.ServicePortName, a *appliedService, released map[frontendKey]bool) {
	for _, fk := range a.frontends {
		if d.owners[fk] == name {
			delete(d.owners, fk)
			released[fk] = true
		}
	}
	for _, bk := range a.backends {
		d.backendRefs[bk]--
	}
	for _, ip := range a.clusterIPs {
		d.node.clusterIPs[ip]--
	}
	delete(d.applied, name)
}

// plan computes the entries of one ServicePort.
func (d *Datapath) plan(name model.ServicePortName, sp *model.ServicePort, ws *writeSet, released map[frontendKey]bool) error {
	a := &appliedService{sp: sp}
	d.applied[name] = a
	if sp == nil {
		return nil
	}
	sched, err := SchedulerByName(sp.Scheduler)
	if err != nil {
		// One bad annotation must not stop the other services.
		d.problems = append(d.problems, fmt.Sprintf("%s: %v; using random", name, err))
	}
	groupID, err := d.groupID(name, sp)
	if err != nil {
		return fmt.Errorf("service %s: group id: %w", name, err)
	}
	for _, f := range sp.Frontends {
		fk := keyOf(f)
		if owner, ok := d.owners[fk]; ok && owner != name {
			d.problems = append(d.problems, fmt.Sprintf("%s %s is already served by %s", name, f, owner))
			continue
		}
		if slices.Contains(a.frontends, fk) {
			continue // the same address listed twice
		}
		svcID, fresh, err := d.svcIDs.get(fk)
		if err != nil {
			return fmt.Errorf("service %s: service id: %w", name, err)
		}
		if fresh {
			ws.freshSvcs = append(ws.freshSvcs, svcID)
		}
		if f.Proto == model.SCTP {
			for _, ep := range sp.EndpointsForFrontend(f) {
				if ep.Port != f.Port {
					d.problems = append(d.problems, fmt.Sprintf("%s %s: SCTP port translation (to %s) is not supported by the ebpf datapath (its CRC32c covers the ports): such packets are dropped; use targetPort = port, or ipvs mode", name, f, ep))
					break
				}
			}
		}
		d.owners[fk] = name
		delete(released, fk)
		a.frontends = append(a.frontends, fk)
		if f.Kind == model.ClusterIP {
			a.clusterIPs = append(a.clusterIPs, fk.addr)
			d.node.clusterIPs[fk.addr]++
		}

		head := xbpf.SvcValue{
			SvcId: svcID, GroupId: groupID, Sched: uint8(sched), Kind: kindOf(f.Kind),
		}
		if sp.HasEndpointsFor(f.Addr) {
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS)
		}
		if sp.Affinity.ClientIP {
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_AFFINITY)
			head.AffinityTimeout = sp.Affinity.TimeoutSeconds
		}
		var ranges map[xbpf.LPMKey]bool
		if f.Kind == model.LoadBalancer && len(sp.SourceRangesFor(f.Addr)) > 0 {
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SOURCE_RANGES)
			ranges = sourceRangeKeys(svcID, sp, f, d.nodeAddrs)
		}
		d.planRanges(svcID, ranges, ws)
		if (f.Kind == model.ClusterIP && sp.InternalLocal) || (f.Kind.External() && sp.ExternalLocal) {
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_LOCAL)
		}
		sets := [2][]model.Endpoint{sp.EndpointsFor(f.Kind)}
		if f.Kind.External() && sp.ExternalLocal {
			// Pods and the host short-circuit to the cluster set.
			sets[1] = sp.ClusterEndpoints
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT)
		}
		var written slotCounts
		for scope, eps := range sets {
			if scope == int(xbpf.XvsXvsScopeXVS_SCOPE_SHORT_CIRCUIT) && head.Flags&uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT) == 0 {
				continue
			}
			set, err := d.planSlots(fk, uint8(scope), eps, svcID, a, ws)
			if err != nil {
				return fmt.Errorf("service %s: %w", name, err)
			}
			n := uint16(len(set))
			h := head
			h.Count = n
			sk := xbpf.SchedKey{SvcId: svcID, Scope: uint8(scope)}
			if h.TableSize, err = d.planTable(sk, sched, set, ws); err != nil {
				return fmt.Errorf("service %s: %w", name, err)
			}
			d.planMembers(sk, sp.Affinity.ClientIP, set, ws)
			ws.headKeys = append(ws.headKeys, fk.svcKey(uint8(scope), 0))
			ws.headVals = append(ws.headVals, h)
			written.n[scope] = n
			written.shortCircuit = written.shortCircuit || scope == 1
		}
		d.dropStaleSlots(fk, svcID, written, ws)
	}
	return nil
}

// planSlots queues slots 1..N of one (frontend, scope) and returns the
// backends in slot order.
func (d *Datapath) planSlots(fk frontendKey, scope uint8, eps []model.Endpoint, svcID uint32, a *appliedService, ws *writeSet) ([]tableBackend, error) {
	if len(eps) > 0xffff-1 {
		return nil, fmt.Errorf("%d endpoints exceed the slot limit", len(eps))
	}
	var set []tableBackend
	var n uint16
	for _, ep := range eps {
		if ep.Addr.Unmap().Is4() != fk.addr.Is4() {
			continue // a frontend only balances to its own family
		}
		bk := backendKey{addr: ep.Addr.Unmap(), port: ep.Port, proto: fk.proto}
		id, err := d.backend(bk, ep, ws)
		if err != nil {
			return nil, err
		}
		a.backends = append(a.backends, bk)
		d.backendRefs[bk]++
		n++
		ws.slotKeys = append(ws.slotKeys, fk.svcKey(scope, n))
		ws.slotVals = append(ws.slotVals, xbpf.SvcValue{BackendId: id, SvcId: svcID})
		set = append(set, tableBackend{id: id, weight: max(ep.Weight, 1), name: bk.String()})
	}
	return set, nil
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
	want := tableState{sched: sched, backends: tableFingerprint(set)}
	if exists && have.sched == want.sched && have.backends == want.backends {
		return have.size, nil
	}
	var entries []uint32
	if sched == xbpf.XvsXvsSchedXVS_SCHED_WRR {
		entries = wrrSequence(set)
	} else {
		var err error
		if entries, err = maglevTable(set, d.maglevSize); err != nil {
			return 0, err
		}
	}
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
	var sk xbpf.SchedKey
	var fd uint32
	it := d.m.SchedTables.Iterate()
	for it.Next(&sk, &fd) {
		if _, ok := d.tables[sk]; !ok && !slices.Contains(ws.delTables, sk) {
			ws.delTables = append(ws.delTables, sk)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read scheduler tables: %w", err)
	}
	var mk xbpf.MemberKey
	var v uint32
	mit := d.m.Members.Iterate()
	for mit.Next(&mk, &v) {
		if !d.members[xbpf.SchedKey{SvcId: mk.SvcId, Scope: mk.Scope}][mk.BackendId] {
			ws.delMembers = append(ws.delMembers, mk)
		}
	}
	if err := mit.Err(); err != nil {
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

// backend returns bk's ID, queueing a write when the backend is new or its
// attributes changed.
func (d *Datapath) backend(bk backendKey, ep model.Endpoint, ws *writeSet) (uint32, error) {
	id, fresh, err := d.backendIDs.get(bk)
	if err != nil {
		return 0, fmt.Errorf("backend %s: %w", bk, err)
	}
	if fresh {
		ws.freshBEs = append(ws.freshBEs, id)
	}
	addr, fam := encodeAddr(bk.addr)
	want := xbpf.Backend{Addr: addr, Port: htons(bk.port), Family: fam, Proto: uint8(bk.proto), Weight: max(ep.Weight, 1)}
	if ep.Local {
		want.Flags |= uint8(xbpf.XvsXvsBackendFlagsXVS_BACKEND_F_LOCAL)
	}
	if have, ok := d.backends[bk]; !ok || have != want {
		d.backends[bk] = want
		ws.backendKeys = append(ws.backendKeys, id)
		ws.backendVals = append(ws.backendVals, want)
	}
	return id, nil
}

// groupID keeps a ServicePort's affinity group stable, taking it over from
// the maps after a restart.
func (d *Datapath) groupID(name model.ServicePortName, sp *model.ServicePort) (uint32, error) {
	if id, ok := d.groupIDs.lookup(name); ok {
		return id, nil
	}
	for _, f := range sp.Frontends {
		if gid, ok := d.recovered[keyOf(f)]; ok && gid != 0 {
			if _, taken := d.groupIDs.used[gid]; !taken {
				d.groupIDs.restore(name, gid)
				return gid, nil
			}
		}
	}
	id, _, err := d.groupIDs.get(name)
	return id, err
}

// dropStaleSlots deletes slots beyond the new counts, after slot 0 shrank.
func (d *Datapath) dropStaleSlots(fk frontendKey, svcID uint32, written slotCounts, ws *writeSet) {
	old := d.counts[fk]
	if old.shortCircuit && !written.shortCircuit {
		ws.delSlots = append(ws.delSlots, fk.svcKey(1, 0))
		d.dropSchedState(xbpf.SchedKey{SvcId: svcID, Scope: 1}, ws)
	}
	for scope := range 2 {
		for s := written.n[scope] + 1; s <= old.n[scope]; s++ {
			ws.delSlots = append(ws.delSlots, fk.svcKey(uint8(scope), s))
		}
	}
	d.counts[fk] = written
}

// dropFrontend deletes a frontend: heads first, so packets stop finding it
// before its slots go.
func (d *Datapath) dropFrontend(fk frontendKey, ws *writeSet) {
	old := d.counts[fk]
	ws.delSlots = append(ws.delSlots, fk.svcKey(0, 0))
	if old.shortCircuit {
		ws.delSlots = append(ws.delSlots, fk.svcKey(1, 0))
	}
	for scope := range 2 {
		for s := uint16(1); s <= old.n[scope]; s++ {
			ws.delSlots = append(ws.delSlots, fk.svcKey(uint8(scope), s))
		}
	}
	delete(d.counts, fk)
	if id, ok := d.svcIDs.lookup(fk); ok {
		for scope := range uint8(2) {
			d.dropSchedState(xbpf.SchedKey{SvcId: id, Scope: scope}, ws)
		}
		d.planRanges(id, nil, ws)
	}
	d.svcIDs.release(fk)
}

func (d *Datapath) commit(ws *writeSet) error {
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
	return deleteMany(d.m.Backends, ws.delBackends)
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

// kinds maps model frontend kinds to the datapath's enum, both ways.
var kinds = map[model.FrontendKind]xbpf.Kind{
	model.ClusterIP:    xbpf.XvsXvsKindXVS_KIND_CLUSTER_IP,
	model.NodePort:     xbpf.XvsXvsKindXVS_KIND_NODE_PORT,
	model.ExternalIP:   xbpf.XvsXvsKindXVS_KIND_EXTERNAL_IP,
	model.LoadBalancer: xbpf.XvsXvsKindXVS_KIND_LOAD_BALANCER,
}

func kindOf(k model.FrontendKind) uint8 { return uint8(kinds[k]) }

// kindFromMap is kindOf's inverse; unknown values read as ClusterIP.
func kindFromMap(k uint8) model.FrontendKind {
	for mk, v := range kinds {
		if uint8(v) == k {
			return mk
		}
	}
	return model.ClusterIP
}

func cmpName(a, b model.ServicePortName) int {
	return strings.Compare(a.String(), b.String())
}
