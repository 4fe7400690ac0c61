package controller

import (
	"net/netip"
	"testing"
	"unsafe"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSliceEndpointCompact: an endpoint is 48 bytes (a million of them
// are most of a 100k-Service cluster's slices), and its address comes
// back as the API had it, in both families.
func TestSliceEndpointCompact(t *testing.T) {
	if n := unsafe.Sizeof(SliceEndpoint{}); n != 48 {
		t.Errorf("SliceEndpoint is %d bytes, want 48", n)
	}
	for _, c := range []struct {
		typ  discoveryv1.AddressType
		addr string
	}{
		{discoveryv1.AddressTypeIPv4, "10.1.2.3"},
		{discoveryv1.AddressTypeIPv6, "fd00::1:2"},
		{discoveryv1.AddressTypeIPv4, "255.255.255.254"},
		{discoveryv1.AddressTypeIPv6, "::"},
	} {
		s := NewSlice(&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s", Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
			AddressType: c.typ,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{c.addr}}},
		})
		if len(s.Endpoints) != 1 {
			t.Fatalf("%s: %d endpoints (%v)", c.addr, len(s.Endpoints), s.Reasons)
		}
		if got := s.Endpoints[0].Addr(); got != netip.MustParseAddr(c.addr) {
			t.Errorf("%s came back as %s (Is4 %v)", c.addr, got, got.Is4())
		}
	}
}
