package reconcile

import (
	"context"
	stdmaps "maps"
	"slices"
	"testing"

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

// TestPrivStatsFollowIDs: the per-CPU counters exist for exactly the
// service and backend IDs in use, through adds, removals and a restart
// over pins that lost them (an upgrade from the per-CPU arrays).
func TestPrivStatsFollowIDs(t *testing.T) {
	m, dp, dcfg := datapathForTest(t)
	ctx := context.Background()
	check := func(step string) {
		t.Helper()
		gotS, gotB := statsIDs(t, m)
		wantS, wantB := liveIDs(t, m)
		if !slices.Equal(gotS, wantS) || !slices.Equal(gotB, wantB) {
			t.Fatalf("%s: counters for services %v backends %v, want %v %v", step, gotS, gotB, wantS, wantB)
		}
	}
	a := svc("a", "172.30.0.1", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
	b := svc("b", "172.30.0.2", "10.0.0.3:80", "10.0.0.4:80")
	if err := dp.Sync(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	check("two services")
	if s, bs := statsIDs(t, m); len(s) != 2 || len(bs) != 4 {
		t.Fatalf("counters for %d services and %d backends, want 2 and 4", len(s), len(bs))
	}
	if err := dp.Sync(ctx, state(svc("a", "172.30.0.1", "10.0.0.2:80"))); err != nil {
		t.Fatal(err)
	}
	check("b deleted, a shrunk")

	// Counters lost (the upgrade case) and one left over: a restarted
	// agent puts them right before its first sync.
	s, bs := statsIDs(t, m)
	if err := maps.DeleteMany(m.SvcStats, s); err != nil {
		t.Fatal(err)
	}
	if err := maps.DeleteMany(m.BackendStats, bs); err != nil {
		t.Fatal(err)
	}
	if err := maps.ZeroPerCPU[xbpf.Stats](m.BackendStats, []uint32{4000}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewDatapath(m, dcfg); err != nil {
		t.Fatal(err)
	}
	check("restart over lost counters")
}
