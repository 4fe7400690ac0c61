package reconcile

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// What the Datapath reports beside its syncs: the maps' fill, the
// recovered state, the problems of the last sync, the stale-flow cleanup.

// Snapshot reads what the maps serve (Maps.Read): the per-Service metrics
// read it at every scrape. It reads the pinned maps only, never the sync's
// bookkeeping, so it may run beside a Sync.
func (d *Datapath) Snapshot(withStats bool) (*maps.Snapshot, error) {
	if d.m == nil {
		return nil, fmt.Errorf("no loaded maps to read")
	}
	return d.m.Read(withStats)
}

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

// ServiceProblems are Problems by the ServicePort each is about (for
// Events on the Service).
func (d *Datapath) ServiceProblems() map[model.ServicePortName][]string {
	out := make(map[model.ServicePortName][]string, len(d.problems))
	for name, ps := range d.problems {
		if len(ps) > 0 {
			out[name] = slices.Clone(ps)
		}
	}
	return out
}

func (d *Datapath) problem(name model.ServicePortName, format string, args ...any) {
	d.problems[name] = append(d.problems[name], fmt.Sprintf(format, args...))
}

// countSlots recomputes slotsUsed from counts (at start, and at every
// full sync, in case a failed commit left it off).
func (d *Datapath) countSlots() {
	d.slotsUsed = 0
	for _, c := range d.counts {
		d.slotsUsed += c.entries()
	}
}

// occupancy holds the fill of the maps the agent accounts for before
// writing: the services map (heads and slots), the source ranges, and the
// ID spaces that size the per-backend and per-frontend maps.
type occupancy struct {
	slots, ranges, backends, frontends atomic.Int64
}

// showOccupancy publishes what the sync's bookkeeping says the maps hold.
func (d *Datapath) showOccupancy() {
	d.shown.slots.Store(int64(d.slotsUsed))
	n := 0
	for _, r := range d.node.ranges {
		n += len(r)
	}
	d.shown.ranges.Store(int64(n))
	d.shown.backends.Store(int64(d.backends.len()))
	d.shown.frontends.Store(int64(d.svcIDs.len()))
}

// MapOccupancy is each accounted map's entries and size as the last sync
// left them, by map name (xvs_bpf_map_entries and xvs_bpf_map_capacity):
// "services" and "source_ranges" (a ServicePort that would overflow one
// is refused alone), "backends" (one ID per distinct backend) and
// "svc_stats" (one ID per frontend, which also sizes the scheduler,
// cursor and ClusterIP maps). It may be called beside a Sync.
func (d *Datapath) MapOccupancy() map[string][2]uint64 {
	return map[string][2]uint64{
		"services":      {uint64(d.shown.slots.Load()), uint64(d.slotCap)},
		"source_ranges": {uint64(d.shown.ranges.Load()), uint64(d.rangeCap)},
		"backends":      {uint64(d.shown.backends.Load()), uint64(d.backendIDs.max - 1)},
		"svc_stats":     {uint64(d.shown.frontends.Load()), uint64(d.svcIDs.max - 1)},
	}
}
