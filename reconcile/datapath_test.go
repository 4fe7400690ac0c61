package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

func loadForTest(t testing.TB) (*loader.Objects, loader.Config) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF maps and needs root")
	}
	cfg := loader.DefaultConfig()
	cfg.PinPath = fmt.Sprintf("/sys/fs/bpf/xvs-maptest-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(cfg.PinPath) })
	objs, err := loader.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return objs, cfg
}

// datapathForTest loads fresh objects, closed with the test, and a
// Datapath over them sized as the loader's defaults.
func datapathForTest(t testing.TB) (*maps.Maps, *Datapath, Config) {
	t.Helper()
	objs, cfg := loadForTest(t)
	t.Cleanup(func() { objs.Close() })
	m := maps.FromObjects(objs)
	dcfg := Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends}
	dp, err := NewDatapath(m, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, dp, dcfg
}

func svc(name string, vip string, eps ...string) *model.ServicePort {
	sp := &model.ServicePort{
		Name:         model.ServicePortName{Namespace: "ns", Name: name, Protocol: model.TCP},
		Frontends:    []model.Frontend{{Kind: model.ClusterIP, Addr: netip.MustParseAddr(vip), Port: 80, Proto: model.TCP}},
		HasEndpoints: len(eps) > 0,
	}
	for _, e := range eps {
		ap := netip.MustParseAddrPort(e)
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, model.Endpoint{Addr: ap.Addr(), Port: ap.Port(), Ready: true})
	}
	return sp
}

func state(sps ...*model.ServicePort) *model.State {
	st := &model.State{Services: map[model.ServicePortName]*model.ServicePort{}}
	for _, sp := range sps {
		st.Services[sp.Name] = sp
	}
	return st
}

