package controller

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xvs-lb/xvs/model"
)

// Endpoints used by the condition tables: L = local, R = remote (node-b).
var (
	localReady     = newEP("10.0.0.1", local)
	remoteReady    = newEP("10.0.1.1", onNode("node-b"))
	localServTerm  = newEP("10.0.0.2", local, servingTerminating)
	remoteServTerm = newEP("10.0.1.2", onNode("node-b"), servingTerminating)
	localNotServ   = newEP("10.0.0.3", local, conds(false, false, true))
	remoteNotServ  = newEP("10.0.1.3", onNode("node-b"), conds(false, false, true))
	remoteNotReady = newEP("10.0.1.4", onNode("node-b"), conds(false, true, false))
)

// §3.10 (KEP-1669 CategorizeEndpoints): cluster and local sets from the
// ready/serving/terminating conditions. The Service is a NodePort with
// eTP=Local, so both sets are computed (the cluster set serves
// short-circuited pod traffic).
func TestEndpointConditions(t *testing.T) {
	tests := []struct {
		name       string
		eps        []discoveryv1.Endpoint
		cluster    []string
		local      []string
		has        bool
		localReady int
	}{
		{name: "ready wins over terminating",
			eps:     []discoveryv1.Endpoint{localReady, remoteReady, localServTerm, remoteServTerm},
			cluster: []string{"10.0.0.1:8080", "10.0.1.1:8080"}, local: []string{"10.0.0.1:8080"}, has: true, localReady: 1},
		{name: "no ready anywhere: serving-terminating fallback",
			eps:     []discoveryv1.Endpoint{localServTerm, remoteServTerm},
			cluster: []string{"10.0.0.2:8080", "10.0.1.2:8080"}, local: []string{"10.0.0.2:8080"}, has: true},
		{name: "TL: local terminating, not the remote ready one",
			eps:     []discoveryv1.Endpoint{remoteReady, localServTerm},
			cluster: []string{"10.0.1.1:8080"}, local: []string{"10.0.0.2:8080"}, has: true},
		{name: "no local endpoint: DROP, not REJECT",
			eps:     []discoveryv1.Endpoint{remoteReady, remoteServTerm},
			cluster: []string{"10.0.1.1:8080"}, has: true},
		{name: "not serving is never used: REJECT",
			eps: []discoveryv1.Endpoint{localNotServ, remoteNotServ}},
		{name: "not ready, serving, not terminating is never used",
			eps: []discoveryv1.Endpoint{remoteNotReady}},
		{name: "nil conditions mean ready",
			eps:     []discoveryv1.Endpoint{newEP("10.0.0.9", local)},
			cluster: []string{"10.0.0.9:8080"}, local: []string{"10.0.0.9:8080"}, has: true, localReady: 1},
		{name: "nil serving means serving (discovery/v1)",
			eps:     []discoveryv1.Endpoint{newEP("10.0.0.9", local, ready(false), terminating(true))},
			cluster: []string{"10.0.0.9:8080"}, local: []string{"10.0.0.9:8080"}, has: true},
		{name: "ready and terminating counts as ready (publishNotReadyAddresses)",
			eps:     []discoveryv1.Endpoint{newEP("10.0.0.9", local, conds(true, true, true)), remoteServTerm},
			cluster: []string{"10.0.0.9:8080"}, local: []string{"10.0.0.9:8080"}, has: true, localReady: 1},
		{name: "no endpoints at all"},
	}
	svc := newSvc("s", nodePort(30080), etpLocal)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, _ := translateOne(t, testConfig(), nil, svc, v4Slice("s", tt.eps...))
			if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, tt.cluster) {
				t.Errorf("cluster %q, want %q", got, tt.cluster)
			}
			if got := epStrings(sp.LocalEndpoints); !equalStrings(got, tt.local) {
				t.Errorf("local %q, want %q", got, tt.local)
			}
			if sp.HasEndpoints != tt.has || sp.LocalReady != tt.localReady {
				t.Errorf("HasEndpoints %v LocalReady %d, want %v %d", sp.HasEndpoints, sp.LocalReady, tt.has, tt.localReady)
			}
		})
	}
}

