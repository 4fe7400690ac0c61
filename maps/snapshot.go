package maps

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Snapshot is a read-only view of what is programmed, joined from the
// service, backend and counter maps: the ipvsadm -Ln of xvs.
type Snapshot struct {
	Services []ServiceView         `json:"services"`
	Verdicts map[string]xbpf.Stats `json:"verdicts,omitempty"`
	Orphans  []string              `json:"orphans,omitempty"`
	// Conntrack is each conntrack table's occupancy ("established",
	// "unreplied").
	Conntrack map[string]ConntrackView `json:"conntrack,omitempty"`
}

// ConntrackView is one conntrack table's live entries (two per flow) and
// size.
type ConntrackView struct {
	Entries  int    `json:"entries"`
	Capacity uint32 `json:"capacity"`
}

// ServiceView is one frontend (an IPVS virtual server).
type ServiceView struct {
	Protocol  string         `json:"protocol"`
	Address   netip.AddrPort `json:"address"`
	Kind      string         `json:"kind"`
	Scheduler string         `json:"scheduler"`
	ID        uint32         `json:"id"`
	Group     uint32         `json:"group"`
	Flags     []string       `json:"flags,omitempty"`
	Affinity  uint32         `json:"affinityTimeoutSeconds,omitempty"`
	Backends  []BackendView  `json:"backends"`
	// ShortCircuit lists the cluster-wide set used by pod and host
	// sources of an externalTrafficPolicy=Local frontend.
	ShortCircuit []BackendView `json:"shortCircuit,omitempty"`
	Stats        xbpf.Stats    `json:"stats"`
	// Service is the Service port that owns the frontend, as the running
	// agent publishes it (the maps hold addresses only); nil without one.
	Service *ServiceRef `json:"service,omitempty"`
}

// ServiceRef names a Service port and what the frontend is to it
// (ClusterIP, NodePort, ExternalIP, LoadBalancer).
type ServiceRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Port      string `json:"port"`
	Kind      string `json:"kind"`
}

func (r *ServiceRef) String() string {
	s := r.Namespace + "/" + r.Name
	if r.Port != "" {
		s += ":" + r.Port
	}
	return s
}

// BackendView is one backend of a frontend (an IPVS real server).
type BackendView struct {
	Address netip.AddrPort `json:"address"`
	ID      uint32         `json:"id"`
	Local   bool           `json:"local"`
	Weight  uint16         `json:"weight"`
	// ActiveConns and InactiveConns count live conntrack entries as IPVS
	// does: established TCP flows are active, everything else inactive.
	ActiveConns   int        `json:"activeConns"`
	InactiveConns int        `json:"inactiveConns"`
	Stats         xbpf.Stats `json:"stats"`
	// State is the endpoint's EndpointSlice state as the running agent
	// publishes it: ready, serving-terminating, terminating; "" unknown.
	State string `json:"state,omitempty"`
}

