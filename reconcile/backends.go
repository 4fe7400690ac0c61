package reconcile

import (
	"iter"
	"net/netip"

	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// backendTable is the Datapath's record of every backend (backendEntry),
// one map per address family: an IPv4 key is 8 bytes against an IPv6
// key's 20, so the slots of a cluster's million mostly-IPv4 backends take
// 20 bytes instead of 32. Neither key holds a pointer, so the garbage
// collector never scans either map.
type backendTable struct {
	v4 map[backendKey4]backendEntry
	v6 map[maps.BackendKey]backendEntry
}

// backendKey4 is an IPv4 backend's maps.BackendKey.
type backendKey4 struct {
	addr  [4]byte
	port  uint16
	proto model.Protocol
}

func newBackendTable() backendTable {
	return backendTable{v4: map[backendKey4]backendEntry{}, v6: map[maps.BackendKey]backendEntry{}}
}

func key4(bk maps.BackendKey) (backendKey4, bool) {
	a := bk.Addr()
	if !a.Is4() {
		return backendKey4{}, false
	}
	return backendKey4{addr: a.As4(), port: bk.Port, proto: bk.Proto}, true
}

func (t *backendTable) get(bk maps.BackendKey) (backendEntry, bool) {
	if k, ok := key4(bk); ok {
		e, ok := t.v4[k]
		return e, ok
	}
	e, ok := t.v6[bk]
	return e, ok
}

func (t *backendTable) set(bk maps.BackendKey, e backendEntry) {
	if k, ok := key4(bk); ok {
		t.v4[k] = e
		return
	}
	t.v6[bk] = e
}

func (t *backendTable) delete(bk maps.BackendKey) {
	if k, ok := key4(bk); ok {
		delete(t.v4, k)
		return
	}
	delete(t.v6, bk)
}

// addRef adds delta to bk's reference count (a backend not in the table
// counts from zero) and returns the entry as stored.
func (t *backendTable) addRef(bk maps.BackendKey, delta int) backendEntry {
	e, _ := t.get(bk)
	e.refs = uint32(int(e.refs) + delta)
	t.set(bk, e)
	return e
}

func (t *backendTable) len() int { return len(t.v4) + len(t.v6) }

// all yields every backend, IPv4 first.
func (t *backendTable) all() iter.Seq2[maps.BackendKey, backendEntry] {
	return func(yield func(maps.BackendKey, backendEntry) bool) {
		for k, e := range t.v4 {
			if !yield(maps.NewBackendKey(netip.AddrFrom4(k.addr), k.port, k.proto), e) {
				return
			}
		}
		for k, e := range t.v6 {
			if !yield(k, e) {
				return
			}
		}
	}
}
