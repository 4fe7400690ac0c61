package maps

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

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
	// means DefaultSNATPortMin..DefaultSNATPortMax. The node's ephemeral
	// range is skipped inside them.
	SNATPortMin, SNATPortMax uint16
	// MasqueradeAddrs, when set, are the addresses (one per family)
	// masqueraded flows leave from, whatever their egress interface.
	MasqueradeAddrs []netip.Addr
	// NetfilterMark, when nonzero, selects netfilter mode: new flows go
	// to the stack once translated, through the node's netfilter hooks,
	// and those to masquerade carry this mark bit to the POSTROUTING rule
	// that masquerades them (loader.InstallNetfilter). Zero is bypass
	// mode: the programs redirect and masquerade themselves.
	NetfilterMark uint32
}

// Datapath realises a model.State in the BPF maps (model.Datapath).
//
// Each Sync applies the ServicePorts that changed since the State it
// applied last: those the State's Delta names when it has one (the
// controller's States do), else those whose *model.ServicePort pointer
// differs (the controller reuses the pointers of unchanged services). A
// sync therefore costs O(changed services), not O(services). Writes follow
// the commit protocol: backends, then slots 1..N, then slot 0, then deletes;
// a packet therefore never sees a slot 0 whose slots are not written yet.
//
// The bookkeeping is sized for a million backends: one map entry per
// backend without pointers (the garbage collector skips it), IDs in
// bitmaps, and what a ServicePort references derived from its immutable
// *ServicePort instead of copied.
type Datapath struct {
	m          *Maps
	svcIDs     *idAlloc[frontendKey]
	groupIDs   *idAlloc[model.ServicePortName]
	backendIDs idSpace

	applied map[model.ServicePortName]*appliedService
	owners  map[frontendKey]model.ServicePortName
	counts  map[frontendKey]slotCounts
	// backends holds every backend's ID, reference count and the mutable
	// part of its map value as written.
	backends map[backendKey]backendEntry
	// unreferenced holds backends whose count dropped to zero in this
	// sync: the candidates for deletion at its end.
	unreferenced map[backendKey]struct{}
	// appliedGen is the Generation of the State the last successful sync
	// applied (0: none, or it failed).
	appliedGen uint64
	// retry holds ServicePorts a sync could not program (an ID space or a
	// map was full); every sync tries them again.
	retry map[model.ServicePortName]bool

	// recovered holds group IDs read back from the maps at start, until
	// the first sync hands them to the ServicePorts that own the frontends.
	recovered map[frontendKey]uint32
	// recoveredFrontends is how many frontends the pinned maps held at
	// start (RecoveredFrontends).
	recoveredFrontends int
	fullSync           bool
	problems           map[model.ServicePortName][]string

	maglevSize uint32
	// tables and members record the scheduler tables and the slot
	// membership entries written per (frontend, scope).
	tables  map[xbpf.SchedKey]tableState
	members map[xbpf.SchedKey]map[uint32]bool

	node                     nodeState
	nodeAddrs                []netip.Addr
	snatPortMin, snatPortMax uint16
	ephLo, ephHi             uint16 // the node's ephemeral ports, which masquerade skips
	masqAddrs                []netip.Addr
	nfMark                   uint32
	// ctEntries are the live entries of the conntrack tables
	// (established, unreplied) as the reaper last counted them.
	ctEntries   [2]atomic.Uint64
	netnsCookie uint64
	// staleDeleted counts UDP/SCTP flows and socket choices deleted
	// because their backend stopped serving, by family (IPv4, IPv6).
	staleDeleted [2]uint64
	// staleTook is how long the last Sync's stale-flow deletion took.
	staleTook time.Duration
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

// backendEntry is one backend's bookkeeping: its ID, how many slots
// reference it, and the weight and flags last written to its map value
// (the rest of the value is the key).
type backendEntry struct {
	id     uint32
	refs   uint32
	weight uint16
	flags  uint8
}

// appliedService is what a ServicePort's last plan took: the frontends it
// owns. The slots and backend references of each follow from sp, which
// never changes, so release recomputes them instead of storing them.
type appliedService struct {
	sp        *model.ServicePort
	frontends []model.Frontend
}

// NewDatapath takes over the maps, recovering service, group and backend
// IDs from their content so that IDs (and the counters they index) stay
// stable across agent restarts. The first Sync is a full reconcile that
// removes whatever the maps hold beyond the desired state.
func NewDatapath(m *Maps, cfg Config) (*Datapath, error) {
	d := &Datapath{
		m:            m,
		svcIDs:       newIDAlloc[frontendKey](cfg.MaxServices),
		groupIDs:     newIDAlloc[model.ServicePortName](cfg.MaxServices),
		backendIDs:   newIDSpace(cfg.MaxBackends),
		applied:      map[model.ServicePortName]*appliedService{},
		owners:       map[frontendKey]model.ServicePortName{},
		counts:       map[frontendKey]slotCounts{},
		backends:     map[backendKey]backendEntry{},
		unreferenced: map[backendKey]struct{}{},
		retry:        map[model.ServicePortName]bool{},
		problems:     map[model.ServicePortName][]string{},
		recovered:    map[frontendKey]uint32{},
		fullSync:     true,
		maglevSize:   cfg.MaglevSize,
		tables:       map[xbpf.SchedKey]tableState{},
		members:      map[xbpf.SchedKey]map[uint32]bool{},
		node:         newNodeState(),
		snatPortMin:  cfg.SNATPortMin,
		snatPortMax:  cfg.SNATPortMax,
		masqAddrs:    cfg.MasqueradeAddrs,
		nfMark:       cfg.NetfilterMark,
		netnsCookie:  netnsCookie(),
	}
	if d.snatPortMin == 0 && d.snatPortMax == 0 {
		d.snatPortMin, d.snatPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if d.snatPortMin == 0 || d.snatPortMax < d.snatPortMin {
		return nil, fmt.Errorf("masquerade port range %d-%d is empty", d.snatPortMin, d.snatPortMax)
	}
	var err error
	if d.ephLo, d.ephHi, err = EphemeralPorts(); err != nil {
		return nil, fmt.Errorf("masquerade ports: %w", err)
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
	d.recoveredFrontends = len(d.recovered)
	var id uint32
	var b xbpf.Backend
	bit := d.m.Backends.Iterate()
	for bit.Next(&id, &b) {
		bk := newBackendKey(decodeAddr(b.Addr, b.Family), ntohs(b.Port), model.Protocol(b.Proto))
		if d.backendIDs.claim(id) {
			d.backends[bk] = backendEntry{id: id, weight: b.Weight, flags: b.Flags}
			d.unreferenced[bk] = struct{}{}
		}
	}
	if err := bit.Err(); err != nil {
		return fmt.Errorf("read backends map: %w", err)
	}
	return d.reconcileStats()
}

func (d *Datapath) Mode() string { return string(model.ModeEBPF) }

// RecoveredFrontends is how many frontends (address, port, protocol) the
// pinned maps held when this Datapath was created: what a restarted
// agent finds programmed before its first sync.
func (d *Datapath) RecoveredFrontends() int { return d.recoveredFrontends }

// ConntrackOccupancy is each conntrack table's entries (as the reaper last
// counted them) and size, by table name: "established" and "unreplied".
func (d *Datapath) ConntrackOccupancy() map[string][2]uint64 {
	out := map[string][2]uint64{}
	for i, name := range []string{"established", "unreplied"} {
		if t := d.m.ConntrackTables()[i]; t != nil {
			out[name] = [2]uint64{d.ctEntries[i].Load(), uint64(t.MaxEntries())}
		}
	}
	return out
}

// StaleFlowsDeleted is how many UDP and SCTP flows (and socket-level
// choices) syncs have deleted because their backend stopped serving, for
// IPv4 and IPv6 (kube-proxy's conntrack_reconciler_deleted_entries_total).
func (d *Datapath) StaleFlowsDeleted() [2]uint64 { return d.staleDeleted }

// ConntrackReconcileTime is how long the last Sync spent deleting the
// flows of removed UDP and SCTP endpoints (kube-proxy's conntrack
// reconciler).
func (d *Datapath) ConntrackReconcileTime() time.Duration { return d.staleTook }

// ForceFullSync makes the next Sync rewrite every entry it owns and remove
// whatever else the maps hold, as at start: it repairs maps changed behind
// the agent's back. Ordinary Syncs only touch ServicePorts that changed.
func (d *Datapath) ForceFullSync() { d.fullSync = true }

// Problems lists what the datapath cannot program as asked, for every
// ServicePort applied: frontends claimed by more than one ServicePort (the
// first in name order keeps it), schedulers the datapath does not have,
// full ID spaces.
func (d *Datapath) Problems() []string {
	var out []string
	for _, ps := range d.problems {
		out = append(out, ps...)
	}
	slices.Sort(out)
	return out
}

func (d *Datapath) problem(name model.ServicePortName, format string, args ...any) {
	d.problems[name] = append(d.problems[name], fmt.Sprintf(format, args...))
}

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

// Sync makes the maps match st.
func (d *Datapath) Sync(ctx context.Context, st *model.State) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// What the maps hold is no longer known exactly.
			d.fullSync, d.appliedGen = true, 0
		}
	}()
	if len(d.applied) > 0 && !slices.Equal(d.nodeAddrs, st.Node.Addresses) {
		// Source-range entries admit the node's own addresses: replan
		// everything (node addresses change rarely).
		d.fullSync = true
	}
	d.nodeAddrs = slices.Clone(st.Node.Addresses)
	if err := d.syncNode(st); err != nil {
		return err
	}

	released := map[frontendKey]bool{}
	var changed []model.ServicePortName
	names, known := st.ChangedSince(d.appliedGen)
	if d.fullSync || !known {
		for name, sp := range st.Services {
			if a, ok := d.applied[name]; d.fullSync || !ok || a.sp != sp || d.retry[name] {
				changed = append(changed, name)
			}
		}
		for name, a := range d.applied {
			if sp, ok := st.Services[name]; ok && sp == a.sp && !d.fullSync && !d.retry[name] {
				continue
			}
			d.release(name, a, released)
		}
	} else {
		names = slices.Clone(names)
		for name := range d.retry {
			names = append(names, name)
		}
		seen := make(map[model.ServicePortName]bool, len(names))
		for _, name := range names {
			if seen[name] {
				continue
			}
			seen[name] = true
			sp, want := st.Services[name]
			a, have := d.applied[name]
			if have && want && a.sp == sp && !d.retry[name] {
				continue
			}
			if have {
				d.release(name, a, released)
			}
			if want {
				changed = append(changed, name)
			}
		}
	}
	d.retry = map[model.ServicePortName]bool{}
	// Name order makes frontend conflicts resolve the same way every time.
	slices.SortFunc(changed, cmpName)

	ws := &writeSet{}
	for _, name := range changed {
		if err := d.plan(name, st.Services[name], ws, released); err != nil {
			// A full ID space must not stop the other services: this one
			// keeps what it could take and is tried again next sync.
			d.problem(name, "%s: %v", name, err)
			d.retry[name] = true
		}
		if len(ws.slotKeys) >= flushSlots {
			// Write what is planned so far (whole ServicePorts, in commit
			// order), so that a full sync never holds every entry twice.
			if err := d.commitWrites(ws); err != nil {
				return err
			}
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
		for bk, e := range d.backends {
			if e.refs == 0 {
				d.unreferenced[bk] = struct{}{}
			}
		}
	}
	for fk := range released {
		if _, ok := d.owners[fk]; ok {
			continue // re-claimed in this sync
		}
		d.dropFrontend(fk, ws)
	}
	for bk := range d.unreferenced {
		if e, ok := d.backends[bk]; ok && e.refs == 0 {
			ws.delBackends = append(ws.delBackends, e.id)
			d.backendIDs.free(e.id)
			delete(d.backends, bk)
			delete(d.node.hostBackends, bk)
		}
	}
	// A new map, not clear: clearing costs what the map once held (a
	// million backends after a full sync), at every sync after.
	d.unreferenced = map[backendKey]struct{}{}
	if err := d.commit(ws); err != nil {
		return err
	}
	// Backends on node addresses came or went: the egress program is
	// needed, or no longer.
	if err := d.writeNodeConfig(d.node.config); err != nil {
		return err
	}
	touched := map[frontendKey]bool{}
	for fk := range released {
		if datagramProto(fk.proto) {
			touched[fk] = true
		}
	}
	for _, name := range changed {
		if sp := st.Services[name]; sp != nil {
			for _, f := range sp.Frontends {
				if datagramProto(f.Proto) {
					touched[keyOf(f)] = true
				}
			}
		}
	}
	flushStart := time.Now()
	ferr := d.flushStale(st, touched)
	d.staleTook = time.Since(flushStart)
	if ferr != nil {
		return ferr
	}
	if err := d.syncClusterIPs(); err != nil {
		return err
	}
	d.fullSync = false
	d.appliedGen = st.Generation
	d.recovered = map[frontendKey]uint32{}
	return nil
}

// release forgets what a ServicePort applied: its frontends become
// candidates for deletion, its backend references drop.
func (d *Datapath) release(name model.ServicePortName, a *appliedService, released map[frontendKey]bool) {
	for _, f := range a.frontends {
		fk := keyOf(f)
		if d.owners[fk] == name {
			delete(d.owners, fk)
			released[fk] = true
		}
		sets, scopes := frontendSets(a.sp, f)
		for scope := range scopes {
			for _, ep := range sets[scope] {
				bk, ok := backendOf(fk, ep)
				if !ok {
					continue
				}
				e := d.backends[bk]
				e.refs--
				d.backends[bk] = e
				if e.refs == 0 {
					d.unreferenced[bk] = struct{}{}
				}
			}
		}
		if f.Kind == model.ClusterIP {
			d.node.clusterIPs[fk.addr]--
			d.node.dirtyIPs[fk.addr] = true
		}
	}
	delete(d.problems, name)
	delete(d.applied, name)
}

// frontendSets returns the endpoint sets a frontend balances to, by scope
// (0: traffic subject to the policy, 1: the pod and host short-circuit of
// eTP=Local), and how many scopes it has.
func frontendSets(sp *model.ServicePort, f model.Frontend) (sets [2][]model.Endpoint, scopes int) {
	sets[0] = sp.EndpointsFor(f.Kind)
	if f.Kind.External() && sp.ExternalLocal {
		sets[1] = sp.ClusterEndpoints
		return sets, 2
	}
	return sets, 1
}

// backendOf is the backend an endpoint of frontend fk is; false when the
// endpoint is of the other family (a frontend only balances to its own).
func backendOf(fk frontendKey, ep model.Endpoint) (backendKey, bool) {
	a := ep.Addr.Unmap()
	if a.Is4() != fk.addr.Is4() {
		return backendKey{}, false
	}
	return newBackendKey(a, ep.Port, fk.proto), true
}

// plan computes the entries of one ServicePort. It takes a frontend only
// once every ID it needs is allocated, so that release can recompute what
// it took from sp and the frontends it owns.
func (d *Datapath) plan(name model.ServicePortName, sp *model.ServicePort, ws *writeSet, released map[frontendKey]bool) error {
	a := &appliedService{sp: sp}
	d.applied[name] = a
	if sp == nil {
		return nil
	}
	sched, err := SchedulerByName(sp.Scheduler)
	if err != nil {
		// One bad annotation must not stop the other services.
		d.problem(name, "%s: %v; using random", name, err)
	}
	groupID, err := d.groupID(name, sp)
	if err != nil {
		return fmt.Errorf("group id: %w", err)
	}
	var ids [2][]uint32
	for _, f := range sp.Frontends {
		fk := keyOf(f)
		if owner, ok := d.owners[fk]; ok && owner != name {
			d.problem(name, "%s %s is already served by %s", name, f, owner)
			continue
		}
		if slices.ContainsFunc(a.frontends, func(o model.Frontend) bool { return keyOf(o) == fk }) {
			continue // the same address listed twice
		}
		sets, scopes := frontendSets(sp, f)
		ws.undo = ws.undo[:0] // only this frontend's writes can be undone
		mark := ws.mark()
		for scope := range scopes {
			if len(sets[scope]) > 0xffff-1 {
				err = fmt.Errorf("%s: %d endpoints exceed the slot limit", f, len(sets[scope]))
			} else {
				ids[scope], err = d.backendIDsFor(fk, sets[scope], ids[scope][:0], ws)
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
		delete(released, fk)
		a.frontends = append(a.frontends, f)
		if f.Kind == model.ClusterIP {
			d.node.clusterIPs[fk.addr]++
			d.node.dirtyIPs[fk.addr] = true
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
		if scopes == 2 {
			// Pods and the host short-circuit to the cluster set.
			head.Flags |= uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT)
		}
		var written slotCounts
		for scope := range scopes {
			set := d.planSlots(fk, uint8(scope), sets[scope], ids[scope], svcID, ws)
			n := uint16(len(set))
			h := head
			h.Count = n
			sk := xbpf.SchedKey{SvcId: svcID, Scope: uint8(scope)}
			if h.TableSize, err = d.planTable(sk, sched, set, ws); err != nil {
				// Slots and references are taken: keep the frontend,
				// balancing at random until the retry builds the table.
				d.problem(name, "%s %s: %v", name, f, err)
				d.retry[name] = true
				h.Sched = uint8(xbpf.XvsXvsSchedXVS_SCHED_RANDOM)
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

// backendIDsFor returns the IDs of a set's backends of fk's family, in
// slot order, allocating and queueing the writes of new or changed ones.
// It takes no reference: the caller takes them, or undoes the
// allocations.
func (d *Datapath) backendIDsFor(fk frontendKey, eps []model.Endpoint, ids []uint32, ws *writeSet) ([]uint32, error) {
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
func (d *Datapath) planSlots(fk frontendKey, scope uint8, eps []model.Endpoint, ids []uint32, svcID uint32, ws *writeSet) []tableBackend {
	set := make([]tableBackend, 0, len(ids))
	for _, ep := range eps {
		bk, ok := backendOf(fk, ep)
		if !ok {
			continue
		}
		e := d.backends[bk]
		e.refs++
		d.backends[bk] = e
		id := ids[len(set)]
		n := uint16(len(set) + 1)
		ws.slotKeys = append(ws.slotKeys, fk.svcKey(scope, n))
		ws.slotVals = append(ws.slotVals, xbpf.SvcValue{BackendId: id, SvcId: svcID})
		set = append(set, tableBackend{id: id, weight: max(ep.Weight, 1), key: bk})
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

// wsMark is where a writeSet's backend writes stood, to undo a frontend
// whose backends did not all get an ID.
type wsMark struct{ backends, fresh, undo int }

func (ws *writeSet) mark() wsMark {
	return wsMark{len(ws.backendKeys), len(ws.freshBEs), len(ws.undo)}
}

// backendUndo is a backend entry as it was before this sync changed it.
type backendUndo struct {
	key     backendKey
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
			d.backends[u.key] = u.entry
			continue
		}
		d.backendIDs.free(d.backends[u.key].id)
		delete(d.backends, u.key)
		delete(d.unreferenced, u.key)
	}
	ws.undo = ws.undo[:m.undo]
	ws.backendKeys, ws.backendVals = ws.backendKeys[:m.backends], ws.backendVals[:m.backends]
	ws.freshBEs = ws.freshBEs[:m.fresh]
}

// backend returns bk's ID, allocating one for a new backend and queueing
// a write when the backend is new or its attributes changed.
func (d *Datapath) backend(bk backendKey, ep model.Endpoint, ws *writeSet) (uint32, error) {
	e, ok := d.backends[bk]
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
	weight := max(ep.Weight, 1)
	if !ok || e.weight != weight || e.flags != flags {
		ws.undo = append(ws.undo, backendUndo{key: bk, entry: d.backends[bk], existed: ok})
		e.weight, e.flags = weight, flags
		d.backends[bk] = e
		addr, fam := encodeAddr(bk.Addr())
		ws.backendKeys = append(ws.backendKeys, e.id)
		ws.backendVals = append(ws.backendVals, xbpf.Backend{
			Addr: addr, Port: htons(bk.port), Family: fam, Proto: uint8(bk.proto), Weight: weight, Flags: flags,
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
		if gid, ok := d.recovered[keyOf(f)]; ok && gid != 0 {
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
		ws.delSvcIDs = append(ws.delSvcIDs, id)
	}
	d.svcIDs.release(fk)
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
