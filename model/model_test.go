package model

import (
	"slices"
	"testing"
)

// TestServicePortNameCompare: names sort field by field (namespace, name,
// port, protocol), which is not the order of their strings: "a-b/x" sorts
// before "a/x" as a string but after it by namespace.
func TestServicePortNameCompare(t *testing.T) {
	names := []ServicePortName{
		{Namespace: "a-b", Name: "x", Protocol: TCP},
		{Namespace: "a", Name: "x", Port: "http", Protocol: UDP},
		{Namespace: "a", Name: "x", Port: "http", Protocol: TCP},
		{Namespace: "a", Name: "x", Protocol: TCP},
	}
	slices.SortFunc(names, ServicePortName.Compare)
	want := []string{"a/x/TCP", "a/x:http/TCP", "a/x:http/UDP", "a-b/x/TCP"}
	for i, n := range names {
		if n.String() != want[i] {
			t.Fatalf("sorted %v, want %v", names, want)
		}
	}
}

// TestLocalPolicy: which frontends obey a Local policy, and which
// short-circuit in-cluster clients.
func TestLocalPolicy(t *testing.T) {
	for _, c := range []struct {
		internal, external bool
		kind               FrontendKind
		local, short       bool
	}{
		{internal: true, kind: ClusterIP, local: true},
		{external: true, kind: ClusterIP},
		{external: true, kind: NodePort, local: true, short: true},
		{external: true, kind: LoadBalancer, local: true, short: true},
		{external: true, kind: ExternalIP, local: true, short: true},
		{internal: true, kind: NodePort},
	} {
		sp := &ServicePort{InternalLocal: c.internal, ExternalLocal: c.external}
		if got := sp.LocalPolicy(c.kind); got != c.local {
			t.Errorf("%+v: LocalPolicy %v, want %v", c, got, c.local)
		}
		if got := sp.ShortCircuits(c.kind); got != c.short {
			t.Errorf("%+v: ShortCircuits %v, want %v", c, got, c.short)
		}
	}
	if w := (Endpoint{}).SchedWeight(); w != 1 {
		t.Errorf("SchedWeight of an unweighted endpoint %d, want 1", w)
	}
	if w := (Endpoint{Weight: 7}).SchedWeight(); w != 7 {
		t.Errorf("SchedWeight %d, want 7", w)
	}
}
