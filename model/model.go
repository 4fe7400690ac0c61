// Package model is the backend-neutral desired state of the proxy: what every
// Service port should look like on this node, after Kubernetes semantics
// (policies, endpoint conditions, topology) have been applied.
//
// The controller computes a State from Services, EndpointSlices and the Node;
// a Datapath (BPF maps, or IPVS) realises it. Nothing here knows about either
// side. A *ServicePort never changes once built: the controller reuses the
// pointers of services that did not change, so a datapath can detect
// unchanged services by pointer. A State's Services map belongs to its
// producer, which may update it in place for the next State (see Delta).
package model

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// Protocol is an IP protocol number, as in the IP header.
type Protocol uint8

const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ParseProtocol accepts Kubernetes' spelling (TCP, UDP, SCTP); empty means TCP,
// as the API server defaults it.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q", s)
}

// FrontendKind says how a frontend address came to be: it decides which
// traffic policy applies (internalTrafficPolicy for ClusterIP, external for
// the rest) and whether loadBalancerSourceRanges filter it.
type FrontendKind uint8

const (
	ClusterIP FrontendKind = iota + 1
	NodePort
	ExternalIP
	LoadBalancer
)

func (k FrontendKind) String() string {
	switch k {
	case ClusterIP:
		return "ClusterIP"
	case NodePort:
		return "NodePort"
	case ExternalIP:
		return "ExternalIP"
	case LoadBalancer:
		return "LoadBalancer"
	}
	return fmt.Sprintf("kind-%d", uint8(k))
}

// External reports whether externalTrafficPolicy governs this kind.
func (k FrontendKind) External() bool { return k != ClusterIP }

// ServicePortName identifies one port of one Service, as kube-proxy's
// proxy.ServicePortName does: namespace, name, the port's name, protocol.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string
	Protocol  Protocol
}

// Compare orders names by namespace, name, port name and protocol. Both
// datapaths resolve a frontend claimed by two ServicePorts in this order
// (the first keeps it), so that the winner does not depend on the mode.
func (n ServicePortName) Compare(o ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, o.Namespace), cmp.Compare(n.Name, o.Name),
		cmp.Compare(n.Port, o.Port), cmp.Compare(n.Protocol, o.Protocol))
}

func (n ServicePortName) String() string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s + "/" + n.Protocol.String()
}

// Frontend is one address:port:protocol on which the node answers for a
// ServicePort: an IPVS virtual server.
type Frontend struct {
	Kind  FrontendKind
	Addr  netip.Addr
	Port  uint16
	Proto Protocol
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s %s", f.Proto, netip.AddrPortFrom(f.Addr, f.Port))
}

// Endpoint is one backend address:port of a ServicePort (targetPort already
// resolved for named ports).
type Endpoint struct {
	Addr netip.Addr
	Port uint16
	// Local is true when the endpoint's nodeName is this node.
	Local bool
	// Ready, Serving, Terminating are the EndpointSlice conditions with the
	// discovery/v1 API defaults applied, as kube-proxy does: ready and
	// serving default to true, terminating to false.
	Ready       bool
	Serving     bool
	Terminating bool
	// Weight is the scheduler weight (1 unless annotated); see
	// SchedWeight.
	Weight uint16
}

// SchedWeight is the weight a scheduler gives e: its Weight, and 1 for an
// endpoint without one (a zero weight would take it out of every weighted
// scheduler, which kube-proxy never does).
func (e Endpoint) SchedWeight() uint16 { return max(e.Weight, 1) }

func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

func (e Endpoint) String() string { return e.AddrPort().String() }

// Affinity is sessionAffinity: ClientIP. A zero value means no affinity.
type Affinity struct {
	ClientIP bool
	// TimeoutSeconds is sessionAffinityConfig.clientIP.timeoutSeconds
	// (default 10800, valid 1..86400).
	TimeoutSeconds uint32
}

// ServicePort is the desired state of one Service port on this node.
type ServicePort struct {
	Name ServicePortName
	// Frontends lists every address the port is served on: ClusterIPs,
	// NodePort addresses, externalIPs and LoadBalancer ingress IPs.
	Frontends []Frontend

	// ClusterEndpoints is the "cluster" set of KEP-1669 (ready endpoints
	// after topology filtering, else serving-terminating ones). It is
	// computed when some traffic uses Cluster policy, including eTP=Local
	// services whose pod/host traffic short-circuits to it.
	ClusterEndpoints []Endpoint
	// LocalEndpoints is the "local" set (local ready, else local
	// serving-terminating), computed when some policy is Local.
	LocalEndpoints []Endpoint

	// InternalLocal is internalTrafficPolicy: Local (ClusterIP frontends).
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy: Local (all other frontends).
	ExternalLocal bool
	// HasEndpoints is true when some ready or serving-terminating endpoint
	// exists anywhere: with none, traffic is REJECTed; with some but an
	// empty policy set, it is DROPped.
	HasEndpoints bool
	// HasEndpointsFamily is HasEndpoints per address family (index 0 IPv4,
	// 1 IPv6). kube-proxy runs one proxier per family, so the IPv6
	// frontends of a dual-stack port REJECT when only IPv4 endpoints
	// exist. Use HasEndpointsFor.
	HasEndpointsFamily [2]bool

	Affinity Affinity
	// Scheduler is the IPVS scheduler name in effect ("" = random).
	Scheduler string
	// SourceRanges is loadBalancerSourceRanges; applies to LoadBalancer
	// frontends only, and per family: see SourceRangesFor.
	SourceRanges []netip.Prefix
	// HealthCheckNodePort is spec.healthCheckNodePort (eTP=Local only).
	HealthCheckNodePort uint16
	// LocalReady counts local Ready endpoints (for the health check server;
	// terminating endpoints never count).
	LocalReady int
}

