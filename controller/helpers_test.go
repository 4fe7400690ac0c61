package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xvs-lb/xvs/model"
)

// Builders for test objects. Defaults: namespace "ns", a ClusterIP Service
// 10.96.0.1 with one TCP port "http" 80 -> targetPort "http".

const (
	testNode = "node-a"
	testZone = "zone-a"
)

func testConfig() Config {
	return Config{NodeName: testNode}
}

func testNodeObj(labels map[string]string, addrs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: labels}}
	for _, a := range addrs {
		typ := v1.NodeInternalIP
		if ext, ok := strings.CutPrefix(a, "ext:"); ok {
			typ, a = v1.NodeExternalIP, ext
		}
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: typ, Address: a})
	}
	return n
}

func zoneLabels(zone string) map[string]string {
	return map[string]string{v1.LabelTopologyZone: zone}
}

type svcOpt func(*v1.Service)

func newSvc(name string, opts ...svcOpt) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.1",
			ClusterIPs: []string{"10.96.0.1"},
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
			}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func clusterIPs(ips ...string) svcOpt {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ips[0]
	}
}

func svcType(t v1.ServiceType) svcOpt { return func(s *v1.Service) { s.Spec.Type = t } }

func nodePort(n int32) svcOpt {
	return func(s *v1.Service) {
		if s.Spec.Type == v1.ServiceTypeClusterIP {
			s.Spec.Type = v1.ServiceTypeNodePort
		}
		s.Spec.Ports[0].NodePort = n
	}
}

func etpLocal(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }

func itpLocal(s *v1.Service) {
	p := v1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &p
}

func externalIPs(ips ...string) svcOpt { return func(s *v1.Service) { s.Spec.ExternalIPs = ips } }

// lbIngress adds an ingress IP; mode "" leaves ipMode unset.
func lbIngress(ip string, mode v1.LoadBalancerIPMode) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		ing := v1.LoadBalancerIngress{IP: ip}
		if mode != "" {
			ing.IPMode = &mode
		}
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
	}
}

func sourceRanges(r ...string) svcOpt {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = r }
}

func svcLabel(k, v string) svcOpt {
	return func(s *v1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
}

func svcAnnotation(k, v string) svcOpt {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func ports(ps ...v1.ServicePort) svcOpt { return func(s *v1.Service) { s.Spec.Ports = ps } }

func newSlice(svc, name string, at discoveryv1.AddressType, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name},
		AddressType: at,
		Ports:       ps,
		Endpoints:   eps,
	}
	if svc != "" {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	return s
}

// v4Slice is the common case: one IPv4 slice named svc-1 whose port "http"
// is 8080.
func v4Slice(svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return newSlice(svc, svc+"-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePortOf("http", 8080)}, eps...)
}

func slicePortOf(name string, n int32) discoveryv1.EndpointPort {
	tcp := v1.ProtocolTCP
	return discoveryv1.EndpointPort{Name: &name, Port: &n, Protocol: &tcp}
}

type epOpt func(*discoveryv1.Endpoint)

func newEP(addr string, opts ...epOpt) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func ptr[T any](v T) *T { return &v }

func local(e *discoveryv1.Endpoint) { e.NodeName = ptr(testNode) }
func onNode(n string) epOpt         { return func(e *discoveryv1.Endpoint) { e.NodeName = &n } }
func ready(b bool) epOpt            { return func(e *discoveryv1.Endpoint) { e.Conditions.Ready = &b } }
func serving(b bool) epOpt          { return func(e *discoveryv1.Endpoint) { e.Conditions.Serving = &b } }
func terminating(b bool) epOpt {
	return func(e *discoveryv1.Endpoint) { e.Conditions.Terminating = &b }
}
func conds(r, s, t bool) epOpt {
	return func(e *discoveryv1.Endpoint) { ready(r)(e); serving(s)(e); terminating(t)(e) }
}
func servingTerminating(e *discoveryv1.Endpoint) { conds(false, true, true)(e) }

func zoneHints(zones ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func nodeHints(nodes ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// Rendering helpers, so expectations read like kube-proxy test tables.

func epStrings(eps []model.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}

func feStrings(fes []model.Frontend) []string {
	var out []string
	for _, f := range fes {
		out = append(out, fmt.Sprintf("%s %s", f.Kind, netip.AddrPortFrom(f.Addr, f.Port)))
	}
	return out
}

func problemStrings(ps []Problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// translateOne runs Translate and returns the only ServicePort of the
// Service "ns/svc" with port "http"/TCP (nil if not programmed).
func translateOne(t *testing.T, cfg Config, node *v1.Node, svc *v1.Service, sl ...*discoveryv1.EndpointSlice) (*model.ServicePort, []Problem) {
	t.Helper()
	st, probs := Translate(cfg, []*v1.Service{svc}, sl, node)
	key := model.ServicePortName{Namespace: "ns", Name: svc.Name, Port: "http", Protocol: model.TCP}
	return st.Services[key], probs
}

func equalStrings(a, b []string) bool { return slices.Equal(a, b) }

func hasProblem(ps []Problem, substr string) bool {
	for _, p := range ps {
		if strings.Contains(p.String(), substr) {
			return true
		}
	}
	return false
}