// §3.8, §3.9: which sets each policy computes and uses.
func TestTrafficPolicies(t *testing.T) {
	eps := v4Slice("s", localReady, remoteReady)
	all, loc := []string{"10.0.0.1:8080", "10.0.1.1:8080"}, []string{"10.0.0.1:8080"}
	tests := []struct {
		name                    string
		svc                     *v1.Service
		internalLocal, extLocal bool
		cluster, local          []string
		clusterIP, external     []string // EndpointsFor(ClusterIP), EndpointsFor(NodePort)
		hcnp                    uint16
		problem                 string
	}{
		{name: "ClusterIP", svc: newSvc("s"), cluster: all, clusterIP: all, external: all},
		{name: "ClusterIP ignores eTP", svc: newSvc("s", etpLocal), cluster: all, clusterIP: all, external: all},
		{name: "NodePort eTP=Local", svc: newSvc("s", nodePort(30080), etpLocal), extLocal: true,
			cluster: all, local: loc, clusterIP: all, external: loc},
		{name: "externalIPs eTP=Local", svc: newSvc("s", externalIPs("192.0.2.1"), etpLocal), extLocal: true,
			cluster: all, local: loc, clusterIP: all, external: loc},
		{name: "LoadBalancer eTP=Local has a health check", extLocal: true, hcnp: 32000,
			svc:     newSvc("s", lbIngress("192.0.2.1", ""), nodePort(30080), etpLocal, func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			cluster: all, local: loc, clusterIP: all, external: loc},
		{name: "LoadBalancer eTP=Local without healthCheckNodePort", extLocal: true, problem: "without healthCheckNodePort",
			svc:     newSvc("s", lbIngress("192.0.2.1", ""), nodePort(30080), etpLocal),
			cluster: all, local: loc, clusterIP: all, external: loc},
		{name: "iTP=Local, ClusterIP only: no cluster set", svc: newSvc("s", itpLocal), internalLocal: true,
			local: loc, clusterIP: loc},
		{name: "iTP=Local with NodePort: cluster set for external", svc: newSvc("s", itpLocal, nodePort(30080)),
			internalLocal: true, cluster: all, local: loc, clusterIP: loc, external: all},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, probs := translateOne(t, testConfig(), nil, tt.svc, eps)
			if sp.InternalLocal != tt.internalLocal || sp.ExternalLocal != tt.extLocal || sp.HealthCheckNodePort != tt.hcnp {
				t.Errorf("InternalLocal %v ExternalLocal %v HCNP %d", sp.InternalLocal, sp.ExternalLocal, sp.HealthCheckNodePort)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{
				{"cluster", epStrings(sp.ClusterEndpoints), tt.cluster},
				{"local", epStrings(sp.LocalEndpoints), tt.local},
				{"EndpointsFor(ClusterIP)", epStrings(sp.EndpointsFor(model.ClusterIP)), tt.clusterIP},
			} {
				if !equalStrings(c.got, c.want) {
					t.Errorf("%s %q, want %q", c.what, c.got, c.want)
				}
			}
			if tt.external != nil && !equalStrings(epStrings(sp.EndpointsFor(model.NodePort)), tt.external) {
				t.Errorf("EndpointsFor(NodePort) %q, want %q", epStrings(sp.EndpointsFor(model.NodePort)), tt.external)
			}
			if hasProblem(probs, tt.problem) != (tt.problem != "") {
				t.Errorf("problems %q, want %q", problemStrings(probs), tt.problem)
			}
		})
	}
}

// §3.11: topology hints.
func TestTopologyHints(t *testing.T) {
	a, b, c := "10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"
	ep := func(addr string, opts ...epOpt) discoveryv1.Endpoint {
		return newEP(addr, append([]epOpt{onNode("node-x")}, opts...)...)
	}
	zoned := testNodeObj(zoneLabels(testZone))
	tests := []struct {
		name    string
		node    *v1.Node
		svc     *v1.Service
		eps     []discoveryv1.Endpoint
		cluster []string
		local   []string
	}{
		{name: "zone hints select our zone", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("zone-a")), ep("10.0.1.2", zoneHints("zone-b"))}, cluster: []string{a}},
		{name: "a ready endpoint without hints disables filtering", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("zone-a")), ep("10.0.1.2")}, cluster: []string{a, b}},
		{name: "hints of not-ready endpoints do not count", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("zone-a")), ep("10.0.1.2", zoneHints("zone-b")),
				ep("10.0.1.3", conds(false, false, false))}, cluster: []string{a}},
		{name: "no endpoint for our zone", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("zone-b")), ep("10.0.1.2", zoneHints("zone-c"))}, cluster: []string{a, b}},
		{name: "no zone label", node: testNodeObj(nil),
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("zone-a")), ep("10.0.1.2", zoneHints("zone-b"))}, cluster: []string{a, b}},
		{name: "empty zone label", node: testNodeObj(zoneLabels("")),
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", zoneHints("")), ep("10.0.1.2", zoneHints("zone-b"))}, cluster: []string{a, b}},
		{name: "node hints select our node", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", nodeHints(testNode), zoneHints("zone-a")),
				ep("10.0.1.2", nodeHints("node-b"), zoneHints("zone-a"))}, cluster: []string{a}},
		{name: "node hints not for us fall back to zone", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", nodeHints("node-b"), zoneHints("zone-a")),
				ep("10.0.1.2", nodeHints("node-c"), zoneHints("zone-b"))}, cluster: []string{a}},
		{name: "an endpoint without node hint means zone mode", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", nodeHints(testNode), zoneHints("zone-a")),
				ep("10.0.1.2", zoneHints("zone-a")), ep("10.0.1.3", nodeHints("node-c"), zoneHints("zone-b"))}, cluster: []string{a, b}},
		{name: "node hints without a node object", node: nil,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", nodeHints(testNode)), ep("10.0.1.2", nodeHints("node-b"))}, cluster: []string{a}},
		{name: "terminating fallback ignores topology", node: zoned,
			eps: []discoveryv1.Endpoint{ep("10.0.1.1", servingTerminating, zoneHints("zone-b")),
				ep("10.0.1.3", servingTerminating, zoneHints("zone-a"))}, cluster: []string{a, c}},
		{name: "local set ignores topology", node: zoned, svc: newSvc("s", nodePort(30080), etpLocal),
			eps:     []discoveryv1.Endpoint{newEP("10.0.0.1", local, zoneHints("zone-b")), ep("10.0.1.2", zoneHints("zone-a"))},
			cluster: []string{b}, local: []string{"10.0.0.1:8080"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newSvc("s")
			}
			sp, _ := translateOne(t, testConfig(), tt.node, svc, v4Slice("s", tt.eps...))
			if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, tt.cluster) {
				t.Errorf("cluster %q, want %q", got, tt.cluster)
			}
			if got := epStrings(sp.LocalEndpoints); !equalStrings(got, tt.local) {
				t.Errorf("local %q, want %q", got, tt.local)
			}
		})
	}
}

