package agent

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/xvs-lb/xvs/healthcheck"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/model"
)

// stateSummary is what the sync loop reports about a State besides
// programming it: the address families of its frontends, the ports with a
// Local policy and no local endpoint, and the eTP=Local ports with a
// health check node port. It follows the States' deltas, so that a sync
// that changed one Service costs O(1) here too, not O(Services).
type stateSummary struct {
	last      *model.State
	frontends [2]int            // by family: IPv4, IPv6
	noLocal   map[[2]string]int // by (policy, family)
	hcPorts   map[model.ServicePortName]*model.ServicePort
	// names, when set, follows the frontends' owners for the per-Service
	// metrics, which read it beside the sync loop (under its lock).
	names *frontendNames
	// pub, when set, follows the ports for the Services file (under its
	// lock; publish.go).
	pub *servicesPublisher
}

// update brings the summary to st: through st's delta when it starts at
// the State summarised last (the previous values come from the delta: the
// previous State's map may be st's, updated in place), else by counting
// every ServicePort.
func (s *stateSummary) update(st *model.State) {
	if s.names != nil {
		s.names.mu.Lock()
		defer s.names.mu.Unlock()
	}
	if s.pub != nil {
		s.pub.mu.Lock()
		defer s.pub.mu.Unlock()
	}
	switch d := st.Delta; {
	case s.last != nil && st.Generation != 0 && st.Generation == s.last.Generation:
	case s.last != nil && s.last.Generation != 0 && d != nil && d.Since == s.last.Generation && len(d.Old) == len(d.Names):
		for i, name := range d.Names {
			if d.Old[i] != nil {
				s.count(d.Old[i], -1)
			}
			if sp := st.Services[name]; sp != nil {
				s.count(sp, 1)
			}
		}
	default:
		*s = stateSummary{noLocal: map[[2]string]int{}, hcPorts: map[model.ServicePortName]*model.ServicePort{}, names: s.names, pub: s.pub}
		if s.names != nil {
			s.names.reset()
		}
		if s.pub != nil {
			s.pub.reset()
		}
		for _, sp := range st.Services {
			s.count(sp, 1)
		}
	}
	s.last = st
}

// count adds (by = 1) or takes away (by = -1) one ServicePort.
func (s *stateSummary) count(sp *model.ServicePort, by int) {
	if s.names != nil {
		s.names.count(sp, by)
	}
	if s.pub != nil {
		s.pub.count(sp, by)
	}
	for _, f := range sp.Frontends {
		s.frontends[familyIndex(f.Addr)] += by
	}
	// kubeproxy_sync_proxy_rules_no_local_endpoints_total counts the
	// ports with a Local policy whose endpoints of a family are all
	// elsewhere, per family as kube-proxy's per-family proxiers do.
	var local [2]bool
	for _, e := range sp.LocalEndpoints {
		local[familyIndex(e.Addr)] = true
	}
	for i, fam := range []string{xmetrics.IPv4, xmetrics.IPv6} {
		if local[i] || !sp.HasEndpointsFamily[i] && !(sp.HasEndpointsFamily == [2]bool{} && sp.HasEndpoints && i == 0) {
			continue
		}
		if sp.InternalLocal {
			s.noLocal[[2]string{"internal", fam}] += by
		}
		if sp.ExternalLocal {
			s.noLocal[[2]string{"external", fam}] += by
		}
	}
	if sp.ExternalLocal && sp.HealthCheckNodePort != 0 {
		if by > 0 {
			s.hcPorts[sp.Name] = sp
		} else if s.hcPorts[sp.Name] == sp {
			delete(s.hcPorts, sp.Name)
		}
	}
}

func familyIndex(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 0
	}
	return 1
}

// healthCheckServices picks the eTP=Local Services with a
// healthCheckNodePort and counts their local Ready endpoints by IP over
// all ports (kube-proxy's LocalReadyEndpoints: 10.0.0.1:80 and
// 10.0.0.1:443 are one endpoint). Terminating endpoints never count.
func (s *stateSummary) healthCheckServices() map[types.NamespacedName]healthcheck.Service {
	out := map[types.NamespacedName]healthcheck.Service{}
	ips := map[types.NamespacedName]map[netip.Addr]bool{}
	for _, sp := range s.hcPorts {
		k := types.NamespacedName{Namespace: sp.Name.Namespace, Name: sp.Name.Name}
		if ips[k] == nil {
			ips[k] = map[netip.Addr]bool{}
		}
		for _, e := range sp.LocalEndpoints {
			if e.Ready {
				ips[k][e.Addr] = true
			}
		}
		out[k] = healthcheck.Service{Port: sp.HealthCheckNodePort, LocalEndpoints: len(ips[k])}
	}
	return out
}
