package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// Root-free tests of the reconciler: a Datapath over the in-memory mapSet
// (memmaps_test.go). They check what a sync leaves in the maps and the
// order in which it wrote it, which the packet tests (bpf/, root) cannot
// see.

func memDatapath(t *testing.T, cfg Config) (*Datapath, *memSet) {
	t.Helper()
	s := newMemSet()
	if cfg.MaxServices == 0 {
		cfg.MaxServices, cfg.MaxBackends = 64, 256
	}
	d, err := newDatapath(s.mapSet, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

func memSync(t *testing.T, d *Datapath, sps ...*model.ServicePort) error {
	t.Helper()
	st := &model.State{
		Services: map[model.ServicePortName]*model.ServicePort{},
		Node:     model.Node{Name: "node", Addresses: []netip.Addr{netip.MustParseAddr("192.168.50.2")}},
	}
	for _, sp := range sps {
		st.Services[sp.Name] = sp
	}
	return d.Sync(context.Background(), st)
}

func svcPort(name string, f []model.Frontend, eps ...string) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{Namespace: "default", Name: name, Protocol: model.TCP},
		Frontends: f,
	}
	for _, e := range eps {
		ap := netip.MustParseAddrPort(e)
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, model.Endpoint{Addr: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true})
	}
	sp.HasEndpoints = len(eps) > 0
	return sp
}

func clusterIP(addr string, port uint16) model.Frontend {
	return model.Frontend{Kind: model.ClusterIP, Addr: netip.MustParseAddr(addr), Port: port, Proto: model.TCP}
}

// heads are the slot-0 entries of the services map, by frontend and scope.
func heads(s *memSet) map[string]xbpf.SvcValue {
	out := map[string]xbpf.SvcValue{}
	for k, v := range s.services.m {
		if k.Slot == 0 {
			out[maps.FrontendOf(k).String()+"/"+string(rune('0'+k.Scope))] = v
		}
	}
	return out
}