var verdictNames = map[xbpf.Verdict]string{
	xbpf.XvsXvsVerdictXVS_V_PASS:                "pass",
	xbpf.XvsXvsVerdictXVS_V_FWD_NEW:             "forward_new",
	xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED:     "forward_established",
	xbpf.XvsXvsVerdictXVS_V_REPLY:               "reply",
	xbpf.XvsXvsVerdictXVS_V_PASS_MALFORMED:      "pass_malformed",
	xbpf.XvsXvsVerdictXVS_V_PASS_FRAGMENT:       "pass_fragment",
	xbpf.XvsXvsVerdictXVS_V_DROP_NO_LOCAL:       "drop_no_local_endpoints",
	xbpf.XvsXvsVerdictXVS_V_REJECT_NO_ENDPOINTS: "reject_no_endpoints",
	xbpf.XvsXvsVerdictXVS_V_DROP_NO_BACKEND:     "drop_no_backend",
	xbpf.XvsXvsVerdictXVS_V_DROP_INVALID:        "drop_invalid",
	xbpf.XvsXvsVerdictXVS_V_DROP_REWRITE:        "drop_rewrite_failed",
	xbpf.XvsXvsVerdictXVS_V_DROP_REJECT_FAILED:  "drop_reject_failed",
	xbpf.XvsXvsVerdictXVS_V_DROP_SOURCE_RANGE:   "drop_source_range",
	xbpf.XvsXvsVerdictXVS_V_REJECT_WRONG_PORT:   "reject_wrong_port",
	xbpf.XvsXvsVerdictXVS_V_DROP_UNALLOCATED:    "drop_unallocated_service_ip",
	xbpf.XvsXvsVerdictXVS_V_DROP_SNAT_EXHAUSTED: "drop_snat_ports_exhausted",
	xbpf.XvsXvsVerdictXVS_V_FWD_XDP:             "forward_after_xdp",
	xbpf.XvsXvsVerdictXVS_V_SOCK_CONNECT:        "host_socket_balanced",
	xbpf.XvsXvsVerdictXVS_V_SOCK_REFUSED:        "host_socket_refused",
	xbpf.XvsXvsVerdictXVS_V_SOCK_DROPPED:        "host_socket_dropped",
	xbpf.XvsXvsVerdictXVS_V_REPLY_HOST:          "reply_host_endpoint",
	xbpf.XvsXvsVerdictXVS_V_PASS_FRAG_NEEDED:    "pass_frag_needed",
	xbpf.XvsXvsVerdictXVS_V_REJECT_FRAG_NEEDED:  "reject_frag_needed",
	xbpf.XvsXvsVerdictXVS_V_REPLY_ICMP:          "reply_icmp_error",
	xbpf.XvsXvsVerdictXVS_V_PASS_DRAINING:       "pass_draining",
	xbpf.XvsXvsVerdictXVS_V_FWD_ICMP:            "forward_icmp_error",
	xbpf.XvsXvsVerdictXVS_V_PASS_VLAN:           "pass_vlan_tagged",
}

// VerdictName is the metric/listing name of a verdict.
func VerdictName(v xbpf.Verdict) string {
	if n, ok := verdictNames[v]; ok {
		return n
	}
	return fmt.Sprintf("verdict_%d", v)
}

// Read builds a Snapshot; withStats adds the per-CPU counters, summed.
func (m *Maps) Read(withStats bool) (*Snapshot, error) {
	r := &snapshotReader{m: m, withStats: withStats, backends: map[uint32]xbpf.Backend{},
		heads: map[slotRef]xbpf.SvcValue{}, slots: map[slotRef]map[uint16]uint32{}}
	if err := Walk(m.Backends, func(id *uint32, b *xbpf.Backend) { r.backends[*id] = *b }); err != nil {
		return nil, err
	}
	err := Walk(m.Services, func(k *xbpf.SvcKey, v *xbpf.SvcValue) {
		ref := slotRef{FrontendOf(*k), k.Scope}
		if k.Slot == 0 {
			r.heads[ref] = *v
			return
		}
		if r.slots[ref] == nil {
			r.slots[ref] = map[uint16]uint32{}
		}
		r.slots[ref][k.Slot] = v.BackendId
	})
	if err != nil {
		return nil, err
	}
	var occupancy map[string]ConntrackView
	if r.flows, occupancy, err = m.flowCountsFromConntrack(); err != nil {
		return nil, err
	}
	r.snap = &Snapshot{Conntrack: occupancy}
	for ref, head := range r.heads {
		if ref.scope == 0 {
			r.snap.Services = append(r.snap.Services, r.service(ref, head))
		}
	}
	r.snap.Sort()
	if withStats {
		r.snap.Verdicts = map[string]xbpf.Stats{}
		for v := xbpf.Verdict(0); v < xbpf.XvsXvsVerdictXVS_V_MAX; v++ {
			s, err := sumStats(m.Verdicts, uint32(v))
			if err != nil {
				return nil, err
			}
			r.snap.Verdicts[VerdictName(v)] = s
		}
	}
	return r.snap, nil
}

// Sort puts the frontends in ipvsadm -Ln's order (libipvs's
// ipvs_cmp_services): IPv4 before IPv6, then by protocol number (TCP,
// UDP, SCTP), address and port; and each frontend's backends by address
// and port (ipvs_cmp_dests). Both modes list in this order, whatever
// order the maps or the kernel hand them out in, so that two listings,
// of two nodes or of the two modes, compare line by line.
func (s *Snapshot) Sort() {
	slices.SortStableFunc(s.Services, compareFrontends)
	for i := range s.Services {
		for _, set := range [][]BackendView{s.Services[i].Backends, s.Services[i].ShortCircuit} {
			slices.SortStableFunc(set, func(a, b BackendView) int { return a.Address.Compare(b.Address) })
		}
	}
}

