package controller

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/model"
)

// TestFrontendCollisions: a contested address:port goes to the most
// trusted kind (ClusterIP, NodePort, LoadBalancer, ExternalIP), then to
// the older Service, then to the first name, whatever the order the
// Tracker saw the Services in, and the same as Translate says; the losers
// are served without it, both sides get a Problem, and when the winner
// goes the next claimant gets the address in the same sync.
func TestFrontendCollisions(t *testing.T) {
	born := func(sec int) svcOpt {
		return func(s *v1.Service) {
			s.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, sec, 0, time.UTC))
		}
	}
	inNS := func(ns string) svcOpt { return func(s *v1.Service) { s.Namespace = ns } }
	// kube-dns, and a tenant in namespace "aaa" (first by name, and
	// older) naming kube-dns's ClusterIP among its externalIPs.
	dns := newSvc("kube-dns", inNS("kube-system"), clusterIPs("10.96.0.10"), born(50))
	thief := newSvc("steal", inNS("aaa"), clusterIPs("10.96.0.77"), externalIPs("10.96.0.10", "198.51.100.7"), born(1))
	// An LB IP taken as an externalIP by an older Service: the LB keeps it.
	lb := newSvc("lb", clusterIPs("10.96.0.20"), lbIngress("203.0.113.10", ""), nodePort(30100), born(40))
	ext := newSvc("ext", inNS("a"), clusterIPs("10.96.0.21"), externalIPs("203.0.113.10"), born(2))
	// Two externalIP claims: the older (later by name) keeps it.
	old := newSvc("zzz-old", clusterIPs("10.96.0.30"), externalIPs("198.51.100.7"), born(0))
	for _, s := range []*v1.Service{dns, thief, lb, ext, old} {
		s.Spec.Ports[0].Port = 53
	}
	all := []*v1.Service{dns, thief, lb, ext, old}

	frontends := func(st *model.State, ns, name string) []string {
		var out []string
		for n, sp := range st.Services {
			if n.Namespace == ns && n.Name == name {
				for _, f := range sp.Frontends {
					out = append(out, f.Kind.String()+" "+netip.AddrPortFrom(f.Addr, f.Port).String())
				}
			}
		}
		slices.Sort(out)
		return out
	}
	want := map[string][]string{
		"kube-system/kube-dns": {"ClusterIP 10.96.0.10:53"},
		"aaa/steal":            {"ClusterIP 10.96.0.77:53"},
		"ns/lb":                {"LoadBalancer 203.0.113.10:53", "ClusterIP 10.96.0.20:53", "NodePort 192.0.2.1:30100"},
		"a/ext":                {"ClusterIP 10.96.0.21:53"},
		"ns/zzz-old":           {"ClusterIP 10.96.0.30:53", "ExternalIP 198.51.100.7:53"},
	}
	check := func(how string, st *model.State, probs []Problem) {
		t.Helper()
		for obj, w := range want {
			ns, name, _ := strings.Cut(obj, "/")
			w = slices.Sorted(slices.Values(w))
			if got := frontends(st, ns, name); !slices.Equal(got, w) {
				t.Errorf("%s: %s serves %v, want %v", how, obj, got, w)
			}
		}
		for _, who := range []string{"kube-system/kube-dns", "aaa/steal", "ns/lb", "a/ext", "ns/zzz-old"} {
			if !slices.ContainsFunc(probs, func(p Problem) bool { return p.Object == who && strings.Contains(p.Reason, "53/") }) {
				t.Errorf("%s: no Problem for %s: %v", how, who, probs)
			}
		}
	}
	cfg := testConfig()
	cfg.NodeAddresses = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	st, probs := Translate(cfg, all, nil, nil)
	check("Translate", st, probs)

	// The Tracker, fed in every order the thief could hope for: its
	// Service first, in a sync of its own, then the others one by one.
	for _, order := range [][]*v1.Service{{thief, ext, dns, lb, old}, {old, lb, dns, ext, thief}} {
		tr, err := NewTracker(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var s Sync
		for _, svc := range order {
			tr.OnServiceAdd(NewService(svc))
			s = tr.Build()
		}
		check("Tracker", s.State, s.Problems)
		// The winner of 198.51.100.7 goes: the thief gets it in the same
		// sync, through the delta, as Translate would say.
		tr.OnServiceDelete(NewService(old))
		s = tr.Build()
		if got := frontends(s.State, "aaa", "steal"); !slices.Contains(got, "ExternalIP 198.51.100.7:53") {
			t.Errorf("after ns/zzz-old went, aaa/steal serves %v", got)
		}
		if d := s.State.Delta; d == nil || !slices.Contains(d.Names, model.ServicePortName{Namespace: "aaa", Name: "steal", Port: "http", Protocol: model.TCP}) {
			t.Errorf("the delta does not carry aaa/steal: %+v", d)
		}
		ref, _ := Translate(cfg, []*v1.Service{dns, thief, lb, ext}, nil, nil)
		if got, w := frontends(s.State, "aaa", "steal"), frontends(ref, "aaa", "steal"); !slices.Equal(got, w) {
			t.Errorf("Tracker %v, Translate %v", got, w)
		}
		if slices.ContainsFunc(s.Problems, func(p Problem) bool { return p.Object == "ns/zzz-old" }) {
			t.Errorf("a Problem outlives ns/zzz-old: %v", s.Problems)
		}
	}
}
