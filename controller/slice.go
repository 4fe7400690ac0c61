package controller

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Slice is an EndpointSlice as the proxy keeps it: its metadata, and its
// ports and endpoints parsed once, on arrival, down to what the
// translation reads. An EndpointSlice of 10 endpoints takes about 2.9 KiB
// as an API object and a quarter of that as a Slice, which is most of the
// agent's memory in a large cluster: the informers cache Slices (see
// TrimObject), and the Tracker keeps them.
//
// A Slice's Meta lets the informers' cache key it. Its Labels keep only
// those the proxy reads (headless, service-proxy-name);
// the Service's name and the trigger-time annotation are fields of their
// own (a map per slice costs more than its endpoints' addresses).
type Slice struct {
	Meta
	// Service is the kubernetes.io/service-name label ("": none).
	Service string
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation: when the Pod or Service change that produced this
	// version happened (zero: absent or unreadable).
	TriggerTime time.Time
	AddressType discoveryv1.AddressType
	Ports       []slicePort
	// Endpoints are those with a usable address of the slice's family
	// (the first address, as kube-proxy uses).
	Endpoints []SliceEndpoint
	// Reasons say what was skipped, for the slice's Problem.
	Reasons []string
}

// SliceEndpoint is one endpoint of a Slice, with the discovery/v1
// condition defaults applied exactly as kube-proxy does: ready and serving
// nil mean true, terminating nil means false. (The v1beta1 docs said
// serving nil defers to ready; v1 and kube-proxy say true. It only matters
// for a not-ready terminating endpoint without a serving field.)
type SliceEndpoint struct {
	// addr is the address in 16 bytes (IPv4 mapped, is4 set): a
	// netip.Addr takes 24, 8 of them a pointer for its zone, which an
	// endpoint address never has (parseAddr refuses one). A million
	// endpoints are 8 MB smaller and hold a million pointers fewer.
	addr                        [16]byte
	is4                         bool
	Ready, Serving, Terminating bool
	// NodeName is interned: a million endpoints share a few hundred
	// node names.
	NodeName unique.Handle[string]
	// Target identifies the targetRef's name (the pod), for weights.
	// Nearly every endpoint has one, and only a Service with a weights
	// annotation reads it: a hash keeps a million of them at 8 bytes each
	// instead of each pod's name.
	Target PodName
	// Extra holds what most endpoints lack (nil: none).
	Extra *SliceEndpointExtra
}

// SliceEndpointExtra is the rarer part of an endpoint.
type SliceEndpointExtra struct {
	// Zones and Nodes are the topology hints.
	Zones, Nodes []string
}

// PodName is a 64-bit hash of a pod's name (0: none), as a Slice keeps
// its endpoints' targetRefs. The hash is seeded per process: names from
// the annotation and from the slices are hashed alike, and a tenant
// cannot pick names that collide.
type PodName uint64

var podNameSeed = maphash.MakeSeed()

// PodNameOf hashes a pod's name ("": 0).
func PodNameOf(name string) PodName {
	if name == "" {
		return 0
	}
	return PodName(maphash.String(podNameSeed, name) | 1)
}

// noNode is the NodeName of an endpoint without one.
var noNode = unique.Make("")

// Addr is the endpoint's address.
func (e *SliceEndpoint) Addr() netip.Addr {
	a := netip.AddrFrom16(e.addr)
	if e.is4 {
		return a.Unmap()
	}
	return a
}

// Node is the endpoint's nodeName ("": none).
func (e *SliceEndpoint) Node() string { return e.NodeName.Value() }

func (e *SliceEndpoint) extra() *SliceEndpointExtra {
	if e.Extra == nil {
		e.Extra = &SliceEndpointExtra{}
	}
	return e.Extra
}

// proxyLabels keeps the labels the proxy reads of a slice (Config.selects).
func proxyLabels(l map[string]string) map[string]string {
	var out map[string]string
	for _, k := range []string{v1.IsHeadlessService, LabelServiceProxyName} {
		if v, ok := l[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// NewSlice parses an EndpointSlice. Only IPv4 and IPv6 slices carry
// endpoints (FQDN slices are for DNS, and other types are reported).
func NewSlice(s *discoveryv1.EndpointSlice) *Slice {
	out := &Slice{
		Meta:        newMeta(&s.ObjectMeta),
		Service:     s.Labels[discoveryv1.LabelServiceName],
		TriggerTime: triggerTime(s.Annotations),
		AddressType: s.AddressType,
	}
	fam, ok := addressFamily(s.AddressType)
	if !ok {
		return out
	}
	var reasons []string
	out.Ports, reasons = parseSlicePorts(s)
	out.Endpoints = make([]SliceEndpoint, 0, len(s.Endpoints))
	for i, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			reasons = append(reasons, fmt.Sprintf("endpoint %d has no address: skipped", i))
			continue
		}
		addr, err := parseAddr(e.Addresses[0])
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("endpoint %d: %v: skipped", i, err))
			continue
		}
		if familyIndex(addr) != fam {
			reasons = append(reasons, fmt.Sprintf("endpoint %d: address %s is not %s: skipped", i, addr, s.AddressType))
			continue
		}
		ep := SliceEndpoint{
			addr:        addr.As16(),
			is4:         addr.Is4(),
			Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			NodeName:    noNode,
		}
		if e.NodeName != nil {
			ep.NodeName = unique.Make(*e.NodeName)
		}
		if e.TargetRef != nil && e.TargetRef.Name != "" {
			ep.Target = PodNameOf(e.TargetRef.Name)
		}
		if h := e.Hints; h != nil {
			for _, z := range h.ForZones {
				ep.extra().Zones = append(ep.extra().Zones, z.Name)
			}
			for _, n := range h.ForNodes {
				ep.extra().Nodes = append(ep.extra().Nodes, n.Name)
			}
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	out.Reasons = reasons
	return out
}

// addressFamily is the family index (0 IPv4, 1 IPv6) of a slice's address
// type; false for FQDN and unknown types.
func addressFamily(t discoveryv1.AddressType) (int, bool) {
	switch t {
	case discoveryv1.AddressTypeIPv4:
		return 0, true
	case discoveryv1.AddressTypeIPv6:
		return 1, true
	}
	return 0, false
}