func compareFrontends(a, b ServiceView) int {
	return cmp.Or(
		cmp.Compare(a.Address.Addr().BitLen(), b.Address.Addr().BitLen()),
		cmp.Compare(protocolRank(a.Protocol), protocolRank(b.Protocol)),
		cmp.Compare(a.Protocol, b.Protocol),
		a.Address.Compare(b.Address))
}

// protocolRank is a protocol's number, as ipvsadm compares them; a name
// this build does not know sorts after the ones it does.
func protocolRank(name string) int {
	if p, err := model.ParseProtocol(name); err == nil && name != "" {
		return int(p)
	}
	return 256
}

// Select keeps the frontends of protocol proto (0: any) at frontend (port
// 0: every port of the address), as ipvsadm -L -t/-u/--sctp-service lists
// only the virtual server named, and reports whether any is left. The
// verdict counters and the conntrack occupancy are the node's, not a
// frontend's, and go; so do the orphans of the frontends left out.
func (s *Snapshot) Select(proto model.Protocol, frontend netip.AddrPort) bool {
	var kept []string
	s.Services = slices.DeleteFunc(s.Services, func(sv ServiceView) bool {
		if proto != 0 && proto.String() != sv.Protocol || !addrPortMatch(frontend, sv.Address) {
			return true
		}
		kept = append(kept, orphanPrefix(sv.Protocol, sv.Address))
		return false
	})
	s.Orphans = slices.DeleteFunc(s.Orphans, func(o string) bool {
		return !slices.ContainsFunc(kept, func(p string) bool { return strings.HasPrefix(o, p) })
	})
	s.Verdicts, s.Conntrack = nil, nil
	return len(s.Services) > 0
}

// orphanPrefix is how the orphans of a frontend begin.
func orphanPrefix(proto string, frontend netip.AddrPort) string {
	return proto + " " + frontend.String() + " "
}

// slotRef names the slots of one frontend's scope.
type slotRef struct {
	fk    FrontendKey
	scope uint8
}

// snapshotReader holds what Read took from the maps while it builds the
// views.
type snapshotReader struct {
	m         *Maps
	withStats bool
	backends  map[uint32]xbpf.Backend
	heads     map[slotRef]xbpf.SvcValue
	slots     map[slotRef]map[uint16]uint32
	flows     map[[2]uint32]flowCounts
	snap      *Snapshot
}

// service is the view of one frontend (scope 0) and its short-circuit set.
func (r *snapshotReader) service(ref slotRef, head xbpf.SvcValue) ServiceView {
	sv := ServiceView{
		Protocol:  ref.fk.Proto.String(),
		Address:   netip.AddrPortFrom(ref.fk.Addr, ref.fk.Port),
		Kind:      KindFromMap(head.Kind).String(),
		Scheduler: SchedulerName(xbpf.Sched(head.Sched)),
		ID:        head.SvcId,
		Group:     head.GroupId,
		Flags:     flagNames(head.Flags),
		Backends:  r.backendViews(ref, head),
	}
	if head.Flags&uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_AFFINITY) != 0 {
		sv.Affinity = head.AffinityTimeout
	}
	sc := slotRef{ref.fk, 1}
	if h, ok := r.heads[sc]; ok {
		sv.ShortCircuit = r.backendViews(sc, h)
	}
	if r.withStats {
		sv.Stats, _ = sumStats(r.m.SvcStats, head.SvcId)
		for _, b := range sv.Backends {
			r.flows[[2]uint32{head.SvcId, b.ID}].add(&sv.Stats)
		}
	}
	return sv
}

// backendViews are the backends of one frontend's scope (in slot order;
// Sort orders them by address); a slot or backend missing is an orphan.
func (r *snapshotReader) backendViews(ref slotRef, head xbpf.SvcValue) []BackendView {
	var out []BackendView
	for s := uint16(1); s <= head.Count; s++ {
		bid, ok := r.slots[ref][s]
		be, found := r.backends[bid]
		if !ok || !found {
			r.snap.Orphans = append(r.snap.Orphans, fmt.Sprintf("%sslot %d: missing", orphanPrefix(ref.fk.Proto.String(), netip.AddrPortFrom(ref.fk.Addr, ref.fk.Port)), s))
			continue
		}
		bv := BackendView{
			Address: netip.AddrPortFrom(DecodeAddr(be.Addr, be.Family), Ntohs(be.Port)),
			ID:      bid, Weight: be.Weight,
			Local: be.Flags&uint8(xbpf.XvsXvsBackendFlagsXVS_BACKEND_F_LOCAL) != 0,
		}
		c := r.flows[[2]uint32{head.SvcId, bid}]
		bv.ActiveConns, bv.InactiveConns = c.active, c.inactive
		if r.withStats {
			bv.Stats, _ = sumStats(r.m.BackendStats, bid)
			c.add(&bv.Stats)
		}
		out = append(out, bv)
	}
	return out
}

