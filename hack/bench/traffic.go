package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// The real-traffic topology: one node namespace forwarding between a
// client namespace and three pod namespaces, as in lab's demo, with
// documentation-range node and client addresses.
var (
	trafficNodeIP   = netip.MustParseAddr("198.51.100.2")
	trafficClientIP = netip.MustParseAddr("192.0.2.10")
	trafficPodIPs   = []netip.Addr{
		netip.MustParseAddr("10.244.0.11"),
		netip.MustParseAddr("10.244.0.12"),
		netip.MustParseAddr("10.244.0.13"),
	}
	// trafficVIPBase: Service i's ClusterIP is base+1+i, inside
	// 10.96.0.0/12 (room for a million Services).
	trafficVIPBase = netip.MustParseAddr("10.96.0.0")
)

const (
	trafficPodPort = 8080
	trafficVIPPort = 80
)

// datapath is one way of getting the client's connections to the pods.
type datapath int

const (
	dpFloor     datapath = iota // no proxy: the client connects to the pod addresses
	dpXvs                       // xvs's tc program on the node's interfaces
	dpNftables                  // kube-proxy's nftables rules in the node
	dpIptables                  // kube-proxy's iptables rules in the node
	dpAgentEBPF                 // the xvs agent binary in ebpf mode (file source)
	dpAgentIPVS                 // the xvs agent binary in ipvs mode (file source; needs kernel IPVS)
	numDatapaths
)

func (d datapath) String() string {
	return [...]string{"no proxy (floor)", "xvs (tc)", "nftables", "iptables", "xvs agent, ebpf mode", "xvs agent, ipvs mode"}[d]
}

func (d datapath) short() string {
	return [...]string{"floor", "xvs", "nftables", "iptables", "agent-ebpf", "agent-ipvs"}[d]
}

// defaultDatapaths run on the host; the agent datapaths are for the VM,
// where kernel IPVS exists.
var defaultDatapaths = []datapath{dpFloor, dpXvs, dpNftables, dpIptables}

// parseDatapaths reads a comma-separated list of short names.
func parseDatapaths(s string) ([]datapath, error) {
	var out []datapath
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		i := slices.IndexFunc(allDatapaths(), func(d datapath) bool { return d.short() == f })
		if i < 0 {
			return nil, fmt.Errorf("unknown datapath %q (want floor, xvs, nftables, iptables, agent-ebpf, agent-ipvs)", f)
		}
		out = append(out, datapath(i))
	}
	return out, nil
}

func allDatapaths() []datapath {
	var out []datapath
	for d := range numDatapaths {
		out = append(out, d)
	}
	return out
}

// rules says whether d is programmed with rules whose cost grows with N,
// and so runs only up to RulesMax.
func (d datapath) rules() bool { return d == dpNftables || d == dpIptables || d == dpAgentIPVS }

// TrafficOptions shape the real-traffic part of a run.
type TrafficOptions struct {
	// Sizes are the numbers of Services to measure at; 0 sizes skip the
	// real-traffic benchmark.
	Sizes []int
	// RulesMax is the largest size iptables and nftables run at (100k is
	// a goal only for xvs and the floor).
	RulesMax int
	// Rounds: every round measures every datapath once per size, in turn,
	// so all of them see the same noise; figures are medians over rounds.
	Rounds  int
	Workers int
	Warmup  time.Duration
	Window  time.Duration // measured time of each cps and rr run
	// Datapaths to compare (default defaultDatapaths); the floor must be
	// one of them.
	Datapaths []datapath
	// XvsBin is the xvs binary the agent datapaths run.
	XvsBin string
	// KeepGoing records a datapath that cannot be installed or fails its
	// runs, and goes on without it (the VM guest, whose kernel may refuse
	// a program); otherwise such a failure ends the benchmark.
	KeepGoing bool
}

func (o TrafficOptions) datapaths() []datapath {
	if len(o.Datapaths) == 0 {
		return defaultDatapaths
	}
	return o.Datapaths
}

