package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/kubeapi"
)

// The peer comparison: the real kube-proxy (nftables and iptables mode)
// and the real xvs agent (ebpf mode), each a process in the node namespace
// reading the same Services from the same kube-apiserver, beside the
// no-proxy floor, in the topology and with the load generator of the
// traffic benchmark; masqueraded (clusterCIDR set, so the external client
// is off-cluster and masqueraded, as kube-proxy does it) and not.

// peerProxy is what serves the Services in one case.
type peerProxy int

const (
	ppFloor     peerProxy = iota // nothing: the client connects to the pods
	ppNftables                   // kube-proxy --proxy-mode=nftables
	ppIptables                   // kube-proxy --proxy-mode=iptables
	ppXvs                        // xvs agent, ebpf mode, its defaults (--netfilter-mode=pass)
	ppXvsBypass                  // xvs agent, ebpf mode, --netfilter-mode=bypass
	numPeerProxies
)

func (p peerProxy) String() string {
	return [...]string{"no proxy (floor)", "kube-proxy nftables", "kube-proxy iptables", "xvs (ebpf)", "xvs (ebpf, bypass)"}[p]
}

func (p peerProxy) short() string {
	return [...]string{"floor", "kube-proxy-nftables", "kube-proxy-iptables", "xvs", "xvs-bypass"}[p]
}

// mode is the KubeProxyConfiguration mode the process runs with.
func (p peerProxy) mode() string { return [...]string{"", "nftables", "iptables", "ebpf", "ebpf"}[p] }

// xvs says whether p is the xvs agent (in either netfilter mode).
func (p peerProxy) xvs() bool { return p == ppXvs || p == ppXvsBypass }

// xvsProxies are the xvs variants, in report order.
var xvsProxies = []peerProxy{ppXvs, ppXvsBypass}

func parsePeerProxies(s string) ([]peerProxy, error) {
	var out []peerProxy
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		found := false
		for p := range numPeerProxies {
			if p.short() == f {
				out, found = append(out, p), true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown proxy %q (want floor, kube-proxy-nftables, kube-proxy-iptables, xvs, xvs-bypass)", f)
		}
	}
	return out, nil
}

// The pods' CIDR as clusterCIDR gives it to the proxies in the masqueraded
// cases; the client (192.0.2.10) is outside it. The Service range is the
// API server's; its own `kubernetes` Service takes the first address, so
// the benchmark's Services start one later.
const (
	peersClusterCIDR = "10.244.0.0/16"
	peersServiceCIDR = "10.96.0.0/12"
	peersNode        = "node"
)

func peerVIP(i int) netip.Addr { return addAddr(trafficVIPBase, 2+i) }

// peerNodePort is Service 0's NodePort (eTP=Cluster): the masqueraded
// bulk streams go through it.
const peerNodePort = 30080

// peerServices are the N Services: VIP:80/TCP to the three pods on 8080;
// Service 0 is also a NodePort.
func peerServices(n int) []ruleService {
	svcs := trafficServices(n)
	for i := range svcs {
		svcs[i].VIP = peerVIP(i)
	}
	svcs[0].NodePort = peerNodePort
	return svcs
}

// peerBulkTargets are where a case's bulk streams go: the pods for the
// floor, Service 0's ClusterIP when not masqueraded, and its NodePort on
// the node's address when masqueraded (eTP=Cluster: every proxy
// masquerades it).
func peerBulkTargets(c peerCase) []netip.AddrPort {
	switch {
	case c.Proxy == ppFloor:
		return targets(dpFloor, 0)
	case c.Masq:
		return []netip.AddrPort{netip.AddrPortFrom(trafficNodeIP, peerNodePort)}
	}
	return []netip.AddrPort{netip.AddrPortFrom(peerVIP(0), trafficVIPPort)}
}

// bulkTargetText names peerBulkTargets(c) in the report.
func bulkTargetText(c peerCase) string {
	switch {
	case c.Proxy == ppFloor:
		return "the pods"
	case c.Masq:
		return "NodePort"
	}
	return "ClusterIP"
}

