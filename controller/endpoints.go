package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xvs-lb/xvs/model"
)

// endpoint is a model.Endpoint plus the topology hints it is categorised by.
type endpoint struct {
	model.Endpoint
	zoneHints []string
	nodeHints []string
	// target is the targetRef's name (the pod) as PodNameOf hashes it,
	// for weights.
	target PodName
}

// slicePortKey is how kube-proxy joins a ServicePort to EndpointSlice
// ports: by port name and protocol, never by number, so a named targetPort
// resolves to whatever number each slice (each set of pods) carries.
type slicePortKey struct {
	name  string
	proto model.Protocol
}

// familyEndpoints holds a Service's endpoints for one slice port, merged
// across its slices, split by address family (index as familyIndex).
type familyEndpoints [2][]endpoint

// maxReasons caps the reasons listed in one Problem, so that a slice with
// thousands of bad endpoints yields one readable line.
const maxReasons = 3

// collectEndpoints merges the endpoints of one Service's slices, as
// kube-proxy's EndpointSliceCache does: only IPv4/IPv6 slices count (FQDN
// slices are for DNS), only the first address of an endpoint is used, and
// endpoints are de-duplicated by IP:port within a slice port. Slices are
// visited in name order so the result does not depend on informer order.
func collectEndpoints(cfg *Config, sl []*Slice) (map[slicePortKey]*familyEndpoints, []Problem) {
	sl = slices.Clone(sl)
	slices.SortFunc(sl, func(a, b *Slice) int { return strings.Compare(a.Name, b.Name) })

	out := make(map[slicePortKey]*familyEndpoints)
	var probs []Problem
	for _, s := range sl {
		if !cfg.selects(s.Labels) {
			continue
		}
		fam, ok := addressFamily(s.AddressType)
		if !ok {
			// FQDN slices are for DNS; anything else is a mistake.
			if s.AddressType != discoveryv1.AddressTypeFQDN {
				probs = append(probs, sliceProblem(s, fmt.Sprintf("addressType %q is not IPv4 or IPv6: slice ignored", s.AddressType)))
			}
			continue
		}
		if len(s.Reasons) > 0 {
			probs = append(probs, sliceProblem(s, joinReasons(s.Reasons)))
		}
		for _, p := range s.Ports {
			fe := out[p.key]
			if fe == nil {
				fe = new(familyEndpoints)
				out[p.key] = fe
			}
			fe[fam] = slices.Grow(fe[fam], len(s.Endpoints))
			for i := range s.Endpoints {
				fe[fam] = append(fe[fam], sliceEndpoint(cfg, &s.Endpoints[i], p.port))
			}
		}
	}
	for _, fe := range out {
		for f := range fe {
			fe[f] = dedupe(fe[f])
		}
	}
	return out, probs
}

// dedupe sorts endpoints by address and port and keeps one of each as
// kube-proxy does: the first occurrence, except that a local copy wins
// ("isLocal should not vary between matching endpoints, but if it does,
// we favor true"). The sort is stable, so duplicates stay in the order the
// slices listed them; no index map is built (a Service's endpoints are
// merged at every change of it, and at every full sync for all of them).
func dedupe(eps []endpoint) []endpoint {
	slices.SortStableFunc(eps, func(a, b endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	out := eps[:0]
	for _, ep := range eps {
		if n := len(out); n > 0 && out[n-1].AddrPort() == ep.AddrPort() {
			if ep.Local {
				out[n-1] = ep
			}
			continue
		}
		out = append(out, ep)
	}
	return out
}

type slicePort struct {
	key  slicePortKey
	port uint16
}

// parseSlicePorts validates a slice's ports. kube-proxy ignores ports
// without a name (an unnamed ServicePort is matched by the name "") or
// without a number; we do the same but say so.
func parseSlicePorts(s *discoveryv1.EndpointSlice) ([]slicePort, []string) {
	var out []slicePort
	var reasons []string
	for i, p := range s.Ports {
		if p.Name == nil {
			reasons = append(reasons, fmt.Sprintf("port %d has no name (use \"\" for an unnamed Service port): ignored", i))
			continue
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			reasons = append(reasons, fmt.Sprintf("port %q has no valid number: ignored", *p.Name))
			continue
		}
		proto := model.TCP // API default
		if p.Protocol != nil {
			var err error
			if proto, err = model.ParseProtocol(string(*p.Protocol)); err != nil {
				reasons = append(reasons, fmt.Sprintf("port %q: %v: ignored", *p.Name, err))
				continue
			}
		}
		out = append(out, slicePort{key: slicePortKey{name: *p.Name, proto: proto}, port: uint16(*p.Port)})
	}
	return out, reasons
}

// sliceEndpoint is a Slice's endpoint on one of its ports, with this
// node's view of it: whether it is local.
func sliceEndpoint(cfg *Config, e *SliceEndpoint, port uint16) endpoint {
	out := endpoint{Endpoint: model.Endpoint{
		Addr:        e.Addr(),
		Port:        port,
		Local:       cfg.NodeName != "" && e.Node() == cfg.NodeName,
		Ready:       e.Ready,
		Serving:     e.Serving,
		Terminating: e.Terminating,
		Weight:      1,
	}, target: e.Target}
	if x := e.Extra; x != nil {
		out.zoneHints, out.nodeHints = x.Zones, x.Nodes
	}
	return out
}

func sliceProblem(s *Slice, reason string) Problem {
	return Problem{Kind: "EndpointSlice", Object: s.Namespace + "/" + s.Name, Reason: reason}
}

func joinReasons(reasons []string) string {
	if len(reasons) > maxReasons {
		more := len(reasons) - maxReasons
		reasons = append(reasons[:maxReasons:maxReasons], fmt.Sprintf("and %d more", more))
	}
	return strings.Join(reasons, "; ")
}

// parseAddr parses an IP address the way Kubernetes components do
// (netutils.ParseIPSloppy): IPv4 octets may carry leading zeros, which
// legacy API objects can still contain. IPv4-mapped IPv6 addresses become
// IPv4, and zoned IPv6 addresses are refused (they are not valid in the API).
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		var ok bool
		if a, ok = parseSloppyIPv4(s); !ok {
			return netip.Addr{}, fmt.Errorf("address %q does not parse", s)
		}
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("address %q has a zone", s)
	}
	return a.Unmap(), nil
}

func parseSloppyIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if p == "" || len(p) > 3 {
			return netip.Addr{}, false
		}
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return netip.Addr{}, false
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), true
}

// categorized is the outcome of categorize for one family of one port.
type categorized struct {
	cluster, local []model.Endpoint
	hasAny         bool
	localReady     int
}

// categorize is kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go,
// KEP-1669) for one address family of one ServicePort:
//
//   - cluster set: Ready endpoints passing the topology filter; if none,
//     every serving-and-terminating endpoint, ignoring topology;
//   - local set: local Ready endpoints; if none, local serving-terminating;
//   - hasAny: some Ready or serving-terminating endpoint exists anywhere.
//
// Each set is only computed when some policy uses it. eps must be sorted.
func categorize(eps []endpoint, usesCluster, usesLocal bool, nodeName, zone string) categorized {
	var c categorized
	for _, ep := range eps {
		if ep.Ready || (ep.Serving && ep.Terminating) {
			c.hasAny = true
		}
		if ep.Local && ep.Ready {
			c.localReady++
		}
	}
	if usesCluster {
		mode := topologyModeFromHints(eps, nodeName, zone)
		c.cluster = filterEndpoints(eps, func(ep endpoint) bool {
			return ep.Ready && mode.allows(ep, nodeName, zone)
		})
		if len(c.cluster) == 0 {
			// No Ready endpoint anywhere (the topology mode never selects
			// an empty set): fall back to serving-terminating ones.
			c.cluster = filterEndpoints(eps, func(ep endpoint) bool { return ep.Serving && ep.Terminating })
		}
	}
	if usesLocal {
		// The local set ignores topology.
		c.local = filterEndpoints(eps, func(ep endpoint) bool { return ep.Local && ep.Ready })
		if len(c.local) == 0 {
			c.local = filterEndpoints(eps, func(ep endpoint) bool { return ep.Local && ep.Serving && ep.Terminating })
		}
	}
	return c
}

func filterEndpoints(eps []endpoint, keep func(endpoint) bool) []model.Endpoint {
	var out []model.Endpoint
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep.Endpoint)
		}
	}
	return out
}

// topologyMode is the filter kube-proxy applies to Ready endpoints.
type topologyMode uint8

const (
	topologyNone topologyMode = iota
	topologySameZone
	topologySameNode
)

// topologyModeFromHints picks the topology filter from the hints of Ready
// endpoints (kube-proxy's topologyModeFromHints): PreferSameNode when every
// ready endpoint has node hints and one is for this node (feature gate
// PreferSameTrafficDistribution, on by default since v1.34); else
// PreferSameZone when every ready endpoint has zone hints and one is for
// our zone; else no filtering. One endpoint without a hint, or an empty
// zone label, therefore disables filtering: the hints were written for a
// different state of the Service and following them could overload a few
// endpoints or black-hole a zone.
func topologyModeFromHints(eps []endpoint, nodeName, zone string) topologyMode {
	allNode, forNode := true, false
	allZone, forZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		if len(ep.nodeHints) == 0 {
			allNode = false
		} else if nodeName != "" && slices.Contains(ep.nodeHints, nodeName) {
			forNode = true
		}
		if len(ep.zoneHints) == 0 {
			allZone = false
		} else if zone != "" && slices.Contains(ep.zoneHints, zone) {
			forZone = true
		}
	}
	switch {
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

func (m topologyMode) allows(ep endpoint, nodeName, zone string) bool {
	switch m {
	case topologySameNode:
		return slices.Contains(ep.nodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(ep.zoneHints, zone)
	}
	return true
}