func (o TrafficOptions) validate() error {
	for _, n := range o.Sizes {
		if n < 1 || n > 1<<20-2 {
			return fmt.Errorf("traffic size %d is outside 1..%d", n, 1<<20-2)
		}
	}
	if len(o.Sizes) > 0 && (o.Rounds < 1 || o.Workers < 1 || o.Window <= 0 || o.Warmup < 0) {
		return fmt.Errorf("traffic: rounds, workers and window must be positive (%+v)", o)
	}
	if len(o.Sizes) > 0 && !slices.Contains(o.datapaths(), dpFloor) {
		return errors.New("traffic: the datapaths must include the floor")
	}
	return nil
}

// trafficRun is one datapath's figures at one size in one round.
type trafficRun struct {
	CPS, RR loadResult
	// Prog is, for xvs in the first round, a separate connections run with
	// the kernel's BPF run-time statistics on (they cost a little, so not
	// during the measured runs): how often the tc program ran and for how
	// long, per connection.
	Prog *progCost `json:",omitempty"`
}

type progCost struct {
	Conns    int
	Runs     uint64
	Runtime  time.Duration
	CPUPerOp time.Duration // the run's process CPU per connection
}

// trafficCell is everything measured for one datapath at one size.
type trafficCell struct {
	Runs    []trafficRun
	Program time.Duration // time to program the N Services (first round)
	Err     string        `json:",omitempty"` // why it stopped, with KeepGoing
}

type trafficResult struct {
	N     int
	Cells [numDatapaths]*trafficCell // nil: not run at this size
}

// trafficWorld is the topology, the pods' servers and the services.
type trafficWorld struct {
	lab     *lab.Lab
	node    *lab.Node
	pods    []*lab.NS
	client  *lab.NS
	servers []*benchServer
	dir     string
	pinRoot string
	// prog is xvs's tc program while xvs is installed.
	prog *ebpf.Program
}

func newTrafficWorld() (_ *trafficWorld, err error) {
	l, err := lab.New(lab.UniquePrefix("bench"))
	if err != nil {
		return nil, err
	}
	w := &trafficWorld{lab: l}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.dir, err = os.MkdirTemp("", "xvs-bench-traffic-"); err != nil {
		return nil, err
	}
	w.pinRoot = filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-traffic", os.Getpid()))
	if w.node, err = l.AddNode("node", trafficNodeIP); err != nil {
		return nil, err
	}
	for i, ip := range trafficPodIPs {
		pod, err := l.AddPod(w.node, "pod"+strconv.Itoa(i+1), ip)
		if err != nil {
			return nil, err
		}
		srv, err := startServer(pod, netip.AddrPortFrom(ip, trafficPodPort))
		if err != nil {
			return nil, err
		}
		w.pods = append(w.pods, pod)
		w.servers = append(w.servers, srv)
	}
	if w.client, err = l.AddClient(w.node, "client", trafficClientIP); err != nil {
		return nil, err
	}
	// The client closes first, so its side keeps TIME_WAIT: reuse such
	// ports (after 1 s, by TCP timestamps) and use the whole port range,
	// so that tens of thousands of connections per second never run out.
	return w, w.client.Sysctl(
		"net/ipv4/tcp_tw_reuse", "1",
		"net/ipv4/ip_local_port_range", "1024 65535",
	)
}

func (w *trafficWorld) Close() error {
	var errs []error
	for _, s := range w.servers {
		errs = append(errs, s.Close())
	}
	if w.node != nil {
		errs = append(errs, w.node.Do(func() error { return loader.Cleanup(w.pinRoot) }))
	}
	errs = append(errs, os.RemoveAll(w.pinRoot), w.lab.Close())
	if w.dir != "" {
		errs = append(errs, os.RemoveAll(w.dir))
	}
	return errors.Join(errs...)
}

func trafficVIP(i int) netip.Addr { return addAddr(trafficVIPBase, 1+i) }

// trafficServices is the N Services every datapath programs: VIP:80/TCP to
// the three pods on 8080.
func trafficServices(n int) []ruleService {
	eps := make([]netip.AddrPort, len(trafficPodIPs))
	for i, ip := range trafficPodIPs {
		eps[i] = netip.AddrPortFrom(ip, trafficPodPort)
	}
	svcs := make([]ruleService, n)
	for i := range svcs {
		svcs[i] = ruleService{Namespace: "bench", Name: "svc-" + strconv.Itoa(i), Port: "http",
			VIP: trafficVIP(i), VIPPort: trafficVIPPort, Endpoints: eps}
	}
	return svcs
}

