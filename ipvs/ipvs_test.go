package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/xvs-lb/xvs/model"
)

// fakeKernel is kernel IPVS and the dummy interface in memory. Schedulers
// not in scheds fail like a kernel without the module (ENOENT).
type fakeKernel struct {
	svcs    map[vsKey]kService
	reals   map[vsKey]map[rsKey]kReal
	dev     map[netip.Addr]bool
	other   map[netip.Addr]bool
	scheds  map[string]bool
	calls   []string
	failAdd map[vsKey]bool
	// noDevice: the dummy interface does not exist (yet).
	noDevice bool
}

func newFake() *fakeKernel {
	return &fakeKernel{
		svcs: map[vsKey]kService{}, reals: map[vsKey]map[rsKey]kReal{},
		dev: map[netip.Addr]bool{}, other: map[netip.Addr]bool{},
		scheds:  map[string]bool{"rr": true, "wrr": true, "lc": true, "sh": true, "mh": true},
		failAdd: map[vsKey]bool{},
	}
}

func (f *fakeKernel) log(s string) { f.calls = append(f.calls, s) }

func (f *fakeKernel) Services() ([]kService, error) {
	var out []kService
	for _, s := range f.svcs {
		out = append(out, s)
	}
	return out, nil
}

func (f *fakeKernel) Reals(k vsKey) ([]kReal, error) {
	if _, ok := f.svcs[k]; !ok {
		return nil, syscall.ESRCH
	}
	var out []kReal
	for _, r := range f.reals[k] {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeKernel) AddService(s kService) error {
	if !f.scheds[s.Scheduler] {
		return syscall.ENOENT
	}
	if f.failAdd[s.Key] {
		return errors.New("injected failure")
	}
	if _, ok := f.svcs[s.Key]; ok {
		return syscall.EEXIST
	}
	if s.Key.Port != 20000 {
		f.log("add-svc " + s.Key.String() + " " + s.Scheduler)
	}
	f.svcs[s.Key] = s
	f.reals[s.Key] = map[rsKey]kReal{}
	return nil
}

func (f *fakeKernel) UpdateService(s kService) error {
	if _, ok := f.svcs[s.Key]; !ok {
		return syscall.ESRCH
	}
	f.log("update-svc " + s.Key.String() + " " + s.Scheduler)
	f.svcs[s.Key] = s
	return nil
}

func (f *fakeKernel) DelService(k vsKey) error {
	if _, ok := f.svcs[k]; !ok {
		return syscall.ESRCH
	}
	if k.Port != 20000 {
		f.log("del-svc " + k.String())
	}
	delete(f.svcs, k)
	delete(f.reals, k)
	return nil
}

func (f *fakeKernel) AddReal(k vsKey, r kReal) error {
	if _, ok := f.svcs[k]; !ok {
		return syscall.ESRCH
	}
	f.log("add-rs " + k.String() + " " + r.Key.String())
	f.reals[k][r.Key] = r
	return nil
}

func (f *fakeKernel) UpdateReal(k vsKey, r kReal) error {
	cur, ok := f.reals[k][r.Key]
	if !ok {
		return syscall.ENOENT
	}
	f.log("weight-rs " + k.String() + " " + r.Key.String() + " " + string(rune('0'+r.Weight)))
	cur.Weight = r.Weight
	f.reals[k][r.Key] = cur
	return nil
}

func (f *fakeKernel) DelReal(k vsKey, r rsKey) error {
	if _, ok := f.reals[k][r]; !ok {
		return syscall.ENOENT
	}
	f.log("del-rs " + k.String() + " " + r.String())
	delete(f.reals[k], r)
	return nil
}

func (f *fakeKernel) EnsureDevice() (bool, error) {
	if f.noDevice {
		f.noDevice = false
		return true, nil
	}
	return false, nil
}
func (f *fakeKernel) DeleteDevice() error {
	f.log("del-dev")
	f.dev, f.noDevice = map[netip.Addr]bool{}, true
	return nil
}
func (f *fakeKernel) DeviceAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	for a := range f.dev {
		out = append(out, a)
	}
	return out, nil
}
func (f *fakeKernel) AddDeviceAddr(a netip.Addr) error { f.dev[a] = true; return nil }
func (f *fakeKernel) DelDeviceAddr(a netip.Addr) error { delete(f.dev, a); return nil }
func (f *fakeKernel) OtherLocalAddrs() (map[netip.Addr]bool, error) {
	return f.other, nil
}