// TestPrivDatapathSyncAndRecover: shrinking and growing services leave no
// stale slot behind, deleted services and unused backends go, and a new
// Datapath over the same pinned maps (an agent restart) keeps every ID.
func TestPrivDatapathSyncAndRecover(t *testing.T) {
	m, dp, dcfg := datapathForTest(t)
	ctx := context.Background()
	a := svc("a", "172.30.0.1", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80")
	b := svc("b", "172.30.0.2", "10.0.0.3:80")
	if err := dp.Sync(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	before := mustRead(t, m)
	if n := countEntries(t, m); n != 2+3+1 {
		t.Fatalf("%d service entries, want 6", n)
	}

	// Shrink a to one endpoint, delete b.
	a2 := svc("a", "172.30.0.1", "10.0.0.2:80")
	if err := dp.Sync(ctx, state(a2)); err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, m); n != 2 {
		t.Fatalf("%d service entries after shrink and delete, want 2", n)
	}
	if n := countBackends(t, m); n != 1 {
		t.Fatalf("%d backends, want 1 (unused ones deleted)", n)
	}

	// Restart: a new Datapath over the same maps keeps the IDs.
	dp2, err := NewDatapath(m, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp2.Sync(ctx, state(a2)); err != nil {
		t.Fatal(err)
	}
	after := mustRead(t, m)
	if after.Services[0].ID != before.Services[0].ID || after.Services[0].Group != before.Services[0].Group {
		t.Fatalf("service IDs moved across restart: %+v -> %+v", before.Services[0], after.Services[0])
	}
	var beforeID uint32
	for _, bv := range before.Services[0].Backends {
		if bv.Address.String() == "10.0.0.2:80" {
			beforeID = bv.ID
		}
	}
	if got := after.Services[0].Backends[0].ID; got != beforeID {
		t.Fatalf("backend ID moved across restart: %d -> %d", beforeID, got)
	}

	// A restarted agent whose desired state lost a service removes it.
	if err := dp2.Sync(ctx, state()); err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, m); n != 0 {
		t.Fatalf("%d entries left after deleting everything", n)
	}
}

func mustRead(t *testing.T, m *maps.Maps) *maps.Snapshot {
	s, err := m.Read(false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func countEntries(t *testing.T, m *maps.Maps) int { return countMap(t, m.Services) }

func countBackends(t *testing.T, m *maps.Maps) int { return countMap(t, m.Backends) }

func countMap(t *testing.T, mp *ebpf.Map) int {
	n := 0
	var k, v []byte
	it := mp.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// view renders what the maps program, by address: one line per frontend
// with its backends in slot order, plus the backend and ClusterIP counts
// (so that nothing stale hides behind a correct view).
func view(t *testing.T, m *maps.Maps) []string {
	t.Helper()
	var out []string
	for _, s := range mustRead(t, m).Services {
		line := s.Address.String() + " ->"
		for _, b := range s.Backends {
			line += " " + b.Address.String()
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return append(out, fmt.Sprintf("backends %d, cluster IPs %d", countBackends(t, m), countMap(t, m.ClusterIPs)))
}

// want renders a State the way view renders the maps.
func want(st *model.State) []string {
	var out []string
	backends := map[netip.AddrPort]bool{}
	ips := map[netip.Addr]bool{}
	for _, sp := range st.Services {
		for _, f := range sp.Frontends {
			line := netip.AddrPortFrom(f.Addr, f.Port).String() + " ->"
			for _, e := range sp.ClusterEndpoints {
				line += " " + e.AddrPort().String()
				backends[e.AddrPort()] = true
			}
			out = append(out, line)
			ips[f.Addr] = true
		}
	}
	slices.Sort(out)
	return append(out, fmt.Sprintf("backends %d, cluster IPs %d", len(backends), len(ips)))
}

// numbered gives hand-built States the numbering and delta the Tracker
// gives its own.
func numbered(gen uint64, st *model.State, changed ...string) *model.State {
	st.Generation = gen
	if gen > 1 {
		d := &model.Delta{Since: gen - 1}
		for _, n := range changed {
			d.Names = append(d.Names, model.ServicePortName{Namespace: "ns", Name: n, Protocol: model.TCP})
		}
		st.Delta = d
	}
	return st
}

// TestPrivDatapathDelta: syncs driven by the States' deltas (O(changed))
// leave the maps exactly as the State says, including removed services,
// unused backends and ClusterIPs; a State whose delta does not start at
// the one applied falls back to comparing every service.
func TestPrivDatapathDelta(t *testing.T) {
	for _, flush := range []int{flushSlots, 1} {
		t.Run(fmt.Sprintf("flush every %d slots", flush), func(t *testing.T) {
			defer func(was int) { flushSlots = was }(flushSlots)
			flushSlots = flush
			testDatapathDelta(t)
		})
	}
}

func testDatapathDelta(t *testing.T) {
	objs, cfg := loadForTest(t)
	defer objs.Close()
	m := maps.FromObjects(objs)
	dp, err := NewDatapath(m, Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := svc("a", "172.30.0.1", "10.0.0.1:80", "10.0.0.2:80")
	b := svc("b", "172.30.0.2", "10.0.0.2:80", "10.0.0.3:80")
	c := svc("c", "172.30.0.3", "10.0.0.4:80")
	steps := []*model.State{
		numbered(1, state(a, b)),
		numbered(2, state(svc("a", "172.30.0.1", "10.0.0.1:80"), b), "a"),
		numbered(3, state(svc("a", "172.30.0.1", "10.0.0.1:80"), c), "b", "c"),
		numbered(4, state(c), "a"),
		// Not numbered from 4: every service is compared.
		numbered(9, state(a, c), "x"),
	}
	// Steps 3 and 4 keep step 2's pointer for a, as the Tracker would.
	steps[2].Services[a.Name] = steps[1].Services[a.Name]
	for i, st := range steps {
		if err := dp.Sync(ctx, st); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if got, w := view(t, m), want(st); !slices.Equal(got, w) {
			t.Errorf("step %d: maps\n%s\nwant\n%s", i+1, strings.Join(got, "\n"), strings.Join(w, "\n"))
		}
	}
}

// TestPrivDatapathFullIDSpace: a ServicePort whose backends do not fit is
// reported and left out, the others are programmed, and it is programmed
// as soon as IDs free up, without any change of its own.
func TestPrivDatapathFullIDSpace(t *testing.T) {
	objs, cfg := loadForTest(t)
	defer objs.Close()
	m := maps.FromObjects(objs)
	dp, err := NewDatapath(m, Config{MaxServices: cfg.MaxServices, MaxBackends: 5}) // backend IDs 1..4
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := svc("a", "172.30.0.1", "10.0.0.1:80", "10.0.0.2:80")
	b := svc("b", "172.30.0.2", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80")
	c := svc("c", "172.30.0.3", "10.0.0.6:80")
	if err := dp.Sync(ctx, numbered(1, state(a, b, c))); err != nil {
		t.Fatal(err)
	}
	probs := strings.Join(dp.Problems(), "\n")
	if !strings.Contains(probs, "ns/b/TCP") || !strings.Contains(probs, "IDs in use") {
		t.Errorf("problems %q do not name b's full ID space", probs)
	}
	got := view(t, m)
	if !slices.Contains(got, "172.30.0.1:80 -> 10.0.0.1:80 10.0.0.2:80") || !slices.Contains(got, "172.30.0.3:80 -> 10.0.0.6:80") {
		t.Errorf("a and c not programmed beside a full b:\n%s", strings.Join(got, "\n"))
	}
	for _, l := range got {
		if strings.HasPrefix(l, "172.30.0.2:") {
			t.Errorf("b programmed half: %s", l)
		}
	}
	// Removing a frees two IDs. They are not reused in the sync that
	// frees them (slots may still point at them until its end), but the
	// next one, here the agent's periodic sync of the same State,
	// programs b, though b did not change.
	st := numbered(2, state(b, c), "a")
	for range 2 {
		if err := dp.Sync(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if got, w := view(t, m), want(st); !slices.Equal(got, w) {
		t.Errorf("after a went: maps\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(w, "\n"))
	}
	if p := dp.Problems(); len(p) != 0 {
		t.Errorf("problems left: %q", p)
	}
}