// targets are the addresses the client connects to: every VIP, or for the
// floor the pods themselves.
func targets(d datapath, n int) []netip.AddrPort {
	if d == dpFloor {
		var ts []netip.AddrPort
		for _, ip := range trafficPodIPs {
			ts = append(ts, netip.AddrPortFrom(ip, trafficPodPort))
		}
		return ts
	}
	ts := make([]netip.AddrPort, n)
	for i := range ts {
		ts[i] = netip.AddrPortFrom(trafficVIP(i), trafficVIPPort)
	}
	return ts
}

// install programs n Services with datapath d and returns how long that
// took, and the function that removes it again.
func (w *trafficWorld) install(ctx context.Context, d datapath, n, maxN int, bin string) (time.Duration, func() error, error) {
	switch d {
	case dpFloor:
		return 0, func() error { return nil }, nil
	case dpXvs:
		return w.installXvs(ctx, n, maxN)
	case dpNftables:
		return w.installRules(n, nftablesRules(trafficServices(n)), "nft", "-f")
	case dpIptables:
		return w.installRules(n, iptablesRules(trafficServices(n)), "iptables-restore")
	case dpAgentEBPF, dpAgentIPVS:
		return w.installAgent(ctx, d, n, bin)
	}
	return 0, nil, fmt.Errorf("unknown datapath %d", d)
}

// installRules writes a rule set to a file and loads it in the node with
// the tool kube-proxy uses; removal flushes the node's whole ruleset (the
// node namespace is the benchmark's own).
func (w *trafficWorld) installRules(n int, rules string, tool ...string) (time.Duration, func() error, error) {
	path := filepath.Join(w.dir, fmt.Sprintf("%s-%d.rules", tool[0], n))
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		return 0, nil, err
	}
	defer os.Remove(path)
	remove := func() error {
		var errs []error
		if tool[0] == "iptables-restore" {
			// Empties the tables on iptables-legacy hosts too.
			empty := filepath.Join(w.dir, "empty.rules")
			err := os.WriteFile(empty, []byte("*nat\nCOMMIT\n*filter\nCOMMIT\n"), 0o644)
			if err == nil {
				var out []byte
				if out, err = runIn(w.node.NS, empty, "iptables-restore", "-w"); err != nil {
					err = fmt.Errorf("iptables-restore (empty): %v: %s", err, out)
				}
			}
			errs = append(errs, err)
		}
		if out, err := lab.Run(w.node.NS, "nft", "flush", "ruleset"); err != nil {
			errs = append(errs, fmt.Errorf("nft flush ruleset: %v: %s", err, out))
		}
		return errors.Join(errs...)
	}
	start := time.Now()
	var out []byte
	var err error
	if tool[0] == "iptables-restore" {
		out, err = runIn(w.node.NS, path, "iptables-restore", "-w")
	} else {
		out, err = lab.Run(w.node.NS, tool[0], append(tool[1:], path)...)
	}
	took := time.Since(start)
	if err != nil {
		return 0, nil, errors.Join(fmt.Errorf("%s: %v: %s", tool[0], err, firstLines(string(out), 5)), remove())
	}
	return took, remove, nil
}

