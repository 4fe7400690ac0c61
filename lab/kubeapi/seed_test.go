package kubeapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestSeedThenServe seeds Services and EndpointSlices into a fresh etcd,
// starts the API server over it and checks it serves them as if they had
// been created through it: listed with their fields, updated, their
// ClusterIPs held by the allocator (a new Service cannot take one), and a
// Service created afterwards gets an address of its own.
func TestSeedThenServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const n = 300
	var objs []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		ip := fmt.Sprintf("198.51.100.%d", 10+i%200)
		if i >= 200 {
			ip = fmt.Sprintf("2001:db8:5::%x", 0x100+i)
		}
		family := corev1.IPv4Protocol
		addrType := discoveryv1.AddressTypeIPv4
		ep := fmt.Sprintf("192.0.2.%d", 1+i%250)
		if i >= 200 {
			family, addrType, ep = corev1.IPv6Protocol, discoveryv1.AddressTypeIPv6, fmt.Sprintf("2001:db8:7::%x", i)
		}
		single := corev1.IPFamilyPolicySingleStack
		objs = append(objs, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				IPFamilies: []corev1.IPFamily{family}, IPFamilyPolicy: &single,
				SessionAffinity: corev1.ServiceAffinityNone,
				Ports:           []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		}, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: addrType,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ep}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		})
	}
	written, err := Seed(ctx, dir, objs)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * n; written != want { // a Service, its IPAddress, its slice
		t.Fatalf("seeded %d records, want %d", written, want)
	}
	srv := StartT(t, Options{Dir: dir})
	c := srv.Client

	svcs, err := c.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]corev1.Service{}
	for _, s := range svcs.Items {
		byName[s.Name] = s
	}
	for i := range n {
		s, ok := byName[fmt.Sprintf("svc-%d", i)]
		if !ok {
			t.Fatalf("svc-%d not served (%d Services listed)", i, len(svcs.Items))
		}
		if s.UID == "" || s.ResourceVersion == "" || s.CreationTimestamp.IsZero() || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 80 {
			t.Fatalf("svc-%d served as %+v", i, s)
		}
	}
	slices, err := c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != n {
		t.Fatalf("%d EndpointSlices served, want %d", len(slices.Items), n)
	}

	// An update goes through as for any stored object.
	sl, err := c.DiscoveryV1().EndpointSlices("default").Get(ctx, "svc-7-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sl.Endpoints[0].Addresses = []string{"192.0.2.251"}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update a seeded EndpointSlice: %v", err)
	}

	// The seeded ClusterIPs are allocated: asking for one fails, a new
	// Service gets a free address.
	taken := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: "198.51.100.10",
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, taken, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("a Service asking for a seeded ClusterIP: err %v, want Invalid (already allocated)", err)
	}
	taken.Spec.ClusterIP = ""
	fresh, err := c.CoreV1().Services("default").Create(ctx, taken, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == fresh.Spec.ClusterIP {
			t.Fatalf("new Service got %s, already %s's", fresh.Spec.ClusterIP, s.Name)
		}
	}
}
