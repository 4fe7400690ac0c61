package controller

import (
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is the part of an API object's metadata the proxy keeps for
// Services and EndpointSlices: their identity, the version that lets a
// resync be recognised as one, and the labels that decide whether this
// proxy serves them. A metav1.ObjectMeta is 232 bytes before its strings
// and maps; at 100k Services and as many slices that is 45 MiB of fields
// nobody reads.
type Meta struct {
	Namespace, Name string
	UID             types.UID
	ResourceVersion string
	// Labels keeps only those the proxy reads (proxyLabels): nil for
	// nearly every object.
	Labels map[string]string
}

// GetObjectMeta makes cached objects keyable by client-go's stores and
// indexers (meta.Accessor accepts a metav1.ObjectMetaAccessor). It builds
// a metadata object on each call: the stores ask for a key once per event.
func (m *Meta) GetObjectMeta() metav1.Object {
	om := m.ObjectMeta()
	om.Labels = m.Labels
	return &om
}

// Key is the object's namespace/name.
func (m *Meta) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
}

// ObjectMeta returns the identity an Event about the object refers to.
func (m *Meta) ObjectMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
}

func newMeta(m *metav1.ObjectMeta) Meta {
	return Meta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: proxyLabels(m.Labels)}
}

// Service is a Service as the proxy keeps it: what the translation reads
// and nothing else, at about half the size of the API object after
// trimming (see TrimObject). The informers cache Services in this form and
// the Tracker keeps them.
type Service struct {
	Meta
	// Created is metadata.creationTimestamp: the older of two Services
	// claiming one frontend keeps it.
	Created time.Time
	// Annotations keeps xvs's own (AnnotationScheduler,
	// AnnotationWeights): nil for nearly every Service.
	Annotations map[string]string
	Spec        ServiceSpec
	// LoadBalancer is status.loadBalancer.ingress.
	LoadBalancer []v1.LoadBalancerIngress
}

// ServiceSpec holds the fields of v1.ServiceSpec the translation reads,
// with their names and types. Left out: the selector (the EndpointSlice
// controller's business), spec.loadBalancerIP and loadBalancerClass (the
// load balancer's; kube-proxy reads the status), externalName (an
// ExternalName Service is not proxied), ipFamilies and ipFamilyPolicy
// (spec.clusterIPs says the families), allocateLoadBalancerNodePorts
// (spec.ports says whether a nodePort was allocated),
// publishNotReadyAddresses and trafficDistribution (both decided by the
// EndpointSlice controller, whose slices carry the outcome).
type ServiceSpec struct {
	Type                     v1.ServiceType
	ClusterIP                string
	ClusterIPs               []string
	Ports                    []v1.ServicePort
	ExternalIPs              []string
	SessionAffinity          v1.ServiceAffinity
	SessionAffinityConfig    *v1.SessionAffinityConfig
	ExternalTrafficPolicy    v1.ServiceExternalTrafficPolicy
	InternalTrafficPolicy    *v1.ServiceInternalTrafficPolicy
	HealthCheckNodePort      int32
	LoadBalancerSourceRanges []string
}

// NewService keeps of an API Service what the proxy reads. It shares the
// API object's slices and strings: the caller hands the object over.
func NewService(svc *v1.Service) *Service {
	s := &svc.Spec
	out := &Service{
		Meta:        newMeta(&svc.ObjectMeta),
		Created:     svc.CreationTimestamp.Time,
		Annotations: keepAnnotations(svc.Annotations, AnnotationScheduler, AnnotationWeights),
		Spec: ServiceSpec{
			Type: s.Type, ClusterIP: s.ClusterIP, ClusterIPs: s.ClusterIPs, Ports: s.Ports,
			ExternalIPs: s.ExternalIPs, SessionAffinity: s.SessionAffinity,
			SessionAffinityConfig: s.SessionAffinityConfig, ExternalTrafficPolicy: s.ExternalTrafficPolicy,
			InternalTrafficPolicy: s.InternalTrafficPolicy, HealthCheckNodePort: s.HealthCheckNodePort,
			LoadBalancerSourceRanges: s.LoadBalancerSourceRanges,
		},
		LoadBalancer: svc.Status.LoadBalancer.Ingress,
	}
	// The API server sets clusterIP to clusterIPs[0]: keep one copy of the
	// string rather than two.
	if len(s.ClusterIPs) > 0 && s.ClusterIP == s.ClusterIPs[0] {
		out.Spec.ClusterIP = s.ClusterIPs[0]
	}
	return out
}