// runIn runs a command in ns with a file (or nothing) on its stdin.
func runIn(ns *lab.NS, stdin, bin string, args ...string) ([]byte, error) {
	var f *os.File
	if stdin != "" {
		var err error
		if f, err = os.Open(stdin); err != nil {
			return nil, err
		}
		defer f.Close()
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "--", bin}, args...)...)
	if f != nil {
		cmd.Stdin = f
	}
	return cmd.CombinedOutput()
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// installXvs loads fresh objects (maps sized for the largest size of the
// run), programs the Services with one reconcile.Datapath.Sync, and attaches
// the tc program to the node's client and pod interfaces, as the agent
// does; removal detaches everything and deletes the pins.
func (w *trafficWorld) installXvs(ctx context.Context, n, maxN int) (time.Duration, func() error, error) {
	cfg := loader.DefaultConfig()
	cfg.PinPath = w.pinRoot
	cfg.MaxServiceSlots = max(cfg.MaxServiceSlots, pow2(maxN*(1+len(trafficPodIPs))))
	cfg.MaxServices = max(cfg.MaxServices, pow2(maxN))
	remove := func() error {
		if w.prog != nil {
			w.prog.Close()
			w.prog = nil
		}
		return errors.Join(w.node.Do(func() error { return loader.Cleanup(cfg.PinPath) }), os.RemoveAll(cfg.PinPath))
	}
	_ = remove()
	objs, err := loader.Load(cfg)
	if err != nil {
		return 0, nil, err
	}
	defer objs.Close() // the pins and links keep the datapath alive
	if w.prog, err = objs.XvsTcIngress.Clone(); err != nil {
		return 0, nil, errors.Join(err, remove())
	}
	dp, err := reconcile.NewDatapath(maps.FromObjects(objs), reconcile.Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends})
	if err != nil {
		return 0, nil, errors.Join(err, remove())
	}
	st := &model.State{Services: make(map[model.ServicePortName]*model.ServicePort, n)}
	for _, s := range trafficServices(n) {
		sp := &model.ServicePort{
			Name:         model.ServicePortName{Namespace: s.Namespace, Name: s.Name, Port: s.Port, Protocol: model.TCP},
			Frontends:    []model.Frontend{{Kind: model.ClusterIP, Addr: s.VIP, Port: s.VIPPort, Proto: model.TCP}},
			HasEndpoints: true,
		}
		for _, ep := range s.Endpoints {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, model.Endpoint{Addr: ep.Addr(), Port: ep.Port(), Ready: true, Serving: true, Weight: 1})
		}
		st.Services[sp.Name] = sp
	}
	start := time.Now()
	if err := dp.Sync(ctx, st); err != nil {
		return 0, nil, errors.Join(fmt.Errorf("sync: %w", err), remove())
	}
	took := time.Since(start)
	if p := dp.Problems(); len(p) > 0 {
		return 0, nil, errors.Join(fmt.Errorf("sync problems: %v", p), remove())
	}
	devs := append([]string{w.client.NodeIface}, w.podIfaces()...)
	err = w.node.Do(func() error {
		for _, dev := range devs {
			if _, err := objs.Attach(dev, loader.AttachAuto); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, errors.Join(fmt.Errorf("attach: %w", err), remove())
	}
	return took, remove, nil
}

func (w *trafficWorld) podIfaces() []string {
	var out []string
	for _, p := range w.pods {
		out = append(out, p.NodeIface)
	}
	return out
}

// flushConntrack empties the node's netfilter connection table between
// runs, so that no run inherits another's entries (xvs's own conntrack
// goes with its maps).
func (w *trafficWorld) flushConntrack() error {
	err := w.node.Netlink().ConntrackTableFlush(netlink.ConntrackTable)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("flush conntrack: %w", err)
	}
	return nil
}

// check makes one connection to the first and the last target, so that a
// datapath that does not work fails the run instead of being measured.
func (w *trafficWorld) check(ctx context.Context, d datapath, n int) error {
	ts := targets(d, n)
	for _, t := range []netip.AddrPort{ts[0], ts[len(ts)-1]} {
		var lastErr error
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if lastErr = w.client.Do(func() error { _, err := oneConnection(t, make([]byte, reqSize), make([]byte, 64)); return err }); lastErr == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if lastErr != nil {
			return fmt.Errorf("%s: no connection to %s: %w", d, t, lastErr)
		}
	}
	return nil
}

