// Package reconcile is the ebpf Datapath: it writes a model.State into the
// pinned maps (package maps) in the commit order the programs rely on,
// with stable IDs recovered from the maps at start, and keeps the state
// the programs share with the agent (scheduler tables, masquerade ranges,
// stale flows, the conntrack reaper). It never logs.
package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// Config sizes the ID spaces; it must match the loaded maps.
type Config struct {
	MaxServices uint32
	MaxBackends uint32
	// MaxServiceSlots is the services map's size (heads and slots of every
	// frontend); 0 takes the loaded map's. A ServicePort whose entries do
	// not fit is refused alone (it keeps what it had) and retried.
	MaxServiceSlots uint32
	// MaxSourceRanges is the source-ranges map's size (one entry per
	// loadBalancerSourceRanges prefix of each LB frontend); 0 takes the
	// loaded map's. A ServicePort whose ranges do not fit is refused alone.
	MaxSourceRanges uint32
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
	// m are the loaded maps (for the reaper and the conntrack sizes);
	// every read and write of a sync goes through w (store.go).
	m          *maps.Maps
	w          *mapSet
	svcIDs     *idAlloc[maps.FrontendKey]
	groupIDs   *idAlloc[model.ServicePortName]
	backendIDs idSpace

	applied map[model.ServicePortName]*appliedService
	// previous holds what a ServicePort changed in this sync had applied
	// before: what it keeps if its new state does not fit.
	previous map[model.ServicePortName]*appliedService
	owners   map[maps.FrontendKey]model.ServicePortName
	counts   map[maps.FrontendKey]slotCounts
	// slotsUsed is how many services-map entries counts describes;
	// slotCap the map's size (0: not checked). slotsAtStart is slotsUsed
	// when the current sync began: its writes come before its deletes,
	// so the map holds that plus what the sync adds (writeSet.grown).
	slotsUsed, slotCap, slotsAtStart int
	// rangeCap is the source-ranges map's size (0: not checked);
	// rangesAtStart the entries it held when the current sync began.
	rangeCap, rangesAtStart int
	// shown is each accounted map's fill as of the last sync, for
	// readers beside it (MapOccupancy).
	shown occupancy
	// backends holds every backend's ID, reference count and the mutable
	// part of its map value as written.
	backends backendTable
	// strayBackendIDs are IDs the pinned backends map held for a
	// backend that had another ID already (two agents on one pin path,
	// before the lock): never claimed, each is deleted by the first sync.
	strayBackendIDs []uint32
	// unreferenced holds backends whose count dropped to zero in this
	// sync: the candidates for deletion at its end.
	unreferenced map[maps.BackendKey]struct{}
	// appliedGen is the Generation of the State the last successful sync
	// applied (0: none, or it failed).
	appliedGen uint64
	// retry holds ServicePorts a sync could not program (an ID space or a
	// map was full); every sync tries them again.
	retry map[model.ServicePortName]bool

	// recovered holds group IDs read back from the maps at start, until
	// the first sync hands them to the ServicePorts that own the frontends.
	recovered map[maps.FrontendKey]uint32
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
	// adoptNext are the flows the next Sync adopts (AdoptAtNextSync);
	// adoptDone and adoptErr what it did.
	adoptNext []AdoptedFlow
	adoptDone *AdoptResult
	adoptErr  error
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

// entries is how many services-map entries the counts stand for: each
// scope's head and slots.
func (c slotCounts) entries() int {
	n := 1 + int(c.n[0])
	if c.shortCircuit {
		n += 1 + int(c.n[1])
	}
	return n
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
func NewDatapath(m *maps.Maps, cfg Config) (*Datapath, error) {
	if cfg.MaxServiceSlots == 0 && m.Services != nil {
		cfg.MaxServiceSlots = m.Services.MaxEntries()
	}
	if cfg.MaxSourceRanges == 0 && m.SourceRanges != nil {
		cfg.MaxSourceRanges = m.SourceRanges.MaxEntries()
	}
	d, err := newDatapath(bpfMaps(m), cfg)
	if err != nil {
		return nil, err
	}
	d.m = m
	return d, nil
}

// newDatapath is NewDatapath over any mapSet.
func newDatapath(w *mapSet, cfg Config) (*Datapath, error) {
	d := &Datapath{
		w:            w,
		svcIDs:       newIDAlloc[maps.FrontendKey](cfg.MaxServices),
		groupIDs:     newIDAlloc[model.ServicePortName](cfg.MaxServices),
		backendIDs:   newIDSpace(cfg.MaxBackends),
		applied:      map[model.ServicePortName]*appliedService{},
		previous:     map[model.ServicePortName]*appliedService{},
		owners:       map[maps.FrontendKey]model.ServicePortName{},
		counts:       map[maps.FrontendKey]slotCounts{},
		backends:     newBackendTable(),
		unreferenced: map[maps.BackendKey]struct{}{},
		retry:        map[model.ServicePortName]bool{},
		problems:     map[model.ServicePortName][]string{},
		recovered:    map[maps.FrontendKey]uint32{},
		fullSync:     true,
		maglevSize:   cfg.MaglevSize,
		slotCap:      int(cfg.MaxServiceSlots),
		rangeCap:     int(cfg.MaxSourceRanges),
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
	err := d.w.services.each(func(k *xbpf.SvcKey, v *xbpf.SvcValue) {
		fk := maps.FrontendOf(*k)
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
	})
	if err != nil {
		return fmt.Errorf("read services map: %w", err)
	}
	d.recoveredFrontends = len(d.recovered)
	if err := d.recoverRanges(); err != nil {
		return fmt.Errorf("read source ranges: %w", err)
	}
	d.countSlots()
	d.showOccupancy()
	err = d.w.backends.each(func(id *uint32, b *xbpf.Backend) {
		bk := maps.NewBackendKey(maps.DecodeAddr(b.Addr, b.Family), maps.Ntohs(b.Port), model.Protocol(b.Proto))
		if _, dup := d.backends.get(bk); dup {
			d.strayBackendIDs = append(d.strayBackendIDs, *id)
			return
		}
		if d.backendIDs.claim(*id) {
			d.backends.set(bk, backendEntry{id: *id, weight: b.Weight, flags: b.Flags})
			d.unreferenced[bk] = struct{}{}
		}
	})
	if err != nil {
		return fmt.Errorf("read backends map: %w", err)
	}
	return d.reconcileStats()
}

func (d *Datapath) Mode() string { return string(model.ModeEBPF) }

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

	if d.fullSync {
		d.countSlots()
	}
	d.slotsAtStart = d.slotsUsed
	if d.rangesAtStart, err = d.countRanges(); err != nil {
		return err
	}
	released := map[maps.FrontendKey]bool{}
	changed := d.changed(st, released)
	d.retry = map[model.ServicePortName]bool{}
	// Name order makes frontend conflicts resolve the same way every time.
	slices.SortFunc(changed, model.ServicePortName.Compare)

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
	if err := d.planRemovals(ws, released); err != nil {
		return err
	}
	d.adoptPending()
	if err := d.commit(ws); err != nil {
		return err
	}
	// Backends on node addresses came or went: the egress program is
	// needed, or no longer.
	if err := d.writeNodeConfig(d.node.config); err != nil {
		return err
	}
	if err := d.flushStaleOf(st, changed, released); err != nil {
		return err
	}
	if err := d.syncClusterIPs(); err != nil {
		return err
	}
	d.fullSync = false
	d.showOccupancy()
	d.appliedGen = st.Generation
	d.recovered = map[maps.FrontendKey]uint32{}
	return nil
}

// changed lists the ServicePorts this sync plans (those the State's
// delta names, or whose pointer differs; everything in a full sync; and
// those a previous sync could not program), releasing what each of them,
// and each removed one, applied before (its frontends go into released).
func (d *Datapath) changed(st *model.State, released map[maps.FrontendKey]bool) []model.ServicePortName {
	var changed []model.ServicePortName
	clear(d.previous)
	names, known := st.ChangedSince(d.appliedGen)
	if d.fullSync || !known {
		for name, sp := range st.Services {
			if a, ok := d.applied[name]; d.fullSync || !ok || a.sp != sp || d.retry[name] {
				changed = append(changed, name)
			}
		}
		for name, a := range d.applied {
			sp, ok := st.Services[name]
			if ok && sp == a.sp && !d.fullSync && !d.retry[name] {
				continue
			}
			d.release(name, a, released, !ok)
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
				d.release(name, a, released, !want)
			}
			if want {
				changed = append(changed, name)
			}
		}
	}
	return changed
}

// planRemovals queues the deletion of what nobody wants any more: the
// released frontends no ServicePort re-claimed, unreferenced backends and,
// in a full sync, whatever the maps hold beyond the desired state (a
// service deleted while the agent was down).
func (d *Datapath) planRemovals(ws *writeSet, released map[maps.FrontendKey]bool) error {
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
		for bk, e := range d.backends.all() {
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
		if e, ok := d.backends.get(bk); ok && e.refs == 0 {
			ws.delBackends = append(ws.delBackends, e.id)
			d.backendIDs.free(e.id)
			d.backends.delete(bk)
			delete(d.node.hostBackends, bk)
		}
	}
	// A new map, not clear: clearing costs what the map once held (a
	// million backends after a full sync), at every sync after.
	d.unreferenced = map[maps.BackendKey]struct{}{}
	for _, id := range d.strayBackendIDs {
		// Never claimed: nothing to free (claim refused an ID beyond
		// the space, or the backend had one).
		ws.delBackends = append(ws.delBackends, id)
	}
	d.strayBackendIDs = nil
	return nil
}

// flushStaleOf deletes the flows of the UDP and SCTP frontends this sync
// changed or removed whose backend no longer serves them (kube-proxy's
// conntrack cleanup), timing it for ConntrackReconcileTime.
func (d *Datapath) flushStaleOf(st *model.State, changed []model.ServicePortName, released map[maps.FrontendKey]bool) error {
	touched := map[maps.FrontendKey]bool{}
	for fk := range released {
		if datagramProto(fk.Proto) {
			touched[fk] = true
		}
	}
	for _, name := range changed {
		if sp := st.Services[name]; sp != nil {
			for _, f := range sp.Frontends {
				if datagramProto(f.Proto) {
					touched[maps.KeyOf(f)] = true
				}
			}
		}
	}
	start := time.Now()
	err := d.flushStale(st, touched)
	d.staleTook = time.Since(start)
	return err
}

// release forgets what a ServicePort applied: its frontends become
// candidates for deletion, its backend references drop. A ServicePort
// that is gone (not replanned) gives its group ID back too.
func (d *Datapath) release(name model.ServicePortName, a *appliedService, released map[maps.FrontendKey]bool, gone bool) {
	if gone {
		d.groupIDs.release(name)
	}
	for _, f := range a.frontends {
		fk := maps.KeyOf(f)
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
				if d.backends.addRef(bk, -1).refs == 0 {
					d.unreferenced[bk] = struct{}{}
				}
			}
		}
		if f.Kind == model.ClusterIP {
			d.node.clusterIPs[fk.Addr]--
			d.node.dirtyIPs[fk.Addr] = true
		}
	}
	delete(d.problems, name)
	delete(d.applied, name)
	if !gone {
		d.previous[name] = a
	}
}

// kinds maps model frontend kinds to the datapath's enum, both ways.
