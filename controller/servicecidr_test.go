package controller

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/model"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// The State's service ranges are the configured ones and every
// ServiceCIDR's, sorted and without repeats; a change rebuilds no Service.
func TestTrackerServiceCIDRs(t *testing.T) {
	cfg := testConfig()
	cfg.ServiceCIDRs = prefixes("10.96.0.0/16")
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr.OnServiceAdd(NewService(newSvc("s")))
	first := tr.Build()
	if got := first.State.ServiceCIDRs; !slices.Equal(got, prefixes("10.96.0.0/16")) {
		t.Fatalf("configured only: %v", got)
	}
	port := portOf(first.State, "s")

	steps := []struct {
		name    string
		call    func() bool
		changed bool
		want    []netip.Prefix
	}{
		{"the API server's own", func() bool {
			return tr.OnServiceCIDRAdd(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:96::/112"))
		}, true, prefixes("10.96.0.0/16", "fd00:96::/112")},
		{"an extra range", func() bool { return tr.OnServiceCIDRAdd(serviceCIDR("extra", "10.100.0.0/24")) },
			true, prefixes("10.96.0.0/16", "10.100.0.0/24", "fd00:96::/112")},
		{"a resync", func() bool {
			return tr.OnServiceCIDRUpdate(nil, serviceCIDR("extra", "10.100.0.0/24"))
		}, false, nil},
		{"the API server's deleted: the flag's stays", func() bool {
			return tr.OnServiceCIDRDelete(serviceCIDR("kubernetes"))
		}, true, prefixes("10.96.0.0/16", "10.100.0.0/24")},
		{"deleting an unknown one", func() bool { return tr.OnServiceCIDRDelete(serviceCIDR("nope")) }, false, nil},
		{"the extra one changed", func() bool {
			return tr.OnServiceCIDRUpdate(nil, serviceCIDR("extra", "10.101.0.0/24"))
		}, true, prefixes("10.96.0.0/16", "10.101.0.0/24")},
	}
	prev := first.State
	for _, s := range steps {
		if got := s.call(); got != s.changed {
			t.Fatalf("%s: changed %v, want %v", s.name, got, s.changed)
		}
		if got := tr.Pending(); got != s.changed {
			t.Fatalf("%s: Pending %v", s.name, got)
		}
		res := tr.Build()
		if !s.changed {
			if res.Changed || res.State != prev {
				t.Fatalf("%s: a no-op built a new State", s.name)
			}
			continue
		}
		if !res.Changed || res.Full {
			t.Fatalf("%s: Changed %v Full %v, want a changed, incremental State", s.name, res.Changed, res.Full)
		}
		if got := res.State.ServiceCIDRs; !slices.Equal(got, s.want) {
			t.Fatalf("%s: ranges %v, want %v", s.name, got, s.want)
		}
		if res.State.Delta == nil || len(res.State.Delta.Names) != 0 || portOf(res.State, "s") != port {
			t.Fatalf("%s: the Service was rebuilt (delta %+v)", s.name, res.State.Delta)
		}
		prev = res.State
	}
}

// Ranges the API server would refuse (from a manifest file) are reported
// and left out; the object's good ranges count.
func TestTrackerServiceCIDRProblems(t *testing.T) {
	tr := newTestTracker(t)
	tr.OnServiceCIDRAdd(serviceCIDR("bad", "10.0.0.1/24", "nonsense", "10.1.0.0/24"))
	res := tr.Build()
	if got := res.State.ServiceCIDRs; !slices.Equal(got, prefixes("10.1.0.0/24")) {
		t.Fatalf("ranges %v", got)
	}
	got := problemStrings(res.Problems)
	if len(got) != 2 || !strings.Contains(got[0]+got[1], "not canonical (the network is 10.0.0.0/24)") ||
		!strings.Contains(got[0]+got[1], `"nonsense": not a CIDR`) {
		t.Fatalf("problems %q", got)
	}
	tr.OnServiceCIDRUpdate(nil, serviceCIDR("bad", "10.1.0.0/24"))
	if res := tr.Build(); len(res.Problems) != 0 {
		t.Fatalf("fixed object still reported: %q", problemStrings(res.Problems))
	}
}

// A ServiceCIDR manifest is read like the other kinds, cluster-scoped.
func TestFileSourceServiceCIDR(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "cidr.yaml", `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata:
  name: extra
  namespace: ignored
spec:
  cidrs: ["10.100.0.0/24", "fd00:100::/112"]
`)
	if !mustLoad(t, src) {
		t.Fatal("load reported no change")
	}
	if p := src.Problems(); len(p) > 0 {
		t.Fatalf("problems %q", problemStrings(p))
	}
	if got := tr.Build().State.ServiceCIDRs; !slices.Equal(got, prefixes("10.100.0.0/24", "fd00:100::/112")) {
		t.Fatalf("ranges %v", got)
	}
	removeFile(t, dir, "cidr.yaml")
	if !mustLoad(t, src) {
		t.Fatal("removal reported no change")
	}
	if got := tr.Build().State.ServiceCIDRs; len(got) != 0 {
		t.Fatalf("ranges after removal %v", got)
	}
}

