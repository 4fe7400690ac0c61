package agent

import (
	"net/netip"
	"slices"
	"sync"

	mobyipvs "github.com/moby/ipvs"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/maps"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// frontendAddr is a frontend as both datapaths list it: protocol and
// address:port.
type frontendAddr struct {
	proto string
	addr  netip.AddrPort
}

// frontendOwner is a ServicePort that claims a frontend, and as what.
type frontendOwner struct {
	name model.ServicePortName
	kind model.FrontendKind
}

// frontendNames names the programmed frontends for the per-Service
// metrics: which ServicePort of the last synced State owns each. The sync
// loop keeps it current through the States' deltas (stateSummary.count);
// scrapes read it under the lock. A frontend claimed by two ServicePorts
// is named after the one both datapaths give it to (model's name order).
type frontendNames struct {
	mu sync.RWMutex
	by map[frontendAddr][]frontendOwner
	// pairs counts frontends times their ServicePort's endpoints: what the
	// per-backend series number at most (--metrics-max-series).
	pairs int
}

func newFrontendNames() *frontendNames {
	return &frontendNames{by: map[frontendAddr][]frontendOwner{}}
}

// reset forgets every frontend (before a full recount).
func (n *frontendNames) reset() { clear(n.by); n.pairs = 0 }

// size is the number of frontends and frontend-endpoint pairs named, for
// the per-Service metrics' bound.
func (n *frontendNames) size() (frontends, pairs int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return len(n.by), n.pairs
}

// count adds (by = 1) or removes (by = -1) sp's frontends. The caller
// holds mu.
func (n *frontendNames) count(sp *model.ServicePort, by int) {
	n.pairs += by * len(sp.Frontends) * len(sp.ClusterEndpoints)
	for _, f := range sp.Frontends {
		k := frontendAddr{f.Proto.String(), netip.AddrPortFrom(f.Addr, f.Port)}
		o := frontendOwner{sp.Name, f.Kind}
		if by > 0 {
			i, _ := slices.BinarySearchFunc(n.by[k], o, compareOwners)
			n.by[k] = slices.Insert(n.by[k], i, o)
			continue
		}
		if i, found := slices.BinarySearchFunc(n.by[k], o, compareOwners); found {
			n.by[k] = slices.Delete(n.by[k], i, i+1)
		}
		if len(n.by[k]) == 0 {
			delete(n.by, k)
		}
	}
}

func compareOwners(a, b frontendOwner) int {
	if c := a.name.Compare(b.name); c != 0 {
		return c
	}
	return int(a.kind) - int(b.kind)
}

// owner is the ServicePort serving a frontend, if the last State has one.
func (n *frontendNames) owner(proto string, addr netip.AddrPort) (frontendOwner, bool) {
	owners := n.by[frontendAddr{proto, addr}]
	if len(owners) == 0 {
		return frontendOwner{}, false
	}
	return owners[0], true
}

// Where each mode's datapath reads its frontends and counters from: the
// pinned maps (ebpf) or the kernel's IPVS table (ipvs).
type (
	mapsSnapshotter interface {
		Snapshot(withStats bool) (*maps.Snapshot, error)
	}
	ipvsLister interface {
		List() ([]ipvs.ServiceView, error)
	}
)

var (
	_ mapsSnapshotter = (*reconcile.Datapath)(nil)
	_ ipvsLister      = (*ipvs.Datapath)(nil)
)

// frontendSamples returns the reader of the per-Service metrics for dp,
// naming each frontend from names; nil when dp lists nothing.
func frontendSamples(dp Datapath, names *frontendNames) func() ([]xmetrics.FrontendSample, error) {
	var read func() ([]xmetrics.FrontendSample, error)
	switch l := dp.(type) {
	case mapsSnapshotter:
		read = func() ([]xmetrics.FrontendSample, error) {
			snap, err := l.Snapshot(true)
			if err != nil {
				return nil, err
			}
			return samplesOfSnapshot(snap), nil
		}
	case ipvsLister:
		read = func() ([]xmetrics.FrontendSample, error) {
			list, err := l.List()
			if err != nil {
				return nil, err
			}
			out := samplesOfSnapshot(SnapshotOfIPVS(list, true))
			for i := range out {
				out[i].Kind = "" // IPVS does not know it; the State names it below
			}
			return out, nil
		}
	default:
		return nil
	}
	return func() ([]xmetrics.FrontendSample, error) {
		out, err := read()
		if err != nil {
			return nil, err
		}
		names.mu.RLock()
		defer names.mu.RUnlock()
		for i := range out {
			if o, ok := names.owner(out[i].Protocol, out[i].Address); ok {
				out[i].Name, out[i].Kind = o.name, o.kind.String()
			}
		}
		return out, nil
	}
}

func samplesOfSnapshot(snap *maps.Snapshot) []xmetrics.FrontendSample {
	counts := func(s xbpf.Stats) xmetrics.Counts {
		return xmetrics.Counts{Conns: s.Conns, PacketsIn: s.PacketsIn, PacketsOut: s.PacketsOut, BytesIn: s.BytesIn, BytesOut: s.BytesOut}
	}
	out := make([]xmetrics.FrontendSample, 0, len(snap.Services))
	for _, sv := range snap.Services {
		f := xmetrics.FrontendSample{Kind: sv.Kind, Protocol: sv.Protocol, Address: sv.Address, Counts: counts(sv.Stats)}
		for _, b := range sv.Backends {
			f.Backends = append(f.Backends, xmetrics.BackendSample{Address: b.Address, Weight: b.Weight,
				Active: b.ActiveConns, Inactive: b.InactiveConns, Counts: counts(b.Stats)})
		}
		out = append(out, f)
	}
	return out
}

// SnapshotOfIPVS is the kernel's IPVS table in the listing's shape (`xvs
// list` in ipvs mode, and the per-Service metrics); stats adds the
// kernel's counters.
func SnapshotOfIPVS(list []ipvs.ServiceView, stats bool) *maps.Snapshot {
	snap := &maps.Snapshot{Services: []maps.ServiceView{}}
	counts := func(st mobyipvs.SvcStats) xbpf.Stats {
		if !stats {
			return xbpf.Stats{}
		}
		return xbpf.Stats{Conns: uint64(st.Connections), PacketsIn: uint64(st.PacketsIn), PacketsOut: uint64(st.PacketsOut),
			BytesIn: st.BytesIn, BytesOut: st.BytesOut}
	}
	for _, s := range list {
		v := maps.ServiceView{
			Protocol: s.Protocol.String(), Address: s.Address, Kind: "ipvs", Scheduler: s.Scheduler,
			Backends: []maps.BackendView{}, Stats: counts(s.Stats),
		}
		if s.Persistent {
			v.Flags = append(v.Flags, "persistent")
			v.Affinity = s.Timeout
		}
		for _, r := range s.Reals {
			v.Backends = append(v.Backends, maps.BackendView{Address: r.Address, Weight: uint16(r.Weight),
				ActiveConns: r.ActiveConns, InactiveConns: r.InactiveConns, Stats: counts(r.Stats)})
		}
		snap.Services = append(snap.Services, v)
	}
	return snap
}
