package harness

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// ServicePort is one port of a Service built by NewService: its name,
// protocol, port and the endpoints' port (targetPort).
type ServicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
	Target   int32
}

// NewService is a ClusterIP Service ns/name on vip with ports, typed as
// the API server would store it (kubectl apply takes its YAML).
func NewService(ns, name string, vip netip.Addr, ports ...ServicePort) *corev1.Service {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  vip.String(),
			ClusterIPs: []string{vip.String()},
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port,
			TargetPort: intstr.FromInt32(p.Target)})
	}
	return svc
}

// NewEndpointSlice is svc's EndpointSlice ns/name: each address a ready
// endpoint on node, serving every port of svc at its targetPort.
func NewEndpointSlice(svc *corev1.Service, name, node string, addrs ...netip.Addr) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	if len(addrs) > 0 && addrs[0].Is6() {
		sl.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, a := range addrs {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
			NodeName: ptr.To(node), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	for _, p := range svc.Spec.Ports {
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol),
			Port: ptr.To(p.TargetPort.IntVal)})
	}
	return sl
}

// WriteObjects writes objs as one multi-document YAML file at path,
// replaced by rename so that a watching agent never reads half of it.
func WriteObjects(path string, objs ...any) error {
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