// externalFrontends lists a State's ExternalIP frontends of Service svc.
func externalFrontends(st *model.State, svc string) []string {
	var out []string
	if sp := portOf(st, svc); sp != nil {
		for _, f := range sp.Frontends {
			if f.Kind == model.ExternalIP {
				out = append(out, f.Addr.String())
			}
		}
	}
	slices.Sort(out)
	return out
}

func mentions(probs []Problem, what string) bool {
	return slices.ContainsFunc(probs, func(p Problem) bool { return strings.Contains(p.Reason, what) })
}

// An externalIP inside a service CIDR (where the API server allocates
// ClusterIPs: a claim on a Service's address, CVE-2020-8554) is refused
// and reported, the Service's other externalIPs served; the agent's flag
// allows it. The Tracker refuses the same when a ServiceCIDR object
// covers the address, lets it go when the object goes, and agrees with
// Translate over the same ranges.
func TestExternalIPsInServiceCIDRs(t *testing.T) {
	tenant := newSvc("tenant", clusterIPs("10.96.0.77"), externalIPs("10.96.0.10", "10.100.0.5", "198.51.100.9"))
	cfg := testConfig()
	cfg.ServiceCIDRs = prefixes("10.96.0.0/16")
	st, probs := Translate(cfg, []*v1.Service{tenant}, nil, nil)
	if got := externalFrontends(st, "tenant"); !slices.Equal(got, []string{"10.100.0.5", "198.51.100.9"}) {
		t.Fatalf("served externalIPs %v, want 10.100.0.5 and 198.51.100.9", got)
	}
	if !mentions(probs, "externalIPs: 10.96.0.10 is inside the service CIDR 10.96.0.0/16") {
		t.Fatalf("no problem reported for 10.96.0.10: %v", probs)
	}
	cfg.AllowExternalIPsInServiceCIDRs = true
	if st, _ := Translate(cfg, []*v1.Service{tenant}, nil, nil); len(externalFrontends(st, "tenant")) != 3 {
		t.Fatalf("allowed: served %v, want all three", externalFrontends(st, "tenant"))
	}

	cfg.AllowExternalIPsInServiceCIDRs = false
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr.OnServiceAdd(NewService(tenant))
	tr.OnServiceAdd(NewService(newSvc("other", clusterIPs("10.96.0.78"))))
	first := tr.Build()
	other := portOf(first.State, "other")
	steps := []struct {
		name   string
		call   func() bool
		ranges []string
		want   []string
	}{
		{"a ServiceCIDR over 10.100.0.0/24", func() bool { return tr.OnServiceCIDRAdd(serviceCIDR("extra", "10.100.0.0/24")) },
			[]string{"10.96.0.0/16", "10.100.0.0/24"}, []string{"198.51.100.9"}},
		{"the ServiceCIDR gone", func() bool { return tr.OnServiceCIDRDelete(serviceCIDR("extra")) },
			[]string{"10.96.0.0/16"}, []string{"10.100.0.5", "198.51.100.9"}},
	}
	for _, s := range steps {
		if !s.call() {
			t.Fatalf("%s: no change", s.name)
		}
		res := tr.Build()
		if got := externalFrontends(res.State, "tenant"); !slices.Equal(got, s.want) {
			t.Fatalf("%s: served externalIPs %v, want %v", s.name, got, s.want)
		}
		if portOf(res.State, "other") != other {
			t.Fatalf("%s: a Service without externalIPs was rebuilt", s.name)
		}
		tcfg := cfg
		tcfg.ServiceCIDRs = prefixes(s.ranges...)
		want, _ := Translate(tcfg, []*v1.Service{tenant}, nil, nil)
		if got := externalFrontends(want, "tenant"); !slices.Equal(got, s.want) {
			t.Fatalf("%s: Translate serves %v, the Tracker %v", s.name, got, s.want)
		}
	}
	if !mentions(tr.Build().Problems, "10.96.0.10 is inside the service CIDR") {
		t.Fatal("the Tracker does not report the refused externalIP")
	}
}