// peerTargets: every VIP (each worker sweeps them all), or only Service
// 0's with one (the N Services are programmed, the traffic is the same at
// every N), or the pods for the floor.
func peerTargets(p peerProxy, n int, one bool) []netip.AddrPort {
	if p == ppFloor {
		return targets(dpFloor, n)
	}
	if one {
		n = 1
	}
	ts := make([]netip.AddrPort, n)
	for i := range ts {
		ts[i] = netip.AddrPortFrom(peerVIP(i), trafficVIPPort)
	}
	return ts
}

// PeersOptions shape the peer comparison.
type PeersOptions struct {
	Out     string // report (Markdown; the PNG goes beside it)
	Command string // quoted in the report
	Sizes   []int
	Rounds  int
	Workers int
	// Window is the measured time of a masqueraded case (the case the
	// masquerade goal is about, sustained); WindowUnmasq of the
	// others and the floor. Each after Warmup.
	Window, WindowUnmasq, Warmup time.Duration
	// ReadyTimeout bounds a proxy's wait for its first full sync (the
	// first and the last Service answering); a proxy that misses it at a
	// size is reported as such and not run again at that size.
	ReadyTimeout time.Duration
	// SlowSync: a proxy whose first sync at a size took longer runs in
	// the first round only there (both masquerade settings), so that
	// kube-proxy's iptables mode at 10,000 Services fits a bounded run.
	SlowSync time.Duration
	Proxies  []peerProxy
	// OneService sends every connection to Service 0 instead of sweeping
	// all N (the shape of the masquerade goal: one client, one
	// ClusterIP).
	OneService bool
	// Masq lists the masquerade settings to run each proxy with (default
	// both: not masqueraded, then masqueraded).
	Masq []bool
	// BulkStreams lists the parallel bulk streams to run each case with,
	// in each direction, at the smallest size only (none: no bulk runs);
	// BulkWindow is each bulk run's measured time, after BulkWarmup.
	BulkStreams            []int
	BulkWindow, BulkWarmup time.Duration
	// XvsBin and KubeProxyBin: empty builds them (xvs from this tree,
	// kube-proxy from test/kubeproxy into its cache).
	XvsBin, KubeProxyBin string
	Log                  io.Writer
}

func (o PeersOptions) validate() error {
	if len(o.Sizes) == 0 || o.Rounds < 1 || o.Workers < 1 || o.Window <= 0 || o.WindowUnmasq <= 0 || o.Warmup < 0 || o.ReadyTimeout <= 0 {
		return fmt.Errorf("peers: sizes, rounds, workers, windows and the ready timeout must be positive (%+v)", o)
	}
	if len(o.BulkStreams) > 0 && (o.BulkWindow <= 0 || o.BulkWarmup < 0 || slices.Min(o.BulkStreams) < 1) {
		return fmt.Errorf("peers: bulk streams and window must be positive (%v, %v)", o.BulkStreams, o.BulkWindow)
	}
	if !slices.Contains(o.Proxies, ppFloor) {
		return errors.New("peers: the proxies must include the floor")
	}
	for _, n := range o.Sizes {
		if n < 1 || n > 1<<19 {
			return fmt.Errorf("peers: size %d is outside 1..%d", n, 1<<19)
		}
	}
	return nil
}

// peerCase is one proxy, masqueraded or not (the floor: never).
type peerCase struct {
	Proxy peerProxy
	Masq  bool
}

func (c peerCase) String() string {
	if c.Proxy == ppFloor {
		return c.Proxy.String()
	}
	if c.Masq {
		return c.Proxy.String() + ", masqueraded"
	}
	return c.Proxy.String() + ", not masqueraded"
}

// cases lists what every round runs: the floor (never masqueraded), then
// each proxy unmasqueraded and masqueraded.
func (o PeersOptions) cases() []peerCase {
	masqs := o.masqs()
	var out []peerCase
	if slices.Contains(o.Proxies, ppFloor) {
		out = append(out, peerCase{Proxy: ppFloor})
	}
	for _, masq := range masqs {
		for _, p := range o.Proxies {
			if p != ppFloor {
				out = append(out, peerCase{p, masq})
			}
		}
	}
	return out
}

// masqs are the masquerade settings each proxy runs with.
func (o PeersOptions) masqs() []bool {
	if len(o.Masq) == 0 {
		return []bool{false, true}
	}
	return o.Masq
}

