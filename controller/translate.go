// Package controller turns Kubernetes objects (Services, EndpointSlices and
// this node's Node) into the backend-neutral model.State, following
// kube-proxy's semantics (docs/semantics.md §3.1-3.12).
//
// It has three parts:
//
//   - Translate, a pure function from objects to a State. It never fails:
//     input it cannot use is skipped and described by a Problem, and a bad
//     Service never affects another one.
//   - Tracker, which holds the current objects, collapses no-op updates and
//     rebuilds only the Services that changed, reusing the *ServicePort
//     pointers of the others so datapaths can skip them.
//   - FileSource, which feeds a Tracker from a directory of manifests (what
//     `kubectl apply -f` takes), through the same On*Add/Update/Delete
//     methods that client-go informer handlers call.
package controller

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xvs-lb/xvs/model"
)

// Translate computes the desired State from the given objects. node is this
// node's Node object, or nil. Problems are sorted; the State is new and
// shares nothing with a previous one (use a Tracker for incremental
// builds).
func Translate(cfg Config, services []*v1.Service, slices []*discoveryv1.EndpointSlice, node *v1.Node) (*model.State, []Problem) {
	e, probs := newEnv(&cfg, node)

	bySvc := make(map[types.NamespacedName][]*Slice)
	for _, api := range slices {
		s := NewSlice(api)
		k, ok := sliceService(s)
		if !ok {
			probs = append(probs, noServiceProblem(s))
			continue
		}
		bySvc[k] = append(bySvc[k], s)
	}

	latest := make(map[types.NamespacedName]*Service, len(services))
	for _, api := range services {
		svc := NewService(api)
		k := svc.Key()
		if _, dup := latest[k]; dup {
			probs = append(probs, serviceProblem(svc, "given twice: the last one is used"))
		}
		latest[k] = svc
	}

	st := e.newState(len(latest))
	cl := claims{}
	for k, svc := range latest {
		ports, p := e.service(svc, bySvc[k])
		probs = append(probs, p...)
		for _, sp := range ports {
			st.Services[sp.Name] = sp
			cl.add(sp, svc.Created, nil)
		}
	}
	// Contested frontends go to one claimant (collision.go).
	for name, sp := range st.Services {
		st.Services[name] = cl.served(sp)
	}
	for k := range cl {
		probs = append(probs, cl.problems(k)...)
	}
	sortProblems(probs)
	return st, probs
}

// sliceService returns the Service an EndpointSlice belongs to, from the
// kubernetes.io/service-name label (the only link kube-proxy uses).
func sliceService(s *Slice) (types.NamespacedName, bool) {
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Service}, s.Service != ""
}

func noServiceProblem(s *Slice) Problem {
	return sliceProblem(s, fmt.Sprintf("no %s label: slice ignored", discoveryv1.LabelServiceName))
}

func serviceProblem(svc *Service, reason string) Problem {
	return Problem{Kind: "Service", Object: svc.Namespace + "/" + svc.Name, Reason: reason}
}

// service translates one Service and its EndpointSlices into ServicePorts.
// Services kube-proxy does not program (ExternalName, headless, another
// proxy's) yield nothing and no Problem: they are not mistakes.
func (e *env) service(svc *Service, sl []*Slice) ([]*model.ServicePort, []Problem) {
	if !e.cfg.selects(svc.Labels) || svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil, nil
	}
	info, probs := e.parseService(svc)
	if info == nil {
		return nil, probs
	}
	eps, p := collectEndpoints(e.cfg, sl)
	probs = append(probs, p...)
	for _, fe := range eps {
		for f := range fe {
			info.weigh(fe[f])
		}
	}

	var out []*model.ServicePort
	seen := make(map[model.ServicePortName]bool, len(svc.Spec.Ports))
	frontends := 0
	for _, port := range svc.Spec.Ports {
		sp, reason := e.servicePort(info, port, eps)
		if reason == "" && seen[sp.Name] {
			reason = fmt.Sprintf("port %q/%s given twice: the first one is used", port.Name, sp.Name.Protocol)
		}
		if reason != "" {
			probs = append(probs, serviceProblem(svc, reason))
			continue
		}
		seen[sp.Name] = true
		frontends += len(sp.Frontends)
		out = append(out, sp)
	}
	if limit := e.cfg.MaxFrontendsPerService; limit > 0 && frontends > limit {
		return nil, append(probs, serviceProblem(svc, fmt.Sprintf(
			"%d frontends (%d ports on their addresses) exceed the limit of %d per Service (--max-frontends-per-service): Service not served",
			frontends, len(out), limit)))
	}
	return out, probs
}

