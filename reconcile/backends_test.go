package reconcile

import (
	"maps"
	"net/netip"
	"testing"

	xmaps "github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// TestBackendTable: IPv4 and IPv6 backends (and an IPv4-mapped address,
// which is its IPv4 backend) are found, replaced, listed and deleted as
// one table.
func TestBackendTable(t *testing.T) {
	bt := newBackendTable()
	v4 := xmaps.NewBackendKey(netip.MustParseAddr("10.244.1.2"), 8080, model.TCP)
	v4udp := xmaps.NewBackendKey(netip.MustParseAddr("10.244.1.2"), 8080, model.UDP)
	v6 := xmaps.NewBackendKey(netip.MustParseAddr("fd00::2"), 8080, model.TCP)
	mapped := xmaps.NewBackendKey(netip.MustParseAddr("::ffff:10.244.1.2"), 8080, model.TCP)
	bt.set(v4, backendEntry{id: 1, refs: 1})
	bt.set(v4udp, backendEntry{id: 2})
	bt.set(v6, backendEntry{id: 3, weight: 5})
	if e, ok := bt.get(mapped); !ok || e.id != 1 {
		t.Errorf("the IPv4-mapped key finds %+v %v, want the IPv4 backend", e, ok)
	}
	bt.set(mapped, backendEntry{id: 1, refs: 2})
	want := map[xmaps.BackendKey]backendEntry{v4: {id: 1, refs: 2}, v4udp: {id: 2}, v6: {id: 3, weight: 5}}
	if got := maps.Collect(bt.all()); !maps.Equal(got, want) || bt.len() != 3 {
		t.Errorf("all() = %v (len %d), want %v", got, bt.len(), want)
	}
	if e := bt.addRef(v6, 1); e.refs != 1 || e.id != 3 || e.weight != 5 {
		t.Errorf("addRef(+1) = %+v, want the IPv6 entry with one reference", e)
	}
	if e := bt.addRef(mapped, -1); e.refs != 1 || e.id != 1 {
		t.Errorf("addRef(-1) through the IPv4-mapped key = %+v, want the IPv4 entry with one reference", e)
	}
	bt.delete(v4)
	bt.delete(v6)
	if _, ok := bt.get(v4); ok || bt.len() != 1 {
		t.Errorf("after deleting two: len %d, IPv4 backend still there: %v", bt.len(), ok)
	}
	if _, ok := bt.get(v6); ok {
		t.Error("the IPv6 backend is still there")
	}
	if e, ok := bt.get(v4udp); !ok || e.id != 2 {
		t.Errorf("the UDP backend: %+v %v", e, ok)
	}
}
