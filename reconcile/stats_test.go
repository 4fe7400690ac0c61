package reconcile

import (
	"context"
	stdmaps "maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
)

// statsIDs are the IDs a counter map has entries for.
func statsIDs(t *testing.T, m *maps.Maps) (svcs, backends []uint32) {
	t.Helper()
	s, err := maps.PerCPUKeys[xbpf.Stats](m.SvcStats)
	if err != nil {
		t.Fatal(err)
	}
	b, err := maps.PerCPUKeys[xbpf.Stats](m.BackendStats)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(stdmaps.Keys(s)), slices.Sorted(stdmaps.Keys(b))
}

// liveIDs are the IDs the listing shows.
func liveIDs(t *testing.T, m *maps.Maps) (svcs, backends []uint32) {
	t.Helper()
	snap := mustRead(t, m)
	seen := map[uint32]bool{}
	for _, sv := range snap.Services {
		svcs = append(svcs, sv.ID)
		for _, bv := range sv.Backends {
			if !seen[bv.ID] {
				seen[bv.ID] = true
				backends = append(backends, bv.ID)
			}
		}
	}
	slices.Sort(svcs)
	slices.Sort(backends)
	return svcs, backends
}

// counted gives ids a counter entry with one connection on every CPU, as
// the datapath's first flush for an ID does (stats_of).
func counted(t *testing.T, m *ebpf.Map, ids []uint32) {
	t.Helper()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	per := make([]xbpf.Stats, ncpu)
	for i := range per {
		per[i].Conns = 1
	}
	for _, id := range ids {
		if err := m.Update(&id, per, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPrivStatsFollowIDs: counters exist only for service and backend IDs
// in use. A sync creates none (the datapath does, when it first counts for
// an ID); an ID's entry goes with the ID; a fresh ID loses a previous
// owner's entry before anything points at it; a restart deletes entries
// of IDs nothing uses.
func TestPrivStatsFollowIDs(t *testing.T) {
	m, dp, dcfg := datapathForTest(t)
	ctx := context.Background()
	a := svc("a", "172.30.0.1", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
	b := svc("b", "172.30.0.2", "10.0.0.3:80", "10.0.0.4:80")
	if err := dp.Sync(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	if s, bs := statsIDs(t, m); len(s) != 0 || len(bs) != 0 {
		t.Fatalf("a sync created counters for services %v backends %v", s, bs)
	}
	liveS, liveB := liveIDs(t, m)
	if len(liveS) != 2 || len(liveB) != 4 {
		t.Fatalf("%d services and %d backends listed, want 2 and 4", len(liveS), len(liveB))
	}
	counted(t, m.SvcStats, liveS)
	counted(t, m.BackendStats, liveB)

	// b deleted, a shrunk: their IDs' counters go with them.
	if err := dp.Sync(ctx, state(svc("a", "172.30.0.1", "10.0.0.2:80"))); err != nil {
		t.Fatal(err)
	}
	gotS, gotB := statsIDs(t, m)
	wantS, wantB := liveIDs(t, m)
	if !slices.Equal(gotS, wantS) || !slices.Equal(gotB, wantB) {
		t.Fatalf("after removals: counters for services %v backends %v, want %v %v", gotS, gotB, wantS, wantB)
	}

	// Every free ID below 64 holds a leftover entry (a flush that raced
	// the release): the IDs a new Service takes must start from nothing.
	var freeS, freeB []uint32
	for id := uint32(1); id < 64; id++ {
		if !slices.Contains(wantS, id) {
			freeS = append(freeS, id)
		}
		if !slices.Contains(wantB, id) {
			freeB = append(freeB, id)
		}
	}
	counted(t, m.SvcStats, freeS)
	counted(t, m.BackendStats, freeB)
	c := svc("c", "172.30.0.3", "10.0.0.7:80", "10.0.0.8:80")
	if err := dp.Sync(ctx, state(svc("a", "172.30.0.1", "10.0.0.2:80"), c)); err != nil {
		t.Fatal(err)
	}
	snap := mustRead(t, m)
	for _, sv := range snap.Services {
		if sv.Address.Addr() != netip.MustParseAddr("172.30.0.3") {
			continue
		}
		if sv.Stats != (xbpf.Stats{}) {
			t.Errorf("new service ID %d starts with %+v", sv.ID, sv.Stats)
		}
		for _, bv := range sv.Backends {
			if bv.Stats != (xbpf.Stats{}) {
				t.Errorf("new backend ID %d starts with %+v", bv.ID, bv.Stats)
			}
		}
	}

	// A restart deletes the entries of IDs nothing uses, and keeps a's.
	if _, err := NewDatapath(m, dcfg); err != nil {
		t.Fatal(err)
	}
	gotS, gotB = statsIDs(t, m)
	if !slices.Equal(gotS, wantS) || !slices.Equal(gotB, wantB) {
		t.Fatalf("after a restart: counters for services %v backends %v, want a's %v %v", gotS, gotB, wantS, wantB)
	}
}