// servicePort builds one ServicePort, or says why it cannot.
func (e *env) servicePort(info *svcInfo, port v1.ServicePort, eps map[slicePortKey]*familyEndpoints) (*model.ServicePort, string) {
	proto, err := model.ParseProtocol(string(port.Protocol))
	if err != nil {
		return nil, fmt.Sprintf("port %q: %v: port ignored", port.Name, err)
	}
	if port.Port < 1 || port.Port > 65535 || port.NodePort < 0 || port.NodePort > 65535 {
		return nil, fmt.Sprintf("port %q: port %d or nodePort %d out of range: port ignored", port.Name, port.Port, port.NodePort)
	}
	sp := &model.ServicePort{
		Name:                model.ServicePortName{Namespace: info.namespace, Name: info.name, Port: port.Name, Protocol: proto},
		Frontends:           info.frontends(uint16(port.Port), uint16(port.NodePort), proto, e.nodePortAddrs),
		InternalLocal:       info.internalLocal,
		ExternalLocal:       info.externalLocal,
		Affinity:            info.affinity,
		Scheduler:           info.scheduler,
		SourceRanges:        info.sourceRanges,
		HealthCheckNodePort: info.healthCheckNodePort,
	}
	fe := eps[slicePortKey{name: port.Name, proto: proto}]
	if fe == nil {
		fe = new(familyEndpoints)
	}
	// Each family is categorised on its own, as kube-proxy runs one proxier
	// per family: IPv4 terminating endpoints must not hide an IPv6
	// fallback, and IPv6 frontends only ever use IPv6 endpoints.
	for _, f := range info.families {
		// kube-proxy's ExternallyAccessible, UsesClusterEndpoints and
		// UsesLocalEndpoints: eTP=Local services still need the cluster
		// set for short-circuited pod and host traffic.
		accessible := port.NodePort != 0 || len(info.externalIPs[f]) > 0 || len(info.lbIPs[f]) > 0
		usesCluster := !info.internalLocal || accessible
		usesLocal := info.internalLocal || (info.externalLocal && accessible)
		c := categorize(fe[f], usesCluster, usesLocal, e.cfg.NodeName, e.node.Zone)
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, c.cluster...)
		sp.LocalEndpoints = append(sp.LocalEndpoints, c.local...)
		sp.HasEndpointsFamily[f] = c.hasAny
		sp.HasEndpoints = sp.HasEndpoints || c.hasAny
		sp.LocalReady += c.localReady
	}
	return sp, ""
}

// svcInfo is the per-Service part of the translation, shared by its ports.
// Per-family arrays are indexed by familyIndex.
type svcInfo struct {
	namespace, name string
	// families lists the families of spec.clusterIPs, primary first: a
	// family without a ClusterIP is not served at all (kube-proxy's
	// GetClusterIPByFamily), even for NodePorts.
	families    []int
	clusterIP   [2]netip.Addr
	externalIPs [2][]netip.Addr
	lbIPs       [2][]netip.Addr
	// lbWithheld is set when a loadBalancerSourceRanges entry is bad: the
	// LoadBalancer frontends are left out rather than served with a
	// firewall that is more open than the user asked for.
	lbWithheld   bool
	sourceRanges []netip.Prefix
	affinity     model.Affinity
	scheduler    string
	// weights are the weights annotation's, by address or pod name;
	// podWeights the same by PodNameOf.
	weights             map[string]uint16
	podWeights          map[PodName]uint16
	internalLocal       bool
	externalLocal       bool
	healthCheckNodePort uint16
}

// frontends lists the addresses a port is served on, by kind then family:
// ClusterIPs, NodePorts, externalIPs, LoadBalancer IPs. An address:port
// claimed twice (say, an externalIP that is also an LB IP) is served once,
// with the first kind: one datapath key cannot carry two behaviours.
func (info *svcInfo) frontends(port, nodePort uint16, proto model.Protocol, nodePortAddrs []netip.Addr) []model.Frontend {
	var out []model.Frontend
	seen := make(map[netip.AddrPort]bool)
	add := func(k model.FrontendKind, a netip.Addr, p uint16) {
		if ap := netip.AddrPortFrom(a, p); !seen[ap] {
			seen[ap] = true
			out = append(out, model.Frontend{Kind: k, Addr: a, Port: p, Proto: proto})
		}
	}
	for _, f := range info.families {
		add(model.ClusterIP, info.clusterIP[f], port)
	}
	if nodePort != 0 {
		for _, f := range info.families {
			for _, a := range nodePortAddrs {
				if familyIndex(a) == f {
					add(model.NodePort, a, nodePort)
				}
			}
		}
	}
	for _, f := range info.families {
		for _, a := range info.externalIPs[f] {
			add(model.ExternalIP, a, port)
		}
	}
	if !info.lbWithheld {
		for _, f := range info.families {
			for _, a := range info.lbIPs[f] {
				add(model.LoadBalancer, a, port)
			}
		}
	}
	return out
}

// trimmedPrefix parses a loadBalancerSourceRanges entry. Whitespace is
// tolerated (kube-proxy trims; its test fixtures have ' 203.0.113.0/25'),
// and host bits are cleared as ParseCIDRSloppy does.
func trimmedPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, err
	}
	return p.Masked(), nil
}
