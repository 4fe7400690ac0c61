package controller

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/lab/kubeapi"
	"github.com/xvs-lb/xvs/model"
)

// Hand-written manifests as an operator writes them: no port names,
// protocols, target ports or policies; what kubectl apply sends.
const plainManifests = `apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 198.51.100.10
  ports:
  - port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: plain-1
  labels: {kubernetes.io/service-name: plain}
addressType: IPv4
ports:
- port: 8080
endpoints:
- addresses: [10.0.0.1]
  nodeName: node-a
- addresses: [10.0.1.1]
  nodeName: node-b
---
apiVersion: v1
kind: Service
metadata: {name: edge}
spec:
  type: NodePort
  clusterIP: 198.51.100.11
  sessionAffinity: ClientIP
  ports:
  - {name: web, port: 80, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: edge-1
  labels: {kubernetes.io/service-name: edge}
addressType: IPv4
ports:
- {name: web, port: 8080}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- addresses: [10.0.0.2]
  nodeName: node-a
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 198.51.100.12
  ports:
  - {port: 443, nodePort: 30443}
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  clusterIP: 198.51.100.13
  externalIPs: [203.0.113.7]
  ports:
  - {port: 8443}
`

// TestFileSourceAppliesAPIDefaults: a hand-written single-port Service
// and its EndpointSlice, neither naming its port, work from the file
// source as they would once applied (the API server defaults the slice
// port's name to "", which matches the Service port's).
func TestFileSourceAppliesAPIDefaults(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "plain.yaml", plainManifests)
	mustLoad(t, src)
	if p := src.Problems(); len(p) > 0 {
		t.Errorf("problems %q", problemStrings(p))
	}
	st := tr.Build().State
	plain := st.Services[model.ServicePortName{Namespace: "default", Name: "plain", Protocol: model.TCP}]
	if plain == nil || !equalStrings(epStrings(plain.ClusterEndpoints), []string{"10.0.0.1:8080", "10.0.1.1:8080"}) {
		t.Fatalf("plain Service: %+v (services %v)", plain, st.Services)
	}
	dns := st.Services[model.ServicePortName{Namespace: "default", Name: "edge", Port: "dns", Protocol: model.UDP}]
	web := st.Services[model.ServicePortName{Namespace: "default", Name: "edge", Port: "web", Protocol: model.TCP}]
	if dns == nil || web == nil || web.Affinity.TimeoutSeconds != uint32(v1.DefaultClientIPServiceAffinitySeconds) {
		t.Fatalf("edge Service: web %+v, dns %+v", web, dns)
	}
}

// TestFileDefaultsMatchAPIServer: the same manifests, created through a
// real kube-apiserver and read back, give the same defaulted fields and
// the same desired state as the file source's defaulting.
func TestFileDefaultsMatchAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := kubeapi.StartT(t, kubeapi.Options{})

	objs, err := kubeapi.DecodeManifests([]byte(plainManifests))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		o.SetNamespace(metav1.NamespaceDefault)
	}
	if _, err := kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: "xvs-test"}); err != nil {
		t.Fatal(err)
	}
	served, err := srv.Client.CoreV1().Services(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	servedSlices, err := srv.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromServer := map[string]any{}
	var serverSvcs []*v1.Service
	var serverSlices []*discoveryv1.EndpointSlice
	for i := range served.Items {
		if s := &served.Items[i]; s.Name != "kubernetes" {
			fromServer["Service/"+s.Name] = s
			serverSvcs = append(serverSvcs, s)
		}
	}
	for i := range servedSlices.Items {
		if s := &servedSlices.Items[i]; s.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			fromServer["EndpointSlice/"+s.Name] = s
			serverSlices = append(serverSlices, s)
		}
	}

	// The file side: the same documents through the file source's decoder
	// and defaulting.
	var fileSvcs []*v1.Service
	var fileSlices []*discoveryv1.EndpointSlice
	for _, o := range objs {
		js, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := manifestDecoder.Decode(js, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		applyAPIDefaults(obj)
		switch o := obj.(type) {
		case *v1.Service:
			fileSvcs = append(fileSvcs, o)
			s, ok := fromServer["Service/"+o.Name].(*v1.Service)
			if !ok {
				t.Fatalf("Service %s not served", o.Name)
			}
			if got, want := defaultedServiceFields(o), defaultedServiceFields(s); !reflect.DeepEqual(got, want) {
				t.Errorf("Service %s: file source\n%+v\nAPI server\n%+v", o.Name, got, want)
			}
		case *discoveryv1.EndpointSlice:
			fileSlices = append(fileSlices, o)
			s, ok := fromServer["EndpointSlice/"+o.Name].(*discoveryv1.EndpointSlice)
			if !ok {
				t.Fatalf("EndpointSlice %s not served", o.Name)
			}
			if got, want := fmt.Sprintf("%+v", portsOf(o)), fmt.Sprintf("%+v", portsOf(s)); got != want {
				t.Errorf("EndpointSlice %s ports: file source %s, API server %s", o.Name, got, want)
			}
		}
	}
	node := testNodeObj(nil, "192.168.1.10")
	fileState, _ := Translate(testConfig(), fileSvcs, fileSlices, node)
	serverState, _ := Translate(testConfig(), serverSvcs, serverSlices, node)
	if len(fileState.Services) != 5 {
		t.Fatalf("%d ServicePorts from the files, want 5: %v", len(fileState.Services), fileState.Services)
	}
	for name, want := range serverState.Services {
		got := fileState.Services[name]
		if got == nil || fmt.Sprintf("%+v", *got) != fmt.Sprintf("%+v", *want) {
			t.Errorf("%s: file source %+v, API server %+v", name, got, want)
		}
	}
	if len(serverState.Services) != len(fileState.Services) {
		t.Errorf("%d ServicePorts from the API server, %d from the files", len(serverState.Services), len(fileState.Services))
	}
}

// defaultedServiceFields is the part of a Service's spec the API server
// defaults (allocations and ipFamilies aside: the manifests give the
// clusterIPs and nodePorts, and the translation reads families from the
// clusterIPs).
func defaultedServiceFields(s *v1.Service) any {
	return struct {
		Type                          v1.ServiceType
		Ports                         []v1.ServicePort
		ClusterIPs                    []string
		SessionAffinity               v1.ServiceAffinity
		SessionAffinityConfig         *v1.SessionAffinityConfig
		ExternalTrafficPolicy         v1.ServiceExternalTrafficPolicy
		InternalTrafficPolicy         *v1.ServiceInternalTrafficPolicy
		AllocateLoadBalancerNodePorts *bool
	}{s.Spec.Type, s.Spec.Ports, s.Spec.ClusterIPs, s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig,
		s.Spec.ExternalTrafficPolicy, s.Spec.InternalTrafficPolicy, s.Spec.AllocateLoadBalancerNodePorts}
}

func portsOf(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, p := range s.Ports {
		out = append(out, fmt.Sprintf("%v/%v/%v", deref(p.Name), deref(p.Protocol), deref(p.Port)))
	}
	return out
}

func deref[T any](p *T) any {
	if p == nil {
		return "<nil>"
	}
	return *p
}
