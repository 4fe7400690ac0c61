package controller

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