type fakeRules struct{ scripts []string }

func (r *fakeRules) Apply(s string) error { r.scripts = append(r.scripts, s); return nil }
func (r *fakeRules) Delete() error        { return nil }

type fakeCT struct {
	serving map[vsKey]map[netip.Addr]bool
	gone    map[vsKey]bool
}

func (c *fakeCT) CleanupUDP(s map[vsKey]map[netip.Addr]bool, g map[vsKey]bool) error {
	c.serving, c.gone = s, g
	return nil
}

var (
	vip     = netip.MustParseAddr("10.96.0.10")
	nodeIP  = netip.MustParseAddr("192.0.2.1")
	lbIP    = netip.MustParseAddr("203.0.113.7")
	extIP   = netip.MustParseAddr("198.51.100.9")
	ep1     = netip.MustParseAddr("10.244.0.2")
	ep2     = netip.MustParseAddr("10.244.0.3")
	webName = model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.TCP}
	dnsName = model.ServicePortName{Namespace: "default", Name: "dns", Port: "dns", Protocol: model.UDP}
)

func ep(a netip.Addr, local bool) model.Endpoint {
	return model.Endpoint{Addr: a, Port: 8080, Local: local, Ready: true, Serving: true, Weight: 1}
}

func webPort(eps ...model.Endpoint) *model.ServicePort {
	return &model.ServicePort{
		Name: webName,
		Frontends: []model.Frontend{
			{Kind: model.ClusterIP, Addr: vip, Port: 80, Proto: model.TCP},
			{Kind: model.NodePort, Addr: nodeIP, Port: 30080, Proto: model.TCP},
			{Kind: model.LoadBalancer, Addr: lbIP, Port: 80, Proto: model.TCP},
			{Kind: model.ExternalIP, Addr: extIP, Port: 80, Proto: model.TCP},
		},
		ClusterEndpoints: eps,
		HasEndpoints:     len(eps) > 0,
	}
}

func dnsPort(eps ...model.Endpoint) *model.ServicePort {
	for i := range eps {
		eps[i].Port = 5353
	}
	return &model.ServicePort{
		Name:             dnsName,
		Frontends:        []model.Frontend{{Kind: model.ClusterIP, Addr: vip, Port: 53, Proto: model.UDP}},
		ClusterEndpoints: eps,
		HasEndpoints:     len(eps) > 0,
	}
}

func state(sps ...*model.ServicePort) *model.State {
	st := &model.State{
		Node:     model.Node{Name: "n1", Addresses: []netip.Addr{nodeIP}},
		Services: map[model.ServicePortName]*model.ServicePort{},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	}
	for _, sp := range sps {
		st.Services[sp.Name] = sp
	}
	return st
}

func newTestDatapath(t *testing.T, k *fakeKernel, cfg Config) (*Datapath, *fakeRules, *fakeCT) {
	t.Helper()
	if cfg.StateFile == "" {
		cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	}
	r, ct := &fakeRules{}, &fakeCT{}
	d, err := newDatapath(cfg, k, r, ct)
	if err != nil {
		t.Fatal(err)
	}
	return d, r, ct
}

func key(a netip.Addr, p model.Protocol, port uint16) vsKey {
	return vsKey{Addr: a, Proto: p, Port: port}
}

