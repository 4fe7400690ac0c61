package maps

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

func loadForTest(t *testing.T) (*loader.Objects, loader.Config) {
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
	objs, cfg := loadForTest(t)
	defer objs.Close()
	m := FromObjects(objs)
	dcfg := Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends}
	dp, err := NewDatapath(m, dcfg)
	if err != nil {
		t.Fatal(err)
	}
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

func mustRead(t *testing.T, m *Maps) *Snapshot {
	s, err := m.Read(false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func countEntries(t *testing.T, m *Maps) int { return countMap(t, m.Services) }

func countBackends(t *testing.T, m *Maps) int { return countMap(t, m.Backends) }

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