// bulkAt reports whether the cases run bulk streams at size n: at the
// smallest size only, since a stream's packets meet one Service whatever
// the number programmed.
func (o PeersOptions) bulkAt(n int) bool {
	return len(o.BulkStreams) > 0 && n == slices.Min(o.Sizes)
}

func (o PeersOptions) window(c peerCase) time.Duration {
	if c.Masq {
		return o.Window
	}
	return o.WindowUnmasq
}

// peerRun is one case's figures in one round.
type peerRun struct {
	Load loadResult
	// Ready is from the proxy's start to the first and the last Service
	// answering: its first full sync from the API server.
	Ready time.Duration
	// ProxyCPU is the proxy process's user+system time over the window;
	// KsoftirqdCPU the ksoftirqd threads' (softirqs the kernel deferred to
	// them; the rest are charged to the task they interrupt, mostly the
	// benchmark's own, and are in Load.CPU).
	ProxyCPU, KsoftirqdCPU time.Duration
	// Source is the client address the pods saw on the check connection.
	Source netip.Addr
	// Drops are xvs's nonzero drop verdicts (packets) at the end of the
	// window, counted from the agent's start, as `xvs list --stats` reads
	// them: where the failed connections of a case went.
	Drops map[string]uint64 `json:",omitempty"`
	// Bulk are the bulk runs, at the smallest size: each direction with
	// each number of streams.
	Bulk []peerBulk `json:",omitempty"`
}

// peerBulk is one bulk run of a case, with the proxy's and ksoftirqd's
// CPU over its window.
type peerBulk struct {
	bulkResult
	ProxyCPU, KsoftirqdCPU time.Duration
}

// CPUPerGB is all the CPU the run cost per GB (10^9 bytes) moved in its
// window.
func (b peerBulk) CPUPerGB() time.Duration {
	if b.Bytes == 0 {
		return 0
	}
	return time.Duration(float64(b.CPU+b.ProxyCPU+b.KsoftirqdCPU) * 1e9 / float64(b.Bytes))
}

// bulk is the run of direction d with s streams, if there is one.
func (r peerRun) bulk(d bulkDir, s int) (peerBulk, bool) {
	for _, b := range r.Bulk {
		if b.Dir == d && b.Streams == s {
			return b, true
		}
	}
	return peerBulk{}, false
}

// CPUPerConn is all the CPU the case cost per completed connection: the
// benchmark process (load generator, servers and the kernel's forwarding
// in their context), the proxy process and ksoftirqd.
func (r peerRun) CPUPerConn() time.Duration {
	if r.Load.Completed == 0 {
		return 0
	}
	return (r.Load.CPU + r.ProxyCPU + r.KsoftirqdCPU) / time.Duration(r.Load.Completed)
}

type peerCell struct {
	Runs []peerRun
	Err  string `json:",omitempty"` // why it stopped being measured
	Note string `json:",omitempty"` // why it has fewer rounds than the run
}

type peerResult struct {
	N     int
	Cells map[peerCase]*peerCell
}

// peersWorld is the traffic topology plus the API server the proxies read.
type peersWorld struct {
	*trafficWorld
	api     *kubeapi.Server
	fwd     net.Listener
	client  kubernetes.Interface
	created int // benchmark Services in the API server
	// nodeSysctls are the node namespace's values before any proxy ran:
	// kube-proxy and xvs both set conntrack timeouts (and kube-proxy
	// route_localnet) there, and each case starts from these again.
	nodeSysctls []string
	hostRules   string // the host's `nft list ruleset` at the start
}

// sysctls every proxy may write in its network namespace.
var peerSysctls = []string{
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"net/ipv4/conf/all/route_localnet",
}