func flagNames(f uint16) []string {
	var out []string
	for bit, name := range map[xbpf.SvcFlags]string{
		xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS: "has-endpoints",
		xbpf.XvsXvsSvcFlagsXVS_SVC_F_LOCAL:         "local",
		xbpf.XvsXvsSvcFlagsXVS_SVC_F_AFFINITY:      "persistent",
		xbpf.XvsXvsSvcFlagsXVS_SVC_F_SOURCE_RANGES: "source-ranges",
		xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT: "short-circuit",
	} {
		if f&uint16(bit) != 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// sumStats adds up a per-CPU counter entry.
func sumStats(m *ebpf.Map, id uint32) (xbpf.Stats, error) {
	var per []xbpf.Stats
	var sum xbpf.Stats
	if err := m.Lookup(&id, &per); err != nil {
		return sum, fmt.Errorf("read %s[%d]: %w", m, id, err)
	}
	for _, s := range per {
		sum.Conns += s.Conns
		sum.PacketsIn += s.PacketsIn
		sum.PacketsOut += s.PacketsOut
		sum.BytesIn += s.BytesIn
		sum.BytesOut += s.BytesOut
	}
	return sum, nil
}

// flowCounts is what live conntrack entries hold for one (service,
// backend): IPVS's active and inactive connections, and the packets and
// bytes the datapath has not yet flushed into the per-CPU counters.
type flowCounts struct {
	active, inactive int
	pending          xbpf.Stats
}

// add folds the pending counts into s.
func (c flowCounts) add(s *xbpf.Stats) {
	s.Conns += c.pending.Conns
	s.PacketsIn += c.pending.PacketsIn
	s.PacketsOut += c.pending.PacketsOut
	s.BytesIn += c.pending.BytesIn
	s.BytesOut += c.pending.BytesOut
}

// flowCountsFromConntrack walks the conntrack map once. Active means an
// established TCP flow, as IPVS counts it; inactive is any other live
// forward entry.
func (m *Maps) flowCountsFromConntrack() (map[[2]uint32]flowCounts, map[string]ConntrackView, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, nil, fmt.Errorf("read clock: %w", err)
	}
	now := uint64(ts.Nano())
	occupancy := map[string]ConntrackView{}
	out := map[[2]uint32]flowCounts{}
	for i, ct := range m.ConntrackTables() {
		if ct == nil {
			continue // pins of an agent older than the unreplied table
		}
		n, err := flowCountsOf(ct, now, out)
		if err != nil {
			return nil, nil, err
		}
		occupancy[[]string{"established", "unreplied"}[i]] = ConntrackView{Entries: n, Capacity: ct.MaxEntries()}
	}
	return out, occupancy, nil
}

// flowCountsOf adds one table's flows to out and returns its entries.
func flowCountsOf(ct *ebpf.Map, now uint64, out map[[2]uint32]flowCounts) (int, error) {
	n := 0
	err := Walk(ct, func(k *xbpf.CtKey, e *xbpf.CtEntry) {
		n++
		flags := xbpf.CtFlags(e.Flags)
		id := [2]uint32{e.SvcId, e.BackendId}
		c := out[id]
		if flags&xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY != 0 {
			c.pending.PacketsOut += uint64(e.Packets)
			c.pending.BytesOut += uint64(e.Bytes)
			out[id] = c
			return
		}
		c.pending.PacketsIn += uint64(e.Packets)
		c.pending.BytesIn += uint64(e.Bytes)
		if flags&xbpf.XvsXvsCtFlagsXVS_CT_F_COUNTED == 0 {
			c.pending.Conns++
		}
		switch {
		case e.Expires < now:
		case model.Protocol(k.Proto) == model.TCP && xbpf.CtState(e.State) == xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED:
			c.active++
		default:
			c.inactive++
		}
		out[id] = c
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