// §3.15: each family is categorised on its own and served only its own
// endpoints; a family without a ClusterIP is not served at all.
func TestDualStack(t *testing.T) {
	cfg := testConfig()
	cfg.NodeAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}
	v6Port := []discoveryv1.EndpointPort{slicePortOf("http", 8080)}
	dual := newSvc("s", clusterIPs("10.96.0.1", "fd00:96::1"), nodePort(30080))

	t.Run("per-family fallback", func(t *testing.T) {
		sp, probs := translateOne(t, cfg, nil, dual,
			v4Slice("s", remoteReady),
			newSlice("s", "s-v6", discoveryv1.AddressTypeIPv6, v6Port, newEP("fd00::1", servingTerminating)))
		if got, want := epStrings(sp.ClusterEndpoints), []string{"10.0.1.1:8080", "[fd00::1]:8080"}; !equalStrings(got, want) || len(probs) > 0 {
			t.Errorf("cluster %q problems %q, want %q", got, problemStrings(probs), want)
		}
		want := []string{"ClusterIP 10.96.0.1:80", "ClusterIP [fd00:96::1]:80", "NodePort 192.168.1.10:30080", "NodePort [fd00::10]:30080"}
		if got := feStrings(sp.Frontends); !equalStrings(got, want) {
			t.Errorf("frontends %q, want %q", got, want)
		}
		v6 := sp.Frontends[1]
		if got := epStrings(sp.EndpointsForFrontend(v6)); !equalStrings(got, []string{"[fd00::1]:8080"}) {
			t.Errorf("EndpointsForFrontend(%s) = %q", v6, got)
		}
	})
	t.Run("family without endpoints rejects", func(t *testing.T) {
		sp, _ := translateOne(t, cfg, nil, dual, v4Slice("s", remoteReady))
		if !sp.HasEndpoints || sp.HasEndpointsFamily != [2]bool{true, false} ||
			sp.HasEndpointsFor(netip.MustParseAddr("fd00:96::1")) || !sp.HasEndpointsFor(netip.MustParseAddr("10.96.0.1")) {
			t.Errorf("HasEndpoints %v by family %v", sp.HasEndpoints, sp.HasEndpointsFamily)
		}
	})
	t.Run("single-stack ignores the other family", func(t *testing.T) {
		svc := newSvc("s", nodePort(30080), externalIPs("192.0.2.1", "2001:db8::1"))
		sp, _ := translateOne(t, cfg, nil, svc, v4Slice("s", remoteReady),
			newSlice("s", "s-v6", discoveryv1.AddressTypeIPv6, v6Port, newEP("fd00::1")))
		want := []string{"ClusterIP 10.96.0.1:80", "NodePort 192.168.1.10:30080", "ExternalIP 192.0.2.1:80"}
		if got := feStrings(sp.Frontends); !equalStrings(got, want) {
			t.Errorf("frontends %q, want %q", got, want)
		}
		if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, []string{"10.0.1.1:8080"}) {
			t.Errorf("cluster %q", got)
		}
	})
	t.Run("IPv6-only", func(t *testing.T) {
		svc := newSvc("s", clusterIPs("fd00:96::1"))
		sp, _ := translateOne(t, cfg, nil, svc, v4Slice("s", remoteReady),
			newSlice("s", "s-v6", discoveryv1.AddressTypeIPv6, v6Port, newEP("fd00::1")))
		if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, []string{"[fd00::1]:8080"}) {
			t.Errorf("cluster %q", got)
		}
	})
}