func newPeersWorld(ctx context.Context) (_ *peersWorld, err error) {
	tw, err := newTrafficWorld()
	if err != nil {
		return nil, err
	}
	w := &peersWorld{trafficWorld: tw}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if out, rerr := lab.Run(w.node.NS, "nft", "list", "ruleset"); rerr != nil || strings.TrimSpace(string(out)) != "" {
		return nil, fmt.Errorf("the node namespace is not empty of rules (%v): %s", rerr, out)
	}
	hostOut, _ := hostRuleset()
	w.hostRules = hostOut
	err = w.node.Do(func() error {
		for _, k := range peerSysctls {
			b, err := os.ReadFile(filepath.Join("/proc/sys", k))
			if err != nil {
				return err
			}
			w.nodeSysctls = append(w.nodeSysctls, k, strings.TrimSpace(string(b)))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("node sysctls: %w", err)
	}
	if w.api, err = kubeapi.Start(ctx, kubeapi.Options{ServiceCIDRs: peersServiceCIDR}); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	// The proxies live in the node namespace, the server on the host's
	// loopback: the same address inside, relayed out.
	if w.fwd, err = lab.ForwardInto(w.node.NS, net.JoinHostPort("127.0.0.1", strconv.Itoa(w.api.Port))); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(w.api.Config)
	cfg.QPS, cfg.Burst = 5000, 10000
	if w.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *peersWorld) Close() error {
	var errs []error
	if w.fwd != nil {
		errs = append(errs, w.fwd.Close())
	}
	if w.api != nil {
		errs = append(errs, w.api.Close())
	}
	return errors.Join(append(errs, w.trafficWorld.Close())...)
}

// hostRuleset is the host namespace's nftables ruleset (iptables-nft's
// tables included), read to show that no proxy wrote there.
func hostRuleset() (string, error) {
	out, err := execOut("nft", "list", "ruleset")
	return out, err
}

// ensureServices grows the API server's Services to n (sizes run in
// ascending order, so each size adds the difference), with the Namespace
// and the Node (InternalIP the node's address) on the first call.
func (w *peersWorld) ensureServices(ctx context.Context, n int) (time.Duration, error) {
	start := time.Now()
	if w.created == 0 {
		if err := createNodeAndNamespace(ctx, w.client, "bench"); err != nil {
			return 0, err
		}
	}
	if n <= w.created {
		return 0, nil
	}
	if err := createServices(ctx, w.client, peerServices(n)[w.created:]); err != nil {
		return 0, fmt.Errorf("create services: %w (server log: %s)", err, w.api.LogTail(2048))
	}
	w.created = n
	return time.Since(start), nil
}

// measureCase runs one case: the proxy started and synced, a check of the
// path (and of masquerade), one load window, the proxy stopped and its
// rules removed.
func (w *peersWorld) measureCase(ctx context.Context, o PeersOptions, c peerCase, n int) (run peerRun, err error) {
	if err := w.flushConntrack(); err != nil {
		return run, err
	}
	var p *peerProcess
	if c.Proxy != ppFloor {
		if p, err = w.startProxy(ctx, o, c, n); err != nil {
			return run, err
		}
		defer func() { err = errors.Join(err, p.stop()) }()
		run.Ready = p.ready
	}
	ts := peerTargets(c.Proxy, n, o.OneService)
	if run.Source, err = w.sourceSeen(ts[len(ts)-1]); err != nil {
		return run, err
	}
	masqueraded := run.Source != trafficClientIP
	if masqueraded != c.Masq {
		return run, fmt.Errorf("the pods saw the client as %s: masquerade is %v, want %v", run.Source, masqueraded, c.Masq)
	}
	soft := ksoftirqdPIDs()
	var proxy0, soft0 time.Duration
	// marks calls back with the proxy's and ksoftirqd's CPU over a window.
	marks := func(end func(proxy, soft time.Duration)) func(bool) {
		return func(start bool) {
			var pc time.Duration
			if p != nil {
				pc = pidCPU(p.proc.Pid())
			}
			sc := pidsCPU(soft)
			if start {
				proxy0, soft0 = pc, sc
			} else {
				end(pc-proxy0, sc-soft0)
			}
		}
	}
	run.Load, err = runLoadMarked(ctx, w.trafficWorld.client.Handle, modeCPS, ts, o.Workers, o.Warmup, o.window(c),
		marks(func(proxy, soft time.Duration) { run.ProxyCPU, run.KsoftirqdCPU = proxy, soft }))
	if err != nil {
		return run, err
	}
	if o.bulkAt(n) {
		bts := peerBulkTargets(c)
		if c.Masq {
			// The NodePort's path, and that it is masqueraded.
			src, err := w.sourceSeen(bts[0])
			if err != nil {
				return run, fmt.Errorf("nodeport: %w", err)
			}
			if src == trafficClientIP {
				return run, fmt.Errorf("the pods saw the NodePort's client as itself (%s): not masqueraded", src)
			}
		}
		for _, d := range []bulkDir{bulkDown, bulkUp} {
			for _, streams := range o.BulkStreams {
				b := peerBulk{}
				b.bulkResult, err = runBulk(ctx, w.trafficWorld.client, bts, d, streams, o.BulkWarmup, o.BulkWindow,
					marks(func(proxy, soft time.Duration) { b.ProxyCPU, b.KsoftirqdCPU = proxy, soft }))
				if err != nil {
					return run, fmt.Errorf("bulk through %s: %w", bulkTargetText(c), err)
				}
				run.Bulk = append(run.Bulk, b)
			}
		}
	}
	if p != nil {
		if ended, perr := p.proc.Exited(); ended {
			return run, fmt.Errorf("%s exited during the run (%v): %s", c.Proxy, perr, p.logTail())
		}
		if c.Proxy.xvs() {
			if run.Drops, err = xvsDrops(w.node.NS, p.bin, p.pin); err != nil {
				return run, err
			}
		}
	}
	return run, nil
}

// xvsDrops reads the agent's drop verdicts with the agent's own binary
// (its map layout is the binary's, not this tree's).
func xvsDrops(ns *lab.NS, bin, pin string) (map[string]uint64, error) {
	out, err := lab.Run(ns, bin, "list", "--stats", "-o", "json", "--pin-path", pin)
	if err != nil {
		return nil, fmt.Errorf("xvs list --stats: %v: %s", err, tail(string(out), 5))
	}
	var snap struct {
		Verdicts map[string]struct{ PacketsIn uint64 } `json:"verdicts"`
	}
	if err := json.Unmarshal(out, &snap); err != nil {
		return nil, fmt.Errorf("xvs list --stats: %w", err)
	}
	drops := map[string]uint64{}
	for name, v := range snap.Verdicts {
		if strings.HasPrefix(name, "drop") && v.PacketsIn > 0 {
			drops[name] = v.PacketsIn
		}
	}
	return drops, nil
}

// sourceSeen makes one connection to t (retrying for a few seconds) and
// returns the client address the pod that answered saw.
func (w *peersWorld) sourceSeen(t netip.AddrPort) (netip.Addr, error) {
	for _, s := range w.servers {
		s.recordPeers(true)
	}
	defer func() {
		for _, s := range w.servers {
			s.recordPeers(false)
		}
	}()
	var lastErr error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lastErr = w.trafficWorld.client.Do(func() error { _, err := oneConnection(t, make([]byte, reqSize), make([]byte, 64)); return err })
		if lastErr != nil {
			continue
		}
		for _, s := range w.servers {
			if p := s.peer(); p.IsValid() {
				return p.Addr(), nil
			}
		}
		lastErr = errors.New("no pod recorded the connection")
	}
	return netip.Addr{}, fmt.Errorf("no connection to %s: %w", t, lastErr)
}

// peerProcess is a running proxy in the node namespace.
type peerProcess struct {
	w     *peersWorld
	c     peerCase
	proc  *lab.Process
	bin   string
	pin   string // xvs's pin path
	log   string
	ready time.Duration
}

// peerConfig is the one KubeProxyConfiguration every proxy reads: only the
// mode differs between them, and clusterCIDR between the masqueraded and
// the unmasqueraded cases. conntrack.maxPerCore 0 leaves nf_conntrack_max
// and the module's hashsize alone: they are global, outside the node
// namespace (with kube-proxy's defaults, 32768 per core and a minimum of
// 131072, kube-proxy would leave this machine's 131072 and 262144 as they
// are anyway). The conntrack timeouts keep kube-proxy's defaults and are
// set in the node namespace only.
func peerConfig(c peerCase, kubeconfig string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: %s
clientConnection:
  kubeconfig: %s
conntrack:
  maxPerCore: 0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 0.0.0.0:10256
`, c.Proxy.mode(), peersNode, kubeconfig)
	if c.Masq {
		fmt.Fprintf(&b, "clusterCIDR: %s\n", peersClusterCIDR)
	}
	return b.String()
}

// startProxy starts c's proxy on the shared configuration and waits until
// the first and the last Service answer through it.
func (w *peersWorld) startProxy(ctx context.Context, o PeersOptions, c peerCase, n int) (*peerProcess, error) {
	cfgPath := filepath.Join(w.dir, "kube-proxy-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(peerConfig(c, w.api.Kubeconfig)), 0o644); err != nil {
		return nil, err
	}
	p := &peerProcess{w: w, c: c, log: filepath.Join(w.dir, c.Proxy.short()+".log")}
	var args []string
	switch c.Proxy {
	case ppNftables, ppIptables:
		p.bin = o.KubeProxyBin
		args = []string{"--config", cfgPath}
	case ppXvs, ppXvsBypass:
		p.bin = o.XvsBin
		p.pin = w.pinRoot + "-agent"
		args = []string{"agent", "--config", cfgPath, "--pin-path", p.pin}
		if c.Proxy == ppXvsBypass {
			// Translated traffic skips the node's netfilter hooks and
			// xvs masquerades in BPF.
			args = append(args, "--netfilter-mode=bypass")
		}
	default:
		return nil, fmt.Errorf("no process for %s", c.Proxy)
	}
	start := time.Now()
	proc, err := lab.StartTied(w.node.NS, p.log, p.bin, args...)
	if err != nil {
		return nil, err
	}
	p.proc = proc
	ts := peerTargets(c.Proxy, n, o.OneService)
	want := []netip.AddrPort{ts[0], ts[len(ts)-1]}
	deadline := start.Add(o.ReadyTimeout)
	for len(want) > 0 {
		if ended, perr := proc.Exited(); ended {
			return nil, errors.Join(fmt.Errorf("%s exited before it served the Services (%v): %s", c.Proxy, perr, p.logTail()), p.stop())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.Join(fmt.Errorf("%w: %s did not serve %s within %v", errNotReady, c.Proxy, want[0], o.ReadyTimeout), p.stop())
		}
		if w.trafficWorld.client.Do(func() error { _, err := oneConnection(want[0], make([]byte, reqSize), make([]byte, 64)); return err }) == nil {
			want = want[1:]
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.ready = time.Since(start)
	return p, nil
}

var errNotReady = errors.New("not ready in time")

func (p *peerProcess) logTail() string {
	b, _ := os.ReadFile(p.log)
	return tail(string(b), 15)
}

// stop ends the process by its PID and removes what it left in the node
// namespace with its own cleanup (kube-proxy --cleanup, xvs cleanup), then
// flushes the ruleset and checks it is empty, and puts the node's sysctls
// back.
func (p *peerProcess) stop() error {
	node := p.w.node.NS
	errs := []error{p.proc.Stop(15 * time.Second)}
	var out []byte
	var err error
	if p.c.Proxy.xvs() {
		out, err = lab.Run(node, p.bin, "cleanup", "--pin-path", p.pin)
	} else {
		out, err = lab.Run(node, p.bin, "--cleanup")
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("%s cleanup: %v: %s", p.c.Proxy, err, tail(string(out), 5)))
	}
	if out, err := lab.Run(node, "nft", "flush", "ruleset"); err != nil {
		errs = append(errs, fmt.Errorf("nft flush ruleset: %v: %s", err, out))
	}
	if out, err := lab.Run(node, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(string(out)) != "" {
		errs = append(errs, fmt.Errorf("rules left in the node after %s (%v): %s", p.c.Proxy, err, tail(string(out), 5)))
	}
	errs = append(errs, os.RemoveAll(p.pin), node.Sysctl(p.w.nodeSysctls...))
	return errors.Join(errs...)
}

// measurePeers runs every case at every size, rounds times, interleaved:
// each round runs every case once, starting one case later than the round
// before, so that no case always follows the same one.
func measurePeers(ctx context.Context, o PeersOptions) (_ []peerResult, _ *peersWorldInfo, err error) {
	w, err := newPeersWorld(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, w.Close()) }()
	info := &peersWorldInfo{}
	cases := o.cases()
	var results []peerResult
	for _, n := range slices.Compact(slices.Sorted(slices.Values(o.Sizes))) {
		took, err := w.ensureServices(ctx, n)
		if err != nil {
			return nil, nil, err
		}
		info.Created = append(info.Created, createdAt{N: n, Took: took})
		logf(o.Log, "peers: %d services in the API server (%v to add them)", n, took.Round(time.Millisecond))
		res := peerResult{N: n, Cells: map[peerCase]*peerCell{}}
		for _, c := range cases {
			res.Cells[c] = &peerCell{}
		}
		// A proxy whose first sync missed the ready timeout at this size
		// is not started again at it, masqueraded or not: its sync does the
		// same work either way, and the run's time stays bounded.
		slow := map[peerProxy]string{}
		// Proxies that synced, but slower than SlowSync: first round only.
		once := map[peerProxy]time.Duration{}
		for round := range o.Rounds {
			for i := range cases {
				c := cases[(i+round)%len(cases)]
				cell := res.Cells[c]
				if cell.Err != "" {
					continue
				}
				if why, ok := slow[c.Proxy]; ok {
					cell.Err = "not started (again) at this size: " + why
					continue
				}
				if took, ok := once[c.Proxy]; ok && round > 0 {
					cell.Note = fmt.Sprintf("first round only: its first sync took %v, over the %v after which a proxy runs once per size", took.Round(time.Second), o.SlowSync)
					continue
				}
				run, err := w.measureCase(ctx, o, c, n)
				if errors.Is(err, errNotReady) {
					slow[c.Proxy] = err.Error()
				}
				if err == nil && round == 0 && o.SlowSync > 0 && run.Ready > o.SlowSync {
					once[c.Proxy] = max(once[c.Proxy], run.Ready)
				}
				if ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				if err != nil {
					cell.Err = err.Error()
					logf(o.Log, "peers: %d services, round %d, %s: not measured: %v", n, round+1, c, err)
					continue
				}
				cell.Runs = append(cell.Runs, run)
				logf(o.Log, "peers: %d services, round %d, %s: %.0f conn/s, %v CPU each (proxy %v, ksoftirqd %v in the window), connect p99 %v, %d errors, ready after %v, pods saw %s, xvs drops %v",
					n, round+1, c, run.Load.Rate(), run.CPUPerConn(), run.ProxyCPU.Round(time.Millisecond), run.KsoftirqdCPU.Round(time.Millisecond),
					run.Load.P99, run.Load.Errors, run.Ready.Round(time.Millisecond), run.Source, run.Drops)
				for _, b := range run.Bulk {
					logf(o.Log, "peers: %d services, round %d, %s: bulk %s through %s, %d stream(s): %.2f Gbit/s, %v CPU per GB, %d MiB checked",
						n, round+1, c, b.Dir, bulkTargetText(c), b.Streams, b.Gbps(), b.CPUPerGB().Round(time.Millisecond), b.Total>>20)
				}
			}
		}
		results = append(results, res)
	}
	after, _ := hostRuleset()
	info.HostRulesUnchanged = after == w.hostRules
	return results, info, nil
}

// peersWorldInfo is what the report says about the run besides figures.
type peersWorldInfo struct {
	Created []createdAt
	// HostRulesUnchanged: the host's ruleset read at the end equals the
	// one at the start (another tenant of the machine may change it too).
	HostRulesUnchanged bool
}

type createdAt struct {
	N    int
	Took time.Duration
}

// ksoftirqdPIDs are the per-CPU softirq threads.
func ksoftirqdPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			out = append(out, pid)
		}
	}
	return out
}

func pidsCPU(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		t += pidCPU(p)
	}
	return t
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on every
// Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// pidCPU is a process's user+system time (threads that ended included),
// from /proc/PID/stat; 0 when it is gone.
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// Fields after the command name, which may hold spaces and ends at the
	// last ')': state is field 3, utime 14 and stime 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * clockTick
}

// execOut runs a command in the caller's namespace and returns its output.
func execOut(bin string, args ...string) (string, error) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}