func TestSyncCreatesEveryFrontendAndBindsVIPs(t *testing.T) {
	k := newFake()
	k.other[nodeIP] = true
	k.other[extIP] = true // an external IP already on another interface is not bound again
	d, rules, _ := newTestDatapath(t, k, Config{})
	if err := d.Sync(context.Background(), state(webPort(ep(ep1, true), ep(ep2, false)))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []vsKey{key(vip, model.TCP, 80), key(nodeIP, model.TCP, 30080), key(lbIP, model.TCP, 80), key(extIP, model.TCP, 80)} {
		s, ok := k.svcs[want]
		if !ok {
			t.Fatalf("no virtual server %s; have %v", want, k.svcs)
		}
		if s.Scheduler != "rr" || s.Flags != 0 {
			t.Errorf("%s: scheduler %q flags %#x, want rr and none", want, s.Scheduler, s.Flags)
		}
		if n := len(k.reals[want]); n != 2 {
			t.Errorf("%s: %d real servers, want 2", want, n)
		}
	}
	if len(k.svcs) != 4 {
		t.Errorf("%d virtual servers, want 4", len(k.svcs))
	}
	got, _ := k.DeviceAddrs()
	slices.SortFunc(got, netip.Addr.Compare)
	if want := []netip.Addr{vip, lbIP}; !slices.Equal(got, want) {
		t.Errorf("dummy interface addresses %v, want %v (no node IP, no external IP already local)", got, want)
	}
	if len(rules.scripts) != 1 || !strings.Contains(rules.scripts[0], "10.96.0.10 . tcp . 80") {
		t.Errorf("rules not applied with the ClusterIP: %v", rules.scripts)
	}
}

func TestSyncSchedulerAffinityAndUpdates(t *testing.T) {
	k := newFake()
	d, _, _ := newTestDatapath(t, k, Config{Scheduler: "lc"})
	sp := webPort(ep(ep1, true))
	sp.Frontends = sp.Frontends[:1]
	sp.Affinity = model.Affinity{ClientIP: true, TimeoutSeconds: 125}
	if err := d.Sync(context.Background(), state(sp)); err != nil {
		t.Fatal(err)
	}
	s := k.svcs[key(vip, model.TCP, 80)]
	if s.Scheduler != "lc" || s.Flags != flagPersistent || s.Timeout != 125 {
		t.Fatalf("got %+v, want lc persistent 125", s)
	}
	// Scheduler from the Service, mh gets mh-port; affinity off.
	sp2 := webPort(ep(ep1, true))
	sp2.Frontends = sp2.Frontends[:1]
	sp2.Scheduler = "mh"
	k.calls = nil
	if err := d.Sync(context.Background(), state(sp2)); err != nil {
		t.Fatal(err)
	}
	s = k.svcs[key(vip, model.TCP, 80)]
	if s.Scheduler != "mh" || s.Flags != flagMHPort || s.Timeout != 0 {
		t.Fatalf("got %+v, want mh with mh-port, no persistence", s)
	}
	if want := []string{"update-svc TCP 10.96.0.10:80 mh"}; !slices.Equal(k.calls, want) {
		t.Errorf("calls %v, want %v (update in place, real servers untouched)", k.calls, want)
	}
	// A scheduler the kernel lacks: the default is used, and it is a problem.
	sp3 := webPort(ep(ep1, true))
	sp3.Frontends = sp3.Frontends[:1]
	sp3.Scheduler = "nosuch"
	if err := d.Sync(context.Background(), state(sp3)); err != nil {
		t.Fatal(err)
	}
	if s := k.svcs[key(vip, model.TCP, 80)]; s.Scheduler != "lc" {
		t.Errorf("scheduler %q, want the default lc", s.Scheduler)
	}
	if p := d.Problems(); len(p) != 1 || !strings.Contains(p[0], `"nosuch" is not usable`) {
		t.Errorf("problems %v", p)
	}
}

func TestNewFailsOnUnusableDefaultScheduler(t *testing.T) {
	k := newFake()
	_, err := newDatapath(Config{Scheduler: "twos", StateFile: filepath.Join(t.TempDir(), "s")}, k, &fakeRules{}, &fakeCT{})
	if err == nil || !strings.Contains(err.Error(), "ip_vs_twos") {
		t.Fatalf("err %v, want the scheduler probe to name ip_vs_twos", err)
	}
	if len(k.svcs) != 0 {
		t.Errorf("probe left %v", k.svcs)
	}
}

func TestGracefulTermination(t *testing.T) {
	k := newFake()
	d, _, _ := newTestDatapath(t, k, Config{})
	web := func(eps ...model.Endpoint) *model.ServicePort {
		sp := webPort(eps...)
		sp.Frontends = sp.Frontends[:1]
		return sp
	}
	ctx := context.Background()
	if err := d.Sync(ctx, state(web(ep(ep1, true), ep(ep2, true)), dnsPort(ep(ep1, true), ep(ep2, true)))); err != nil {
		t.Fatal(err)
	}
	tcp, udp := key(vip, model.TCP, 80), key(vip, model.UDP, 53)
	r2 := rsKey{ep2, 8080}
	// ep2 holds a TCP connection; UDP real servers never drain.
	c := k.reals[tcp][r2]
	c.Active = 1
	k.reals[tcp][r2] = c
	u := k.reals[udp][rsKey{ep2, 5353}]
	u.Active = 3
	k.reals[udp][rsKey{ep2, 5353}] = u

	if err := d.Sync(ctx, state(web(ep(ep1, true)), dnsPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if r, ok := k.reals[tcp][r2]; !ok || r.Weight != 0 {
		t.Fatalf("TCP real server with a connection: %+v present=%v, want weight 0", r, ok)
	}
	if _, ok := k.reals[udp][rsKey{ep2, 5353}]; ok {
		t.Fatal("UDP real server not deleted at once")
	}
	if got := d.Draining(); !slices.Equal(got, []string{"TCP 10.96.0.10:80 -> 10.244.0.3:8080"}) {
		t.Fatalf("draining %v", got)
	}
	// Still connected: the drain pass keeps it.
	if err := d.drain(); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.reals[tcp][r2]; !ok {
		t.Fatal("deleted while a connection was active")
	}
	// A sync that leaves it removed keeps it at weight 0 and queued.
	if err := d.Sync(ctx, state(web(ep(ep1, true)), dnsPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if r := k.reals[tcp][r2]; r.Weight != 0 || len(d.Draining()) != 1 {
		t.Fatalf("after resync: %+v draining %v", r, d.Draining())
	}
	// Connection over (only an inactive entry left, then none).
	c = k.reals[tcp][r2]
	c.Active, c.Inactive = 0, 1
	k.reals[tcp][r2] = c
	if err := d.drain(); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.reals[tcp][r2]; !ok {
		t.Fatal("deleted while an inactive connection remained")
	}
	c.Inactive = 0
	k.reals[tcp][r2] = c
	if err := d.drain(); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.reals[tcp][r2]; ok {
		t.Fatal("drained real server not deleted")
	}
	if len(d.Draining()) != 0 {
		t.Fatalf("queue not empty: %v", d.Draining())
	}
}

func TestGracefulTerminationEndpointComesBack(t *testing.T) {
	k := newFake()
	d, _, _ := newTestDatapath(t, k, Config{})
	ctx := context.Background()
	sp := func(eps ...model.Endpoint) *model.ServicePort {
		s := webPort(eps...)
		s.Frontends = s.Frontends[:1]
		return s
	}
	if err := d.Sync(ctx, state(sp(ep(ep1, true), ep(ep2, true)))); err != nil {
		t.Fatal(err)
	}
	tcp, r2 := key(vip, model.TCP, 80), rsKey{ep2, 8080}
	c := k.reals[tcp][r2]
	c.Active = 1
	k.reals[tcp][r2] = c
	if err := d.Sync(ctx, state(sp(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx, state(sp(ep(ep1, true), ep(ep2, true)))); err != nil {
		t.Fatal(err)
	}
	if r := k.reals[tcp][r2]; r.Weight != 1 {
		t.Fatalf("re-added endpoint has weight %d, want 1", r.Weight)
	}
	if len(d.Draining()) != 0 {
		t.Fatalf("re-added endpoint still draining: %v", d.Draining())
	}
}

func TestSyncRemovesOnlyOwnedVirtualServers(t *testing.T) {
	k := newFake()
	foreign := kService{Key: key(netip.MustParseAddr("192.0.2.50"), model.TCP, 22), Scheduler: "rr"}
	k.svcs[foreign.Key] = foreign
	k.reals[foreign.Key] = map[rsKey]kReal{}
	excluded := kService{Key: key(netip.MustParseAddr("10.97.0.1"), model.TCP, 443), Scheduler: "rr"}
	k.svcs[excluded.Key] = excluded
	k.reals[excluded.Key] = map[rsKey]kReal{}
	stateFile := filepath.Join(t.TempDir(), "state.json")
	cfg := Config{StateFile: stateFile, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}
	d, _, ct := newTestDatapath(t, k, cfg)
	ctx := context.Background()
	if err := d.Sync(ctx, state(webPort(ep(ep1, true)), dnsPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	// A new agent (restart) reads the record and removes the Service.
	d2, _, ct2 := newTestDatapath(t, k, cfg)
	if err := d2.Sync(ctx, state()); err != nil {
		t.Fatal(err)
	}
	var left []string
	for key := range k.svcs {
		left = append(left, key.String())
	}
	slices.Sort(left)
	if want := []string{"TCP 10.97.0.1:443", "TCP 192.0.2.50:22"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want only the foreign and the excluded one %v", left, want)
	}
	if len(k.dev) != 0 {
		t.Errorf("VIPs left on the dummy interface: %v", k.dev)
	}
	if !ct2.gone[key(vip, model.UDP, 53)] {
		t.Errorf("removed UDP frontend not handed to conntrack cleanup: %v", ct2.gone)
	}
	_ = ct
}

func TestSyncContinuesPastOneFailure(t *testing.T) {
	k := newFake()
	k.failAdd[key(lbIP, model.TCP, 80)] = true
	d, _, _ := newTestDatapath(t, k, Config{})
	err := d.Sync(context.Background(), state(webPort(ep(ep1, true))))
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("err %v, want the injected failure", err)
	}
	if len(k.svcs) != 3 {
		t.Fatalf("%d virtual servers, want the 3 others", len(k.svcs))
	}
	delete(k.failAdd, key(lbIP, model.TCP, 80))
	k.calls = nil
	if err := d.Sync(context.Background(), state(webPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if want := []string{"add-svc TCP 203.0.113.7:80 rr", "add-rs TCP 203.0.113.7:80 10.244.0.2:8080"}; !slices.Equal(k.calls, want) {
		t.Errorf("retry did %v, want only %v", k.calls, want)
	}
}

func TestPolicyAndConflicts(t *testing.T) {
	local := ep(ep1, true)
	remote := ep(ep2, false)
	sp := webPort(local, remote)
	sp.LocalEndpoints = []model.Endpoint{local}
	sp.ExternalLocal = true
	other := webPort(remote)
	other.Name.Name = "aaa" // sorts first: owns the shared frontends
	other.Frontends = other.Frontends[:1]
	d := buildDesired(state(sp, other), "", nil)
	if n := len(d.Servers[key(nodeIP, model.TCP, 30080)].Reals); n != 1 {
		t.Errorf("eTP=Local NodePort has %d real servers, want the local one", n)
	}
	if d.Servers[key(nodeIP, model.TCP, 30080)].Masquerade {
		t.Error("eTP=Local frontend masqueraded")
	}
	if vs := d.Servers[key(vip, model.TCP, 80)]; vs.Owner != other.Name || len(vs.Reals) != 1 {
		t.Errorf("ClusterIP owner %v with %d reals, want %v", vs.Owner, len(vs.Reals), other.Name)
	}
	if len(d.Problems) != 1 {
		t.Errorf("problems %v, want the conflict", d.Problems)
	}
}

// TestLocalFallback: as kube-proxy's IPVS proxier (#97081), a Local policy
// without a local endpoint of the frontend's family falls back to the
// cluster endpoints of that family; with no cluster set either (iTP=Local
// on a Service not reachable from outside) the virtual server stays empty.
func TestLocalFallback(t *testing.T) {
	remote := ep(ep2, false)
	remote6 := ep(netip.MustParseAddr("fd00:10::2"), false)
	sp := webPort(remote, remote6)
	sp.ExternalLocal, sp.InternalLocal = true, true
	sp.LocalEndpoints = nil
	d := buildDesired(state(sp), "", nil)
	for _, k := range []vsKey{key(nodeIP, model.TCP, 30080), key(vip, model.TCP, 80)} {
		vs := d.Servers[k]
		if vs == nil || len(vs.Reals) != 1 || vs.Reals[rsKey{ep2, 8080}] == 0 {
			t.Errorf("%s: reals %v, want the IPv4 cluster endpoint %s", k, vs, ep2)
		}
	}
	if d.Servers[key(nodeIP, model.TCP, 30080)].Masquerade {
		t.Error("eTP=Local fallback masqueraded")
	}
	sp.ClusterEndpoints = nil
	d = buildDesired(state(sp), "", nil)
	if vs := d.Servers[key(vip, model.TCP, 80)]; len(vs.Reals) != 0 {
		t.Errorf("no cluster set: reals %v, want none", vs.Reals)
	}
}

func TestRulesRender(t *testing.T) {
	sp := webPort(ep(ep1, true))
	sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	st := state(sp, dnsPort(ep(ep2, true)))
	d := buildDesired(st, "", nil)
	script := renderRules(st, d, Config{})
	for _, want := range []string{
		"table ip xvs-ipvs\ndelete table ip xvs-ipvs\n",
		"table ip6 xvs-ipvs\ndelete table ip6 xvs-ipvs\n",
		"elements = { 10.96.0.10 . tcp . 80, 10.96.0.10 . udp . 53, 192.0.2.1 . tcp . 30080, 198.51.100.9 . tcp . 80, 203.0.113.7 . tcp . 80 }",
		"set masq_external {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = { 192.0.2.1 . tcp . 30080, 198.51.100.9 . tcp . 80, 203.0.113.7 . tcp . 80 }",
		// The node is in a range: the LB IP may be its own source.
		"elements = { 203.0.113.7 . tcp . 80 . 192.0.2.0/24, 203.0.113.7 . tcp . 80 . 203.0.113.7 }",
		"10.244.0.2 . tcp . 8080 . 10.244.0.2",
		"ip daddr . meta l4proto . th dport @cluster_ips ip saddr != @pod_cidrs meta mark set meta mark | 0x4000",
		"type filter hook output priority -100;",
		"meta mark & 0x4000 == 0x4000 counter masquerade",
		"ct state new ip daddr @vips ip daddr . meta l4proto . th dport != @services counter reject",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("rules lack %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, "table ip6 xvs-ipvs {") {
		t.Error("an ip6 table without IPv6 frontends")
	}
	st.MasqueradeAll = true
	if s := renderRules(st, d, Config{}); !strings.Contains(s, "@cluster_ips meta mark set") || strings.Contains(s, "!= @pod_cidrs") {
		t.Errorf("masqueradeAll: %s", s)
	}
}

func TestStaleUDPFilter(t *testing.T) {
	f := staleUDP{
		serving: map[vsKey]map[netip.Addr]bool{key(vip, model.UDP, 53): {ep1: true}, key(lbIP, model.UDP, 53): {}},
		gone:    map[vsKey]bool{key(extIP, model.UDP, 53): true},
	}
	flow := func(proto uint8, dst, replySrc netip.Addr, port uint16) *netlink.ConntrackFlow {
		var fl netlink.ConntrackFlow
		fl.Forward.Protocol = proto
		fl.Forward.DstIP = dst.AsSlice()
		fl.Forward.DstPort = port
		fl.Reverse.SrcIP = replySrc.AsSlice()
		return &fl
	}
	for _, c := range []struct {
		name string
		fl   *netlink.ConntrackFlow
		want bool
	}{
		{"serving endpoint", flow(17, vip, ep1, 53), false},
		{"removed endpoint", flow(17, vip, ep2, 53), true},
		{"no serving endpoints", flow(17, lbIP, lbIP, 53), true},
		{"removed service", flow(17, extIP, ep1, 53), true},
		{"not a frontend", flow(17, nodeIP, ep2, 53), false},
		{"TCP never", flow(6, vip, ep2, 53), false},
	} {
		if got := f.MatchConntrackFlow(c.fl); got != c.want {
			t.Errorf("%s: match %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSysctls(t *testing.T) {
	has := func(s []sysctl, path string) bool {
		return slices.ContainsFunc(s, func(x sysctl) bool { return x.path == path })
	}
	if s := kubeProxySysctls("5.4.0-150-generic", false); !has(s, "net/ipv4/vs/conn_reuse_mode") || has(s, "net/ipv4/conf/all/arp_ignore") {
		t.Errorf("5.4: %v", s)
	}
	if s := kubeProxySysctls("6.1.0-57-amd64", true); has(s, "net/ipv4/vs/conn_reuse_mode") || !has(s, "net/ipv4/conf/all/arp_announce") || !has(s, "net/ipv4/vs/conntrack") {
		t.Errorf("6.1 strictARP: %v", s)
	}
}

func TestAvailableNamesWhatIsMissing(t *testing.T) {
	err := Available()
	if err == nil {
		if _, gerr := netlink.GenlFamilyGet("IPVS"); gerr != nil {
			t.Fatalf("Available() = nil but the IPVS family is missing: %v", gerr)
		}
		return // a kernel with IPVS (the VM)
	}
	if !strings.Contains(err.Error(), "ip_vs kernel module not available") {
		t.Fatalf("error %q does not name the missing module", err)
	}
}

// TestOwnershipBesideKubeProxy: xvs's IPVS mode takes back only what its
// state file records. kube-proxy's IPVS mode uses the same interface
// (kube-ipvs0): its virtual servers and addresses survive xvs's syncs and
// xvs cleanup, and so does the interface xvs did not create; a node that
// never ran xvs's IPVS mode has no xvs state to clean at all, whatever
// kube-ipvs0 holds. An interface xvs created goes with its cleanup.
func TestOwnershipBesideKubeProxy(t *testing.T) {
	kpVIP := netip.MustParseAddr("10.96.0.1")
	kpKey := key(kpVIP, model.TCP, 443)
	kubeProxy := func() *fakeKernel {
		k := newFake()
		k.svcs[kpKey] = kService{Key: kpKey, Scheduler: "rr"}
		k.reals[kpKey] = map[rsKey]kReal{{Addr: netip.MustParseAddr("192.0.2.9"), Port: 6443}: {Weight: 1}}
		k.dev[kpVIP] = true
		return k
	}
	stateFile := filepath.Join(t.TempDir(), "state.json")
	cfg := Config{StateFile: stateFile}
	if HasState(cfg) {
		t.Fatal("HasState without a state file: a kube-ipvs0 alone is kube-proxy's")
	}

	k := kubeProxy()
	d, _, _ := newTestDatapath(t, k, cfg)
	if err := d.Sync(context.Background(), state(webPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.svcs[kpKey]; !ok || !k.dev[kpVIP] || !k.dev[vip] {
		t.Fatalf("after xvs's sync: kube-proxy's server kept %v, its VIP kept %v, xvs's VIP bound %v", ok, k.dev[kpVIP], k.dev[vip])
	}
	if err := d.Sync(context.Background(), state()); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.svcs[kpKey]; !ok || !k.dev[kpVIP] || k.dev[vip] {
		t.Fatalf("after xvs's Services went: kube-proxy's server kept %v, its VIP kept %v, xvs's VIP still bound %v", ok, k.dev[kpVIP], k.dev[vip])
	}
	if err := d.Sync(context.Background(), state(webPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if !HasState(cfg) {
		t.Fatal("no state after xvs's IPVS mode ran")
	}
	// xvs list shows xvs's virtual servers, not kube-proxy's.
	views, err := listKernel(cfg, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if v.Address.Addr() == kpVIP {
			t.Errorf("xvs list shows kube-proxy's %s", v.Address)
		}
	}
	if len(views) == 0 {
		t.Error("xvs list shows nothing of xvs's")
	}
	if err := cleanupKernel(cfg, k); err != nil {
		t.Fatal(err)
	}
	var left []string
	for key := range k.svcs {
		left = append(left, key.String())
	}
	if !slices.Equal(left, []string{kpKey.String()}) || len(k.dev) != 1 || !k.dev[kpVIP] || slices.Contains(k.calls, "del-dev") {
		t.Fatalf("after cleanup: servers %v, addresses %v, calls %v; want kube-proxy's server, its VIP and the interface", left, k.dev, k.calls)
	}

	// On a node where xvs created the interface, its cleanup removes it.
	k = newFake()
	k.noDevice = true
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	d, _, _ = newTestDatapath(t, k, cfg)
	if err := d.Sync(context.Background(), state(webPort(ep(ep1, true)))); err != nil {
		t.Fatal(err)
	}
	if err := cleanupKernel(cfg, k); err != nil {
		t.Fatal(err)
	}
	if len(k.svcs) != 0 || !k.noDevice {
		t.Fatalf("after cleanup of xvs's own: servers %v, interface left %v", k.svcs, !k.noDevice)
	}
}