// TestReconcileCommitOrder: a new Service reaches the maps backends first,
// then its slots, then the head that makes it visible; its removal deletes
// the head before the slots, and the backends after both, their counters
// last.
func TestReconcileCommitOrder(t *testing.T) {
	d, s := memDatapath(t, Config{})
	web := svcPort("web", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080", "10.244.2.3:8080")
	if err := memSync(t, d, web); err != nil {
		t.Fatal(err)
	}
	be, slot, head := s.log.index("put", "backends", ""), s.log.index("put", "services", "slot"), s.log.index("put", "services", "head")
	if be < 0 || slot < 0 || head < 0 || !(be < slot && slot < head) {
		t.Fatalf("writes out of order (backends %d, slots %d, head %d):\n%v", be, slot, head, s.log.ops)
	}
	if z := s.log.index("del", "backend_stats", ""); z < 0 || z > be {
		t.Fatalf("fresh backend IDs' leftover counters deleted at %d, after the backends written at %d", z, be)
	}
	if len(s.services.m) != 3 || len(s.backends.m) != 2 {
		t.Fatalf("maps hold %d service entries and %d backends, want 3 and 2", len(s.services.m), len(s.backends.m))
	}

	s.log.ops = nil
	if err := memSync(t, d); err != nil {
		t.Fatal(err)
	}
	del := s.log.index("del", "services", "")
	if del < 0 {
		t.Fatalf("no delete of the Service: %v", s.log.ops)
	}
	classes := s.log.ops[del].classes
	if classes[0] != "head" || strings.Count(strings.Join(classes, ","), "head") != 1 {
		t.Fatalf("service entries deleted as %v, want the head first", classes)
	}
	if b := s.log.index("del", "backends", ""); b < del {
		t.Fatalf("backends deleted at %d, before the service entries at %d: %v", b, del, s.log.ops)
	}
	if c := s.log.index("del", "backend_stats", ""); c < s.log.index("del", "backends", "") {
		t.Fatalf("backend counters deleted before the backends: %v", s.log.ops)
	}
	if len(s.services.m)+len(s.backends.m)+len(s.svcStats.m)+len(s.beStats.m) != 0 {
		t.Fatalf("left behind: %d service entries, %d backends, %d+%d counters",
			len(s.services.m), len(s.backends.m), len(s.svcStats.m), len(s.beStats.m))
	}
}

// TestReconcilePlans: what a ServicePort becomes in the maps, case by
// case.
func TestReconcilePlans(t *testing.T) {
	node := netip.MustParseAddr("192.168.50.2")
	nodePort := model.Frontend{Kind: model.NodePort, Addr: node, Port: 30080, Proto: model.TCP}
	lb := model.Frontend{Kind: model.LoadBalancer, Addr: netip.MustParseAddr("203.0.113.10"), Port: 80, Proto: model.TCP}
	flag := func(f xbpf.SvcFlags) uint16 { return uint16(f) }
	for _, c := range []struct {
		name  string
		sp    func() *model.ServicePort
		check func(t *testing.T, d *Datapath, s *memSet)
	}{
		{"ClusterIP, two endpoints", func() *model.ServicePort {
			return svcPort("a", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080", "10.244.2.3:8080")
		}, func(t *testing.T, d *Datapath, s *memSet) {
			h := heads(s)["172.30.0.10:80/TCP/0"]
			if h.Count != 2 || h.Flags != flag(xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS) || h.Kind != maps.KindOf(model.ClusterIP) {
				t.Fatalf("head %+v", h)
			}
			if len(s.vips.m) != 1 {
				t.Fatalf("cluster IPs %v, want the one ClusterIP", s.vips.m)
			}
		}},
		{"no endpoints: a head with count 0 and no has-endpoints flag (REJECT)", func() *model.ServicePort {
			return svcPort("a", []model.Frontend{clusterIP("172.30.0.10", 80)})
		}, func(t *testing.T, d *Datapath, s *memSet) {
			h, ok := heads(s)["172.30.0.10:80/TCP/0"]
			if !ok || h.Count != 0 || h.Flags&flag(xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS) != 0 {
				t.Fatalf("head %+v (present %v)", h, ok)
			}
		}},
		{"eTP=Local NodePort: Local head over the local endpoint, short-circuit head over all", func() *model.ServicePort {
			sp := svcPort("a", []model.Frontend{clusterIP("172.30.0.10", 80), nodePort}, "10.244.0.2:8080", "10.244.2.3:8080")
			sp.ClusterEndpoints[0].Local = true
			sp.LocalEndpoints = sp.ClusterEndpoints[:1]
			sp.ExternalLocal = true
			return sp
		}, func(t *testing.T, d *Datapath, s *memSet) {
			hs := heads(s)
			local, short := hs["192.168.50.2:30080/TCP/0"], hs["192.168.50.2:30080/TCP/1"]
			want := flag(xbpf.XvsXvsSvcFlagsXVS_SVC_F_LOCAL | xbpf.XvsXvsSvcFlagsXVS_SVC_F_SHORT_CIRCUIT | xbpf.XvsXvsSvcFlagsXVS_SVC_F_HAS_ENDPOINTS)
			if local.Count != 1 || local.Flags&want != want || short.Count != 2 {
				t.Fatalf("NodePort heads: policy %+v, short-circuit %+v", local, short)
			}
			if ci := hs["172.30.0.10:80/TCP/0"]; ci.Count != 2 || ci.Flags&flag(xbpf.XvsXvsSvcFlagsXVS_SVC_F_LOCAL) != 0 {
				t.Fatalf("the ClusterIP follows internalTrafficPolicy, not external: %+v", ci)
			}
		}},
		{"source ranges on the LB IP only", func() *model.ServicePort {
			sp := svcPort("a", []model.Frontend{nodePort, lb}, "10.244.1.2:8080")
			sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28")}
			return sp
		}, func(t *testing.T, d *Datapath, s *memSet) {
			hs := heads(s)
			sr := flag(xbpf.XvsXvsSvcFlagsXVS_SVC_F_SOURCE_RANGES)
			if hs["203.0.113.10:80/TCP/0"].Flags&sr == 0 || hs["192.168.50.2:30080/TCP/0"].Flags&sr != 0 {
				t.Fatalf("source-range flags: LB %+v, NodePort %+v", hs["203.0.113.10:80/TCP/0"], hs["192.168.50.2:30080/TCP/0"])
			}
			if len(s.ranges.m) != 1 {
				t.Fatalf("source range keys %v, want the one range", s.ranges.m)
			}
		}},
		{"a source range holding the node's address also admits the LB IP (hairpin)", func() *model.ServicePort {
			sp := svcPort("a", []model.Frontend{lb}, "10.244.1.2:8080")
			sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28"), netip.MustParsePrefix("192.168.50.0/24")}
			return sp
		}, func(t *testing.T, d *Datapath, s *memSet) {
			if len(s.ranges.m) != 3 {
				t.Fatalf("source range keys %v, want both ranges and the LB IP", s.ranges.m)
			}
		}},
		{"an unweighted endpoint gets weight 1", func() *model.ServicePort {
			return svcPort("a", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080")
		}, func(t *testing.T, d *Datapath, s *memSet) {
			for _, b := range s.backends.m {
				if b.Weight != 1 {
					t.Fatalf("backend %+v", b)
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, s := memDatapath(t, Config{})
			if err := memSync(t, d, c.sp()); err != nil {
				t.Fatal(err)
			}
			c.check(t, d, s)
			if ps := d.Problems(); len(ps) > 0 {
				t.Fatalf("problems: %v", ps)
			}
		})
	}
}

// TestReconcileConflictAndLimits: a frontend two ServicePorts claim goes
// to the first in name order (model.ServicePortName.Compare, as in ipvs
// mode) and the other is told; a ServicePort beyond the service ID space
// is refused alone, with a problem, and the others are programmed; IDs
// of deleted ServicePorts come back (group IDs leaked before: after
// MaxServices ServicePorts created over an agent's life, none more could
// be programmed).
func TestReconcileConflictAndLimits(t *testing.T) {
	d, s := memDatapath(t, Config{MaxServices: 3, MaxBackends: 16})
	// "a/x" sorts before "a-b/x" by namespace (not by string).
	first := svcPort("x", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.1:80")
	first.Name.Namespace = "a"
	second := svcPort("x", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:80")
	second.Name.Namespace = "a-b"
	if err := memSync(t, d, second, first); err != nil {
		t.Fatal(err)
	}
	if owner := d.owners[maps.KeyOf(first.Frontends[0])]; owner != first.Name {
		t.Fatalf("frontend owned by %s, want %s", owner, first.Name)
	}
	if ps := d.Problems(); len(ps) != 1 || !strings.Contains(ps[0], "already served by a/x") {
		t.Fatalf("problems %v", ps)
	}

	// Three service IDs (of 4: ID 0 means none): the fourth frontend does
	// not fit.
	d, s = memDatapath(t, Config{MaxServices: 4, MaxBackends: 16})
	var sps []*model.ServicePort
	for i, vip := range []string{"172.30.0.1", "172.30.0.2", "172.30.0.3", "172.30.0.4"} {
		sps = append(sps, svcPort(string(rune('p'+i)), []model.Frontend{clusterIP(vip, 80)}, "10.244.1.1:80"))
	}
	if err := memSync(t, d, sps...); err != nil {
		t.Fatal(err)
	}
	if n := len(heads(s)); n != 3 {
		t.Fatalf("%d frontends programmed, want 3 (the ID space)", n)
	}
	if ps := d.Problems(); len(ps) != 1 || !strings.Contains(ps[0], "default/s") {
		t.Fatalf("problems %v, want the fourth ServicePort refused", ps)
	}
	// Room again: the refused one is retried and programmed. The removed
	// frontend's ID is free once its deletes are committed, so the sync
	// after that one (at most syncPeriod later: the agent syncs that
	// often while something is refused) takes it.
	for range 2 {
		if err := memSync(t, d, sps[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(heads(s)); n != 3 || len(d.Problems()) != 0 {
		t.Fatalf("after freeing an ID: %d frontends, problems %v", n, d.Problems())
	}
	// Churn: many more ServicePorts than IDs, created and deleted one
	// after another, never run out.
	for i := range 20 {
		sp := svcPort("churn-"+string(rune('a'+i)), []model.Frontend{clusterIP("172.30.1.1", 80)}, "10.244.1.1:80")
		for range 2 {
			if err := memSync(t, d, sp); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(heads(s)); n != 1 || len(d.Problems()) != 0 {
			t.Fatalf("churn %d: %d frontends, problems %v", i, n, d.Problems())
		}
	}
}

// TestReconcileOnlyChanged: a sync touches only the ServicePort that
// changed; a failed write makes the next sync a full one, which repairs
// what the maps lost.
func TestReconcileOnlyChanged(t *testing.T) {
	d, s := memDatapath(t, Config{})
	a := svcPort("a", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080")
	b := svcPort("b", []model.Frontend{clusterIP("172.30.0.11", 80)}, "10.244.1.3:8080")
	if err := memSync(t, d, a, b); err != nil {
		t.Fatal(err)
	}
	s.log.ops = nil
	b2 := svcPort("b", []model.Frontend{clusterIP("172.30.0.11", 80)}, "10.244.1.3:8080", "10.244.1.4:8080")
	if err := memSync(t, d, a, b2); err != nil {
		t.Fatal(err)
	}
	for _, o := range s.log.ops {
		if o.name == "services" && len(o.classes) > 3 {
			t.Fatalf("changing b rewrote %d service entries: %v", len(o.classes), s.log.ops)
		}
	}
	if heads(s)["172.30.0.11:80/TCP/0"].Count != 2 {
		t.Fatalf("b not updated: %+v", heads(s))
	}

	// The maps lose a's head behind the agent's back, and a write fails.
	for k := range s.services.m {
		if maps.FrontendOf(k).Addr == netip.MustParseAddr("172.30.0.10") && k.Slot == 0 {
			delete(s.services.m, k)
		}
	}
	s.backends.fail = true
	b3 := svcPort("b", []model.Frontend{clusterIP("172.30.0.11", 80)}, "10.244.1.5:8080")
	if err := memSync(t, d, a, b3); err == nil {
		t.Fatal("sync with a failing map succeeded")
	}
	s.backends.fail = false
	if err := memSync(t, d, a, b3); err != nil {
		t.Fatal(err)
	}
	hs := heads(s)
	if hs["172.30.0.10:80/TCP/0"].Count != 1 || hs["172.30.0.11:80/TCP/0"].Count != 1 {
		t.Fatalf("the full sync after the failure did not repair the maps: %+v", hs)
	}
}

// TestReconcileSourceRangesFull: the source-ranges map is accounted like
// the services map. A port whose loadBalancerSourceRanges do not fit is
// refused alone and keeps what it had, while the other Services of the
// same sync are programmed; a deletion makes room for its retry; and a
// restarted agent counts what the pinned map holds as the frontends' own,
// so its first sync refuses nothing. Before, the map's E2BIG failed every
// sync, retried as a full sync every second, and nothing else changed.
func TestReconcileSourceRangesFull(t *testing.T) {
	const capacity = 6
	d, s := memDatapath(t, Config{MaxServices: 16, MaxBackends: 64, MaxSourceRanges: capacity})
	s.ranges.max = capacity
	lb := func(name, addr string, ranges int) *model.ServicePort {
		f := model.Frontend{Kind: model.LoadBalancer, Addr: netip.MustParseAddr(addr), Port: 80, Proto: model.TCP}
		sp := svcPort(name, []model.Frontend{f}, "10.244.1.1:80")
		for i := range ranges {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(fmt.Sprintf("198.51.100.%d/32", i+1)))
		}
		return sp
	}
	a, b := lb("a", "203.0.113.1", 3), lb("b", "203.0.113.2", 2)
	if err := memSync(t, d, a, b); err != nil {
		t.Fatal(err)
	}
	if len(s.ranges.m) != 5 {
		t.Fatalf("start: %d range entries, want 5", len(s.ranges.m))
	}
	// b wants 3 more (1 is free); c, a new ClusterIP, comes in the same sync.
	b2, c := lb("b", "203.0.113.2", 5), svcPort("c", []model.Frontend{clusterIP("172.30.0.3", 80)}, "10.244.1.2:80")
	if err := memSync(t, d, a, b2, c); err != nil {
		t.Fatalf("a sync with one port whose ranges do not fit: %v", err)
	}
	if _, ok := heads(s)["172.30.0.3:80/TCP/0"]; !ok {
		t.Fatalf("c not programmed beside the refused port: %v", heads(s))
	}
	if len(s.ranges.m) != 5 {
		t.Fatalf("after the refusal: %d range entries, want b's previous 2 and a's 3", len(s.ranges.m))
	}
	if ps := d.Problems(); len(ps) != 1 || !strings.Contains(ps[0], "default/b") || !strings.Contains(ps[0], "source-ranges map is full") {
		t.Fatalf("problems %v, want b refused for a full source-ranges map", ps)
	}
	// a goes: its 3 entries are deleted in this sync, b fits in the next.
	if err := memSync(t, d, b2, c); err != nil {
		t.Fatal(err)
	}
	if err := memSync(t, d, b2, c); err != nil {
		t.Fatal(err)
	}
	if len(s.ranges.m) != 5 || len(d.Problems()) != 0 {
		t.Fatalf("after a's deletion: %d range entries, problems %v; want b's 5", len(s.ranges.m), d.Problems())
	}
	if o := d.MapOccupancy()["source_ranges"]; o != [2]uint64{5, capacity} {
		t.Fatalf("source_ranges occupancy %v, want 5 of %d", o, capacity)
	}
	// A restarted agent over the same maps: 5 of 6 held, and b's 5 are
	// its own, not 5 more.
	d2, err := newDatapath(s.mapSet, Config{MaxServices: 16, MaxBackends: 64, MaxSourceRanges: capacity})
	if err != nil {
		t.Fatal(err)
	}
	if err := memSync(t, d2, b2, c); err != nil {
		t.Fatal(err)
	}
	if len(s.ranges.m) != 5 || len(d2.Problems()) != 0 {
		t.Fatalf("first sync after a restart: %d range entries, problems %v", len(s.ranges.m), d2.Problems())
	}
}

// TestReconcileServicesFull: a ServicePort whose entries the services map
// cannot take is refused alone: it keeps what it had, the other changes
// of the same sync (a growth that fits, a deletion) are applied, and once
// the deletion has freed room it is programmed. Without the accounting
// the map's E2BIG fails the whole sync, and with it every change.
func TestReconcileServicesFull(t *testing.T) {
	const slots = 10
	d, s := memDatapath(t, Config{MaxServices: 16, MaxBackends: 64, MaxServiceSlots: slots})
	s.services.max = slots
	eps := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.244.1.%d:80", i+1))
		}
		return out
	}
	a := svcPort("a", []model.Frontend{clusterIP("172.30.0.1", 80)}, eps(3)...)
	b := svcPort("b", []model.Frontend{clusterIP("172.30.0.2", 80)}, eps(3)...)
	if err := memSync(t, d, a, b); err != nil {
		t.Fatal(err)
	}
	count := func(vip string) int {
		return int(heads(s)[vip+":80/TCP/0"].Count)
	}
	if count("172.30.0.1") != 3 || count("172.30.0.2") != 3 || len(s.services.m) != 8 {
		t.Fatalf("start: heads %v, %d entries", heads(s), len(s.services.m))
	}

	// a grows by one (fits: 9 of 10), b by five (does not).
	a2 := svcPort("a", a.Frontends, eps(4)...)
	b2 := svcPort("b", b.Frontends, eps(8)...)
	if err := memSync(t, d, a2, b2); err != nil {
		t.Fatalf("a sync with one port that does not fit: %v", err)
	}
	if count("172.30.0.1") != 4 || count("172.30.0.2") != 3 {
		t.Fatalf("after the growth: heads %v; want a with 4 backends, b with its 3", heads(s))
	}
	if ps := d.Problems(); len(ps) != 1 || !strings.Contains(ps[0], "default/b") || !strings.Contains(ps[0], "services map is full") {
		t.Fatalf("problems %v, want b refused for a full services map", ps)
	}
	if o := d.MapOccupancy()["services"]; o[0] != uint64(len(s.services.m)) || o[1] != slots {
		t.Fatalf("occupancy %v, the map holds %d of %d", o, len(s.services.m), slots)
	}

	// a is deleted: its entries go in this sync, b's retry fits in the next.
	if err := memSync(t, d, b2); err != nil {
		t.Fatal(err)
	}
	if _, ok := heads(s)["172.30.0.1:80/TCP/0"]; ok {
		t.Fatalf("a's frontend still programmed after its deletion: %v", heads(s))
	}
	if err := memSync(t, d, b2); err != nil {
		t.Fatal(err)
	}
	if count("172.30.0.2") != 8 || len(d.Problems()) != 0 || len(s.services.m) != 9 {
		t.Fatalf("after a's deletion: heads %v, problems %v, %d entries", heads(s), d.Problems(), len(s.services.m))
	}
	// A new port that can never fit is refused, and nothing of it stays.
	c := svcPort("c", []model.Frontend{clusterIP("172.30.0.3", 80)}, eps(5)...)
	if err := memSync(t, d, b2, c); err != nil {
		t.Fatal(err)
	}
	if _, ok := heads(s)["172.30.0.3:80/TCP/0"]; ok || count("172.30.0.2") != 8 || len(d.Problems()) != 1 {
		t.Fatalf("a new port that does not fit: heads %v, problems %v", heads(s), d.Problems())
	}
}

// TestReconcileStrayBackendIDs: pinned maps holding two IDs for one
// backend (two agents once wrote one pin path) are repaired by the first
// sync after a restart: one ID is kept, the other's entry and counters
// deleted, and nothing leaks (before, the second ID stayed claimed and in
// the map forever).
func TestReconcileStrayBackendIDs(t *testing.T) {
	d, s := memDatapath(t, Config{})
	web := svcPort("web", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080")
	if err := memSync(t, d, web); err != nil {
		t.Fatal(err)
	}
	var kept uint32
	var entry xbpf.Backend
	for id, b := range s.backends.m {
		kept, entry = id, b
	}
	if len(s.backends.m) != 1 {
		t.Fatalf("%d backends, want 1", len(s.backends.m))
	}
	stray := kept + 7
	s.backends.m[stray] = entry
	s.beStats.m[stray] = true

	d2, err := newDatapath(s.mapSet, Config{MaxServices: 64, MaxBackends: 256})
	if err != nil {
		t.Fatal(err)
	}
	if err := memSync(t, d2, web); err != nil {
		t.Fatal(err)
	}
	if len(s.backends.m) != 1 {
		t.Fatalf("backends after the repair: %v, want one", s.backends.m)
	}
	var left uint32
	for id := range s.backends.m {
		left = id
	}
	for k, v := range s.services.m {
		if k.Slot != 0 && v.BackendId != left {
			t.Errorf("slot %+v points at backend %d, the map has %d", k, v.BackendId, left)
		}
	}
	if s.beStats.m[stray] && left != stray {
		t.Errorf("the stray ID %d's counters were left", stray)
	}
	// Only the ID in use is taken: the other is not leaked.
	for _, id := range []uint32{kept, stray} {
		if d2.backendIDs.isTaken(id) != (id == left) {
			t.Errorf("backend ID %d taken %v, in use %d", id, d2.backendIDs.isTaken(id), left)
		}
	}
}
