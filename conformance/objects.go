package conformance

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"
)

// objectSet is the set of objects that exist at one point of a scenario,
// matched by kind/namespace/name like `kubectl apply`. Order of first
// appearance is kept so the files the agent reads are stable.
type objectSet struct {
	order []objKey
	raw   map[objKey]json.RawMessage
}

func newObjectSet() *objectSet { return &objectSet{raw: map[objKey]json.RawMessage{}} }

func (o *objectSet) apply(objs []json.RawMessage) error {
	for _, raw := range objs {
		k, err := keyOf(raw)
		if err != nil {
			return err
		}
		if _, ok := o.raw[k]; !ok {
			o.order = append(o.order, k)
		}
		o.raw[k] = raw
	}
	return nil
}

func (o *objectSet) delete(refs []ObjectRef) {
	for _, r := range refs {
		k := r.key()
		delete(o.raw, k)
		o.order = slices.DeleteFunc(o.order, func(x objKey) bool { return x == k })
	}
}

func (o *objectSet) has(k objKey) bool { _, ok := o.raw[k]; return ok }

// services and slices decode the typed objects; an object that does not
// decode is skipped here (the agent reports it the same way it would
// report a bad manifest).
func (o *objectSet) services() []*v1.Service {
	var out []*v1.Service
	for _, k := range o.order {
		if k.Kind != "Service" {
			continue
		}
		var s v1.Service
		if json.Unmarshal(o.raw[k], &s) == nil {
			out = append(out, &s)
		}
	}
	return out
}

func (o *objectSet) slices() []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, k := range o.order {
		if k.Kind != "EndpointSlice" {
			continue
		}
		var s discoveryv1.EndpointSlice
		if json.Unmarshal(o.raw[k], &s) == nil {
			out = append(out, &s)
		}
	}
	return out
}

// fileName is the manifest file of one object in the agent's directory.
func (k objKey) fileName() string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
				return r
			}
			return '_'
		}, strings.ToLower(s))
	}
	return fmt.Sprintf("obj-%s-%s-%s.yaml", clean(k.Kind), clean(k.Namespace), clean(k.Name))
}

// manifest renders one object as YAML, as `kubectl apply -f` takes it.
func (o *objectSet) manifest(k objKey) ([]byte, error) {
	return yaml.JSONToYAML(o.raw[k])
}

// endpointInfo is one endpoint address of any slice of the scenario.
type endpointInfo struct {
	addr  netip.Addr
	local bool
	ports []portProto // the slice's ports
}

type portProto struct {
	port  uint16
	proto string // TCP, UDP, SCTP
}

// collectEndpoints gathers every endpoint address that appears in any
// EndpointSlice, in objects or in any step's apply: pods exist for the
// whole scenario and only their endpoint records change, as in a cluster.
// An address first seen local stays local.
func collectEndpoints(s *Scenario) []*endpointInfo {
	var out []*endpointInfo
	byAddr := map[netip.Addr]*endpointInfo{}
	add := func(raws []json.RawMessage) {
		for _, raw := range raws {
			k, err := keyOf(raw)
			if err != nil || k.Kind != "EndpointSlice" {
				continue
			}
			var sl discoveryv1.EndpointSlice
			if json.Unmarshal(raw, &sl) != nil {
				continue
			}
			if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
				continue // FQDN slices are not served by the proxy, nor by us
			}
			var ports []portProto
			for _, p := range sl.Ports {
				if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
					continue
				}
				proto := "TCP"
				if p.Protocol != nil && *p.Protocol != "" {
					proto = string(*p.Protocol)
				}
				ports = append(ports, portProto{uint16(*p.Port), proto})
			}
			for _, ep := range sl.Endpoints {
				local := ep.NodeName != nil && *ep.NodeName == s.Node.Name
				for _, as := range ep.Addresses {
					a, err := netip.ParseAddr(strings.TrimSpace(as))
					if err != nil {
						continue
					}
					a = a.Unmap()
					e := byAddr[a]
					if e == nil {
						e = &endpointInfo{addr: a, local: local}
						byAddr[a] = e
						out = append(out, e)
					}
					for _, p := range ports {
						if !slices.Contains(e.ports, p) {
							e.ports = append(e.ports, p)
						}
					}
				}
			}
		}
	}
	add(s.Objects)
	for _, st := range s.Steps {
		add(st.Apply)
	}
	return out
}

// affinityFor reports whether `to` (protocol proto) is a frontend of a
// Service with ClientIP session affinity among the objects that exist:
// its ClusterIPs, externalIPs and LB ingress IPs on the port, or a node
// address (or loopback) on the nodePort.
func affinityFor(svcs []*v1.Service, nodeAddrs []netip.Addr, to netip.AddrPort, proto string) bool {
	ip := to.Addr().String()
	isNode := slices.Contains(nodeAddrs, to.Addr()) || to.Addr().IsLoopback()
	for _, svc := range svcs {
		if svc.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
			continue
		}
		var vips []string
		vips = append(vips, svc.Spec.ClusterIP)
		vips = append(vips, svc.Spec.ClusterIPs...)
		vips = append(vips, svc.Spec.ExternalIPs...)
		for _, in := range svc.Status.LoadBalancer.Ingress {
			vips = append(vips, in.IP)
		}
		for _, p := range svc.Spec.Ports {
			pp := string(p.Protocol)
			if pp == "" {
				pp = "TCP"
			}
			if pp != proto {
				continue
			}
			if int(to.Port()) == int(p.Port) && slices.ContainsFunc(vips, func(v string) bool {
				a, err := netip.ParseAddr(strings.TrimSpace(v))
				return err == nil && a.Unmap().String() == ip
			}) {
				return true
			}
			if isNode && p.NodePort != 0 && int(to.Port()) == int(p.NodePort) {
				return true
			}
		}
	}
	return false
}