// measureTraffic runs every datapath at every size, rounds times, in turn.
func measureTraffic(ctx context.Context, opts Options) (_ []trafficResult, err error) {
	to := opts.Traffic
	sizes := slices.Compact(slices.Sorted(slices.Values(to.Sizes)))
	if len(sizes) == 0 {
		return nil, nil
	}
	w, err := newTrafficWorld()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, w.Close()) }()
	maxN := sizes[len(sizes)-1]
	var results []trafficResult
	for _, n := range sizes {
		res := trafficResult{N: n}
		for _, d := range to.datapaths() {
			if d.rules() && n > to.RulesMax {
				continue
			}
			res.Cells[d] = &trafficCell{}
		}
		for round := range to.Rounds {
			for _, d := range to.datapaths() {
				cell := res.Cells[d]
				if cell == nil {
					continue
				}
				if cell.Err != "" {
					continue
				}
				run, took, err := w.measureOne(ctx, d, n, maxN, to, round == 0)
				if err != nil && to.KeepGoing && ctx.Err() == nil {
					cell.Err = err.Error()
					logf(opts.Log, "traffic %d services, %s: failed, going on without it: %v", n, d, err)
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("%d services, %s: %w", n, d, err)
				}
				if round == 0 {
					cell.Program = took
				}
				cell.Runs = append(cell.Runs, run)
				logf(opts.Log, "traffic %d services, round %d, %s: %.0f conn/s (%v CPU each; connect p50 %v p99 %v; %d errors), %.0f req/s (%v CPU each); programmed in %v",
					n, round+1, d, run.CPS.Rate(), run.CPS.CPUPerOp(), run.CPS.P50, run.CPS.P99, run.CPS.Errors+run.RR.Errors, run.RR.Rate(), run.RR.CPUPerOp(), took.Round(time.Millisecond))
			}
		}
		results = append(results, res)
	}
	return results, nil
}

// measureOne installs d, checks it, runs cps then rr, and removes it.
func (w *trafficWorld) measureOne(ctx context.Context, d datapath, n, maxN int, to TrafficOptions, first bool) (run trafficRun, took time.Duration, err error) {
	if err := w.flushConntrack(); err != nil {
		return run, 0, err
	}
	took, remove, err := w.install(ctx, d, n, maxN, to.XvsBin)
	if err != nil {
		return run, 0, err
	}
	defer func() { err = errors.Join(err, remove()) }()
	if err := w.check(ctx, d, n); err != nil {
		return run, 0, err
	}
	ts := targets(d, n)
	if run.CPS, err = runLoad(ctx, w.client.Handle, modeCPS, ts, to.Workers, to.Warmup, to.Window); err != nil {
		return run, 0, err
	}
	if run.RR, err = runLoad(ctx, w.client.Handle, modeRR, ts, to.Workers, to.Warmup, to.Window); err != nil {
		return run, 0, err
	}
	if d == dpXvs && first && w.prog != nil {
		if run.Prog, err = w.progCost(ctx, ts, to); err != nil {
			return run, 0, err
		}
	}
	for _, r := range []loadResult{run.CPS, run.RR} {
		// A datapath that loses connections must not look fast.
		if r.Completed == 0 || r.Errors*100 > r.Completed {
			return run, 0, fmt.Errorf("%d errors for %d completions (first: %s)", r.Errors, r.Completed, r.FirstErr)
		}
	}
	return run, took, nil
}

// progCost runs connections for one window with BPF run-time statistics
// enabled (only while their fd is open) and reads the tc program's run
// count and time as the window opens and closes.
func (w *trafficWorld) progCost(ctx context.Context, ts []netip.AddrPort, to TrafficOptions) (*progCost, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF statistics: %w", err)
	}
	defer stats.Close()
	var before, after *ebpf.ProgramStats
	var serr error
	mark := func(start bool) {
		st, err := w.prog.Stats()
		serr = errors.Join(serr, err)
		if start {
			before = st
		} else {
			after = st
		}
	}
	r, err := runLoadMarked(ctx, w.client.Handle, modeCPS, ts, to.Workers, to.Warmup, to.Window, mark)
	if err = errors.Join(err, serr); err != nil {
		return nil, err
	}
	// Connections in flight at either edge of the window make the
	// per-connection figures approximate to a few in thousands.
	return &progCost{
		Conns:    r.Completed,
		Runs:     after.RunCount - before.RunCount,
		Runtime:  after.Runtime - before.Runtime,
		CPUPerOp: r.CPUPerOp(),
	}, nil
}