// LocalPolicy reports whether frontends of kind k obey a Local traffic
// policy: internalTrafficPolicy for the ClusterIP, externalTrafficPolicy
// for every other kind.
func (sp *ServicePort) LocalPolicy(k FrontendKind) bool {
	if k == ClusterIP {
		return sp.InternalLocal
	}
	return k.External() && sp.ExternalLocal
}

// ShortCircuits reports whether in-cluster clients (pods, and the node
// itself) of a frontend of kind k bypass its Local policy and use the
// cluster-wide endpoints, as kube-proxy short-circuits them: the external
// frontends of an externalTrafficPolicy: Local Service.
func (sp *ServicePort) ShortCircuits(k FrontendKind) bool {
	return k.External() && sp.ExternalLocal
}

// EndpointsFor returns the endpoint set a frontend of the given kind uses
// for traffic that is subject to the traffic policy. For a dual-stack port
// the set holds both families; EndpointsForFrontend narrows it.
func (sp *ServicePort) EndpointsFor(k FrontendKind) []Endpoint {
	if sp.LocalPolicy(k) {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// EndpointsForFrontend is EndpointsFor(f.Kind) restricted to f's address
// family: kube-proxy never translates between IPv4 and IPv6.
func (sp *ServicePort) EndpointsForFrontend(f Frontend) []Endpoint {
	eps := sp.EndpointsFor(f.Kind)
	for i, e := range eps {
		if e.Addr.Is4() != f.Addr.Is4() {
			// Mixed families: copy the matching ones (rare, dual-stack only).
			out := append([]Endpoint(nil), eps[:i]...)
			for _, e := range eps[i+1:] {
				if e.Addr.Is4() == f.Addr.Is4() {
					out = append(out, e)
				}
			}
			return out
		}
	}
	return eps
}

// HasEndpointsFor reports HasEndpoints for the family of addr (a frontend
// address). A State built by hand that only sets HasEndpoints behaves as if
// both families had endpoints.
func (sp *ServicePort) HasEndpointsFor(addr netip.Addr) bool {
	if sp.HasEndpointsFamily == [2]bool{} {
		return sp.HasEndpoints
	}
	if addr.Is4() {
		return sp.HasEndpointsFamily[0]
	}
	return sp.HasEndpointsFamily[1]
}

// SourceRangesFor returns the loadBalancerSourceRanges that filter traffic
// to the LoadBalancer address addr: those of addr's family. As in
// kube-proxy (one proxier per family), a family without ranges is not
// filtered even when the other family has some.
func (sp *ServicePort) SourceRangesFor(addr netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range sp.SourceRanges {
		if p.Addr().Is4() == addr.Is4() {
			out = append(out, p)
		}
	}
	return out
}

// Node is what the proxy needs to know about its own node.
type Node struct {
	Name string
	// Addresses are the node's own addresses; the first of each family is
	// the primary one (InternalIP).
	Addresses []netip.Addr
	Labels    map[string]string
	Zone      string
}

// State is the complete desired state handed to a Datapath.
type State struct {
	Node Node
	// Services maps every programmed ServicePort to its desired state.
	Services map[ServicePortName]*ServicePort
	// ServiceCIDRs are the cluster's service ranges (for the "unallocated
	// service IP" DROP rule).
	ServiceCIDRs []netip.Prefix
	// PodCIDRs drive local-traffic detection (clusterCIDR).
	PodCIDRs []netip.Prefix
	// MasqueradeAll is masqueradeAll.
	MasqueradeAll bool

	// Generation numbers the States one producer hands out (0: not
	// numbered, as for a State built by hand).
	Generation uint64
	// Delta, when set, names every ServicePort that was added, replaced
	// or removed since the State numbered Delta.Since, so that a Datapath
	// which applied that State can apply this one in O(changed) instead of
	// comparing every ServicePort. Node-wide fields are not covered: a
	// Datapath compares those itself.
	//
	// A numbered State's Services map may be the previous State's, updated
	// in place: read a State's map only until the producer's next one, and
	// take the previous values from the Delta.
	Delta *Delta
}

// Delta is the difference between two numbered States of one producer.
type Delta struct {
	Since uint64
	Names []ServicePortName
	// Old holds, for each of Names, the ServicePort the State numbered
	// Since had (nil: added).
	Old []*ServicePort
}

// ChangedSince returns the names of the ServicePorts that may differ from
// the State numbered gen, and whether the State can say so: false means
// the caller must compare every ServicePort.
func (st *State) ChangedSince(gen uint64) ([]ServicePortName, bool) {
	switch {
	case st.Generation == 0 || gen == 0:
		return nil, false
	case st.Generation == gen:
		return nil, true
	case st.Delta != nil && st.Delta.Since == gen:
		return st.Delta.Names, true
	}
	return nil, false
}

// Datapath realises a State. Implementations: the BPF maps (reconcile.Datapath)
// and kernel IPVS (ipvs.Datapath).
type Datapath interface {
	// Sync makes the datapath match st. It may be called with the same
	// State again after an error; it must be safe to retry.
	Sync(ctx context.Context, st *State) error
	// Mode names the datapath, as /proxyMode reports it.
	Mode() string
}
