package controller

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The file source's objects never pass through an API server, so nothing
// has defaulted them: a hand-written Service without a port protocol, or
// an EndpointSlice port without a name, would otherwise mean something
// else here than the same manifest applied with kubectl. applyAPIDefaults
// sets what the API server sets when it stores the object (the core/v1
// and discovery/v1 defaulting, and the Service registry's clusterIP /
// clusterIPs normalisation) for the kinds the file source reads.
// Allocations (a clusterIP, a nodePort, a healthCheckNodePort) are not
// defaults: a manifest without them stays without them, and the
// translation reports it. TestFileDefaultsMatchAPIServer compares the
// result with a real kube-apiserver's.
func applyAPIDefaults(obj any) {
	switch o := obj.(type) {
	case *v1.Service:
		defaultService(o)
	case *discoveryv1.EndpointSlice:
		defaultEndpointSlice(o)
	}
}

func defaultService(svc *v1.Service) {
	s := &svc.Spec
	if s.SessionAffinity == "" {
		s.SessionAffinity = v1.ServiceAffinityNone
	}
	switch s.SessionAffinity {
	case v1.ServiceAffinityNone:
		s.SessionAffinityConfig = nil
	case v1.ServiceAffinityClientIP:
		if c := s.SessionAffinityConfig; c == nil || c.ClientIP == nil || c.ClientIP.TimeoutSeconds == nil {
			timeout := v1.DefaultClientIPServiceAffinitySeconds
			s.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
		}
	}
	if s.Type == "" {
		s.Type = v1.ServiceTypeClusterIP
	}
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Protocol == "" {
			p.Protocol = v1.ProtocolTCP
		}
		if p.TargetPort == intstr.FromInt32(0) || p.TargetPort == intstr.FromString("") {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
	externallyAccessible := s.Type == v1.ServiceTypeNodePort || s.Type == v1.ServiceTypeLoadBalancer ||
		(s.Type == v1.ServiceTypeClusterIP && len(s.ExternalIPs) > 0)
	if externallyAccessible && s.ExternalTrafficPolicy == "" {
		s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
	if s.InternalTrafficPolicy == nil &&
		(s.Type == v1.ServiceTypeClusterIP || s.Type == v1.ServiceTypeNodePort || s.Type == v1.ServiceTypeLoadBalancer) {
		cluster := v1.ServiceInternalTrafficPolicyCluster
		s.InternalTrafficPolicy = &cluster
	}
	if s.Type == v1.ServiceTypeLoadBalancer {
		if s.AllocateLoadBalancerNodePorts == nil {
			allocate := true
			s.AllocateLoadBalancerNodePorts = &allocate
		}
		vip := v1.LoadBalancerIPModeVIP
		for i := range svc.Status.LoadBalancer.Ingress {
			if ing := &svc.Status.LoadBalancer.Ingress[i]; ing.IP != "" && ing.IPMode == nil {
				ing.IPMode = &vip
			}
		}
	}
	// On create the registry fills spec.clusterIPs from a clusterIP given
	// alone (an older client's manifest).
	if s.Type != v1.ServiceTypeExternalName && s.ClusterIP != "" && len(s.ClusterIPs) == 0 {
		s.ClusterIPs = []string{s.ClusterIP}
	}
}

func defaultEndpointSlice(s *discoveryv1.EndpointSlice) {
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Name == nil {
			name := ""
			p.Name = &name
		}
		if p.Protocol == nil {
			tcp := v1.ProtocolTCP
			p.Protocol = &tcp
		}
	}
}
