package agent

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/xvs-lb/xvs/model"
)

// TestStateSummaryFollowsDeltas: a summary brought forward through States'
// deltas equals one counted from scratch.
func TestStateSummaryFollowsDeltas(t *testing.T) {
	port := func(name, vip string, etpLocal bool, hc uint16, local ...string) *model.ServicePort {
		sp := &model.ServicePort{
			Name:                model.ServicePortName{Namespace: "ns", Name: name, Protocol: model.TCP},
			Frontends:           []model.Frontend{{Kind: model.LoadBalancer, Addr: netip.MustParseAddr(vip), Port: 80, Proto: model.TCP}},
			ExternalLocal:       etpLocal,
			HealthCheckNodePort: hc,
			HasEndpoints:        true,
			HasEndpointsFamily:  [2]bool{true, true},
		}
		for _, a := range local {
			sp.LocalEndpoints = append(sp.LocalEndpoints, model.Endpoint{Addr: netip.MustParseAddr(a), Port: 8080, Ready: true, Local: true})
		}
		return sp
	}
	a := port("a", "192.0.2.1", true, 30001)
	b := port("b", "2001:db8::1", true, 30002, "10.0.0.1", "10.0.0.2")
	c := port("c", "192.0.2.3", false, 0)
	states := []*model.State{
		{Generation: 1, Services: map[model.ServicePortName]*model.ServicePort{a.Name: a, b.Name: b}},
		{Generation: 2, Services: map[model.ServicePortName]*model.ServicePort{a.Name: a, b.Name: port("b", "2001:db8::1", true, 30002, "10.0.0.1"), c.Name: c},
			Delta: &model.Delta{Since: 1, Names: []model.ServicePortName{b.Name, c.Name}, Old: []*model.ServicePort{b, nil}}},
		{Generation: 3, Services: map[model.ServicePortName]*model.ServicePort{c.Name: c},
			Delta: &model.Delta{Since: 2, Names: []model.ServicePortName{a.Name, b.Name}}},
	}
	states[2].Delta.Old = []*model.ServicePort{a, states[1].Services[b.Name]}
	s := stateSummary{names: newFrontendNames(), pub: newServicesPublisher(nil, "")}
	for i, st := range states {
		s.update(st)
		fresh := stateSummary{names: newFrontendNames(), pub: newServicesPublisher(nil, "")}
		fresh.update(&model.State{Services: st.Services})
		if !reflect.DeepEqual(s.pub.ports, fresh.pub.ports) {
			t.Errorf("state %d: published ports through deltas %v, counted %v", i+1, s.pub.ports, fresh.pub.ports)
		}
		if s.frontends != fresh.frontends || !reflect.DeepEqual(s.healthCheckServices(), fresh.healthCheckServices()) {
			t.Errorf("state %d: through deltas %+v %v, counted %+v %v", i+1, s.frontends, s.healthCheckServices(), fresh.frontends, fresh.healthCheckServices())
		}
		if !reflect.DeepEqual(s.names.by, fresh.names.by) {
			t.Errorf("state %d: frontend names through deltas %v, counted %v", i+1, s.names.by, fresh.names.by)
		}
		for k, n := range fresh.noLocal {
			if s.noLocal[k] != n {
				t.Errorf("state %d: no-local %v: %d through deltas, %d counted", i+1, k, s.noLocal[k], n)
			}
		}
	}
	if got := s.noLocal[[2]string{"external", "IPv4"}]; got != 0 {
		t.Errorf("last state has no eTP=Local port, no-local count %d", got)
	}
	// Dual-stack eTP=Local with a local IPv4 endpoint and only remote IPv6
	// ones: no local endpoint for IPv6 (kube-proxy's per-family proxiers).
	ds := port("ds", "192.0.2.9", true, 0, "10.0.0.9")
	var d stateSummary
	d.update(&model.State{Services: map[model.ServicePortName]*model.ServicePort{ds.Name: ds}})
	if d.noLocal[[2]string{"external", "IPv6"}] != 1 || d.noLocal[[2]string{"external", "IPv4"}] != 0 {
		t.Errorf("dual-stack no-local counts %v, want IPv6 only", d.noLocal)
	}

	s.update(states[1]) // not a successor of state 3: counted again
	if s.frontends != [2]int{2, 1} || len(s.hcPorts) != 2 {
		t.Errorf("recount: frontends %v, health-checked ports %d", s.frontends, len(s.hcPorts))
	}
}

// TestFrontendNames: a frontend is named after its ServicePort, and after
// the first by name order when two claim it (the one both datapaths give
// it to); when that one goes, the other takes the name.
func TestFrontendNames(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.20")
	sp := func(ns, name string, kind model.FrontendKind) *model.ServicePort {
		return &model.ServicePort{Name: model.ServicePortName{Namespace: ns, Name: name, Port: "http", Protocol: model.TCP},
			Frontends: []model.Frontend{{Kind: kind, Addr: vip, Port: 80, Proto: model.TCP}}}
	}
	b, a := sp("b", "web", model.ClusterIP), sp("a", "hijack", model.ExternalIP)
	n := newFrontendNames()
	n.count(b, 1)
	n.count(a, 1)
	key := netip.AddrPortFrom(vip, 80)
	if o, ok := n.owner("TCP", key); !ok || o.name != a.Name || o.kind != model.ExternalIP {
		t.Errorf("owner of a frontend claimed twice: %+v %v, want %v as ExternalIP", o, ok, a.Name)
	}
	if _, ok := n.owner("UDP", key); ok {
		t.Error("the UDP frontend of the same address:port is named")
	}
	n.count(a, -1)
	if o, ok := n.owner("TCP", key); !ok || o.name != b.Name || o.kind != model.ClusterIP {
		t.Errorf("after the first claimant left: %+v %v, want %v", o, ok, b.Name)
	}
	n.count(b, -1)
	if _, ok := n.owner("TCP", key); ok || len(n.by) != 0 {
		t.Errorf("frontend still named after both left: %v", n.by)
	}
}
