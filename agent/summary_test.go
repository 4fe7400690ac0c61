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
	var s stateSummary
	for i, st := range states {
		s.update(st)
		var fresh stateSummary
		fresh.update(&model.State{Services: st.Services})
		if s.frontends != fresh.frontends || !reflect.DeepEqual(s.healthCheckServices(), fresh.healthCheckServices()) {
			t.Errorf("state %d: through deltas %+v %v, counted %+v %v", i+1, s.frontends, s.healthCheckServices(), fresh.frontends, fresh.healthCheckServices())
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
