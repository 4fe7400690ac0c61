package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gonum.org/v1/plot/plotter"
)

// RunPeers builds what it needs, runs the peer comparison and writes its
// report and plots.
func RunPeers(ctx context.Context, o PeersOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("the peer comparison creates network namespaces and runs proxies in them: run it as root")
	}
	began, load := time.Now(), loadAvg()
	if o.KubeProxyBin == "" && (slices.Contains(o.Proxies, ppNftables) || slices.Contains(o.Proxies, ppIptables)) {
		var err error
		if o.KubeProxyBin, err = kubeProxyBinary(ctx, o.Log); err != nil {
			return err
		}
	}
	if o.XvsBin == "" && slices.ContainsFunc(o.Proxies, peerProxy.xvs) {
		dir, err := os.MkdirTemp("", "xvs-bench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		var commit string
		if o.XvsBin, commit, err = buildXvsCommitted(ctx, dir); err != nil {
			return err
		}
		logf(o.Log, "peers: xvs built from HEAD (%s)", commit)
	}
	rs, info, err := measurePeers(ctx, o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return err
	}
	base := strings.TrimSuffix(o.Out, filepath.Ext(o.Out))
	plots, err := writePeerPlots(base, o, rs)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	r := peersReport(o, rs, info, plots, peersMachine{LoadStart: load, LoadEnd: loadAvg(), Took: time.Since(began),
		KubeProxy: firstLines(toolVersion(o.KubeProxyBin, "--version"), 1), Xvs: firstLines(toolVersion(o.XvsBin, "--version"), 1),
		Nft: toolVersion("nft", "--version"), Iptables: toolVersion("iptables", "--version")})
	return os.WriteFile(o.Out, r, 0o644)
}

type peersMachine struct {
	LoadStart, LoadEnd            string
	Took                          time.Duration
	KubeProxy, Xvs, Nft, Iptables string
}

// Figures of one run, and how each is read off the rounds.
func peerCPS(r peerRun) float64    { return r.Load.Rate() }
func peerCPU(r peerRun) float64    { return float64(r.CPUPerConn()) }
func peerP99(r peerRun) float64    { return float64(r.Load.P99) }
func peerReady(r peerRun) float64  { return float64(r.Ready) }
func peerErrors(r peerRun) float64 { return float64(r.Load.Errors) }
func peerProxyCPU(r peerRun) float64 {
	if r.Load.Completed == 0 {
		return 0
	}
	return float64(r.ProxyCPU) / float64(r.Load.Completed)
}

func peerMedian(c *peerCell, f func(peerRun) float64) float64 {
	if c == nil || len(c.Runs) == 0 {
		return 0
	}
	v := make([]float64, len(c.Runs))
	for i, r := range c.Runs {
		v[i] = f(r)
	}
	return medianF(v)
}

// peerRatio is the median over rounds of a's figure over b's in the same
// round (inverted for costs: b's over a's, so above 1 is a ahead).
func peerRatio(a, b *peerCell, f func(peerRun) float64, cost bool) float64 {
	if a == nil || b == nil {
		return 0
	}
	var v []float64
	for i := range min(len(a.Runs), len(b.Runs)) {
		x, y := f(a.Runs[i]), f(b.Runs[i])
		if cost {
			x, y = y, x
		}
		if y > 0 {
			v = append(v, x/y)
		}
	}
	return medianF(v)
}

// peerGoal is one line of the summary.
type peerGoal struct {
	name string
	// a over b at every size, for f; met when every ratio is at least min.
	a, b peerCase
	f    func(peerRun) float64
	cost bool
	min  float64
}

func peerGoals(o PeersOptions) []peerGoal {
	var gs []peerGoal
	for _, x := range xvsProxies {
		if !slices.Contains(o.Proxies, x) {
			continue
		}
		xc := func(m bool) peerCase { return peerCase{x, m} }
		for _, masq := range []bool{true, false} {
			tag := "not masqueraded"
			if masq {
				tag = "masqueraded"
			}
			for _, kp := range []peerProxy{ppNftables, ppIptables} {
				if !slices.Contains(o.Proxies, kp) {
					continue
				}
				gs = append(gs,
					peerGoal{fmt.Sprintf("new conn/s, %s: %s ahead of %s at every N", tag, x, kp), xc(masq), peerCase{kp, masq}, peerCPS, false, 1},
					peerGoal{fmt.Sprintf("CPU per connection, %s: %s below %s at every N", tag, x, kp), xc(masq), peerCase{kp, masq}, peerCPU, true, 1})
			}
		}
		for _, kp := range []peerProxy{ppNftables, ppIptables} {
			if slices.Contains(o.Proxies, kp) {
				gs = append(gs, peerGoal{fmt.Sprintf("time to serve N Services from the API server, masqueraded: %s ahead of %s at every N", x, kp), xc(true), peerCase{kp, true}, peerReady, true, 1})
			}
		}
		gs = append(gs,
			peerGoal{fmt.Sprintf("%s masqueraded >= 0.9x %s not masqueraded (new conn/s) at every N", x, x), xc(true), xc(false), peerCPS, false, 0.9},
			peerGoal{fmt.Sprintf("%s not masqueraded >= 0.9x the floor (new conn/s) at every N", x), xc(false), peerCase{Proxy: ppFloor}, peerCPS, false, goalFloorRatio})
	}
	return gs
}

func peersReport(o PeersOptions, rs []peerResult, info *peersWorldInfo, plots map[string]string, m peersMachine) []byte {
	var b bytes.Buffer
	cmd := "`make bench-peers` (`" + o.Command + "`)"
	fmt.Fprintf(&b, "# xvs beside the real kube-proxy\n\n")
	fmt.Fprintf(&b, "Generated by `hack/bench peers`; do not edit by hand. Reproduce with %s, as root; `make bench` runs it after docs/BENCHMARKS.md.\n\n", cmd)
	fmt.Fprintf(&b, "## Summary\n\n")
	fmt.Fprintf(&b, "Every ratio is the median over %d rounds of same-round ratios (each round runs every case once, back to back); costs are inverted, so above 1.00x means xvs is ahead. This run took %v.\n\n", o.Rounds, m.Took.Round(time.Second))
	fmt.Fprintf(&b, "| Goal | Measured | Met | Command |\n|---|---|---|---|\n")
	writePeerGoals(&b, o, rs)
	writeBulkGoals(&b, o, rs)
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "A dash is a size where one side was not measured; sizes with fewer rounds are listed below, with why. Ratios are judged without a noise allowance: one within a few percent of its threshold is a tie rather than a clear result.\n\n")
	writePeerFailures(&b, o, rs)

	writePeersMachine(&b, o, info, m)
	fmt.Fprintln(&b)
	writePeersMethod(&b, o)

	writePeerResults(&b, o, rs, plots)
	writePeersNotes(&b)
	return b.Bytes()
}

// writePeerGoals writes the summary's table: each goal's ratio at every
// size and whether it was met.
func writePeerGoals(b *bytes.Buffer, o PeersOptions, rs []peerResult) {
	for _, g := range peerGoals(o) {
		var parts []string
		met, any := true, false
		for _, r := range rs {
			a, bc := r.Cells[g.a], r.Cells[g.b]
			v := peerRatio(a, bc, g.f, g.cost)
			if v == 0 {
				parts = append(parts, fmt.Sprintf("%d: –", r.N))
				met = false
				continue
			}
			any = true
			parts = append(parts, fmt.Sprintf("%d: %.2fx", r.N, v))
			met = met && v >= g.min
		}
		verdict := yesNo(met && any)
		if !any {
			verdict = "not measured"
		}
		fmt.Fprintf(b, "| %s | %s | %s | `make bench-peers` |\n", g.name, strings.Join(parts, ", "), verdict)
	}
}

// writePeersMachine writes the machine and the run's parameters.
func writePeersMachine(b *bytes.Buffer, o PeersOptions, info *peersWorldInfo, m peersMachine) {
	var u unix.Utsname
	_ = unix.Uname(&u)
	fmt.Fprintf(b, "## Machine and run\n\n")
	fmt.Fprintf(b, "- Kernel: `%s %s %s` (%s)\n", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]),
		unix.ByteSliceToString(u.Machine[:]), unix.ByteSliceToString(u.Version[:]))
	fmt.Fprintf(b, "- CPU: %s, %d cores available\n", cpuModel(), runtime.NumCPU())
	fmt.Fprintf(b, "- Date: %s; duration %v\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), m.Took.Round(time.Second))
	fmt.Fprintf(b, "- Load average (1, 5, 15 min; the machine is shared with other sessions): %s at the start, %s at the end\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(b, "- kube-proxy: `%s`, built from the k8s.io/kubernetes module by `make kube-proxy` (test/kubeproxy); xvs: `%s`; nft: `%s`; iptables: `%s`\n", m.KubeProxy, m.Xvs, m.Nft, m.Iptables)
	fmt.Fprintf(b, "- Command: `%s` (sizes %s, %d rounds, %d workers, masqueraded windows %v, unmasqueraded and floor windows %v, %v warm-up each)\n",
		o.Command, joinInts(o.Sizes), o.Rounds, o.Workers, o.Window, o.WindowUnmasq, o.Warmup)
	if info != nil {
		var cs []string
		for _, c := range info.Created {
			cs = append(cs, fmt.Sprintf("%d in %v", c.N, c.Took.Round(time.Millisecond)))
		}
		fmt.Fprintf(b, "- Services written to the API server before each size (cumulative): %s\n", strings.Join(cs, ", "))
		if info.HostRulesUnchanged {
			fmt.Fprintf(b, "- The host namespace's `nft list ruleset` was the same at the end of the run as at its start.\n")
		} else {
			fmt.Fprintf(b, "- The host namespace's `nft list ruleset` differed at the end of the run from its start (the machine is shared: another session may have changed it; the proxies ran in the node namespace only).\n")
		}
	}
}

// writePeerResults writes the measurements, one table (and plot) each.
func writePeerResults(b *bytes.Buffer, o PeersOptions, rs []peerResult, plots map[string]string) {
	fmt.Fprintf(b, "## Results\n\n")
	if p := plots["cps"]; p != "" {
		fmt.Fprintf(b, "![new connections per second against the number of Services](%s)\n\n", p)
	}
	cases := o.cases()
	writePeerTable(b, "New TCP connections per second", "Median conn/s over the rounds.", rs, cases, func(c *peerCell) string {
		return fmtNum(peerMedian(c, peerCPS), "%.0f")
	})
	writePeerRatioTable(b, o, rs)
	if p := plots["cpu"]; p != "" {
		fmt.Fprintf(b, "![CPU per connection against the number of Services](%s)\n\n", p)
	}
	writePeerTable(b, "CPU per connection (µs)", "Median over the rounds of (benchmark process + proxy process + ksoftirqd CPU time) / connections, in the window; in brackets the proxy process's own share.", rs, cases, func(c *peerCell) string {
		v := peerMedian(c, peerCPU)
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f (%.2f)", v/1e3, peerMedian(c, peerProxyCPU)/1e3)
	})
	writePeerTable(b, "connect() time, p99 (µs)", "Median over the rounds of each window's p99 connect() time (SYN to SYN-ACK through the node, under full load on two shared cores).", rs, cases, func(c *peerCell) string {
		return fmtUS(peerMedian(c, peerP99))
	})
	writePeerTable(b, "Failed connections", "Connects, sends or receives that failed or timed out (2 s), summed over the rounds' windows.", rs, cases, func(c *peerCell) string {
		if c == nil || len(c.Runs) == 0 {
			return "–"
		}
		t := 0.0
		for _, r := range c.Runs {
			t += peerErrors(r)
		}
		return fmt.Sprintf("%.0f", t)
	})
	var xcases []peerCase
	for _, c := range cases {
		if c.Proxy.xvs() {
			xcases = append(xcases, c)
		}
	}
	writePeerTable(b, "xvs's drop verdicts", "Nonzero drop verdict counters (packets) of the agent at the end of each window, from its start, summed over the rounds (`xvs list --stats`).", rs, xcases, func(c *peerCell) string {
		if c == nil || len(c.Runs) == 0 {
			return "–"
		}
		sum := map[string]uint64{}
		for _, r := range c.Runs {
			for k, v := range r.Drops {
				sum[k] += v
			}
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(sum)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, sum[k]))
		}
		if len(parts) == 0 {
			return "none"
		}
		return strings.Join(parts, ", ")
	})
	writeBulkResults(b, o, rs, plots)
	writePeerTable(b, "Time to serve N Services from the API server", "Median over the rounds, from the process's start to the first and the last Service answering through it: its informers' list, its first full sync and the kernel's programming.", rs, cases, func(c *peerCell) string {
		v := peerMedian(c, peerReady)
		if v == 0 {
			return "–"
		}
		return time.Duration(v).Round(time.Millisecond).String()
	})
}

func fmtNum(v float64, f string) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf(f, v)
}

// writePeerTable is one row per size, one column per case.
func writePeerTable(b *bytes.Buffer, title, note string, rs []peerResult, cases []peerCase, cell func(*peerCell) string) {
	fmt.Fprintf(b, "### %s\n\n%s\n\n| Services |", title, note)
	for _, c := range cases {
		fmt.Fprintf(b, " %s |", c)
	}
	fmt.Fprintf(b, "\n|---:|%s\n", strings.Repeat("---:|", len(cases)))
	for _, r := range rs {
		fmt.Fprintf(b, "| %d |", r.N)
		for _, c := range cases {
			fmt.Fprintf(b, " %s |", cell(r.Cells[c]))
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

// writePeerRatioTable: xvs against each peer, masqueraded and not, and
// each against the floor.
func writePeerRatioTable(b *bytes.Buffer, o PeersOptions, rs []peerResult) {
	type col struct {
		name string
		a, c peerCase
	}
	var cols []col
	floor := peerCase{Proxy: ppFloor}
	for _, masq := range []bool{false, true} {
		tag := "not masq."
		if masq {
			tag = "masq."
		}
		for _, x := range xvsProxies {
			for _, p := range []peerProxy{ppNftables, ppIptables} {
				if slices.Contains(o.Proxies, p) && slices.Contains(o.Proxies, x) {
					cols = append(cols, col{fmt.Sprintf("%s / %s, %s", x.short(), p.short(), tag), peerCase{x, masq}, peerCase{p, masq}})
				}
			}
		}
		for _, p := range []peerProxy{ppNftables, ppIptables, ppXvs, ppXvsBypass} {
			if slices.Contains(o.Proxies, p) {
				cols = append(cols, col{fmt.Sprintf("%s / floor, %s", p.short(), tag), peerCase{p, masq}, floor})
			}
		}
	}
	fmt.Fprintf(b, "### Ratios of new connections per second\n\nMedians of same-round ratios.\n\n| Services |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c.name)
	}
	fmt.Fprintf(b, "\n|---:|%s\n", strings.Repeat("---:|", len(cols)))
	for _, r := range rs {
		fmt.Fprintf(b, "| %d |", r.N)
		for _, c := range cols {
			fmt.Fprintf(b, " %s |", fmtRatio(peerRatio(r.Cells[c.a], r.Cells[c.c], peerCPS, false)))
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

func writePeerFailures(b *bytes.Buffer, o PeersOptions, rs []peerResult) {
	any := false
	for _, r := range rs {
		for _, c := range o.cases() {
			cell := r.Cells[c]
			switch {
			case cell.Err != "":
				fmt.Fprintf(b, "- **%s at %d Services: stopped after %d measured round(s).** %s\n", c, r.N, len(cell.Runs), strings.ReplaceAll(tail(strings.TrimSpace(cell.Err), 3), "\n", " / "))
			case cell.Note != "":
				fmt.Fprintf(b, "- **%s at %d Services: %d round(s).** %s.\n", c, r.N, len(cell.Runs), cell.Note)
			default:
				continue
			}
			any = true
		}
	}
	if any {
		fmt.Fprintln(b)
	}
}

func writePeersMethod(b *bytes.Buffer, o PeersOptions) {
	fmt.Fprintf(b, "## Method\n\n")
	fmt.Fprintf(b, `- **Topology** (package lab, as in docs/BENCHMARKS.md's real-traffic section): a node network namespace (%s on lo, forwarding) with three pod namespaces (%s) behind veths, and an external client namespace (%s) behind another veth. The client's `+"`ip_local_port_range`"+` is 1024-65535 and `+"`tcp_tw_reuse`"+` is 1.
- **API server**: one kube-apiserver v1.37 with embedded etcd (lab/kubeapi) for the whole run, on the host's loopback, relayed into the node namespace at the same address. N ClusterIP Services (port 80/TCP, Service i at 10.96.0.%s+i, the API server's own `+"`kubernetes`"+` Service at 10.96.0.1) and one EndpointSlice each with the three pods (port 8080, ready) are created through it before each size, added to the previous size's; a Node object `+"`%s`"+` carries the node's InternalIP.
- **Proxies**, each a process started in the node namespace with `+"`nsenter --net`"+` (so it writes rules and sysctls there only) on the same KubeProxyConfiguration file, which differs only in `+"`mode`"+` (nftables, iptables, ebpf) and, in the masqueraded cases, `+"`clusterCIDR: %s`"+`: `+"`hostnameOverride`"+` the Node, `+"`clientConnection.kubeconfig`"+` the API server's, `+"`conntrack.maxPerCore: 0`"+`. Everything else is each program's default.
  - **kube-proxy nftables / iptables**: upstream kube-proxy v1.37.2, `+"`cmd/kube-proxy`"+` of k8s.io/kubernetes built from the Go modules (test/kubeproxy, cached under /var/cache/xvs/kube-proxy).
  - **xvs (ebpf)** and **xvs (ebpf, bypass)**: the real `+"`xvs agent`"+` binary, with its defaults and with `+"`--netfilter-mode=bypass`"+` (docs/nodes.md: by default translated Service traffic passes the node's netfilter hooks and netfilter masquerades it, from xvs's own nftables table; in bypass mode it skips them and xvs masquerades in BPF), built from the repository's HEAD (`+"`git archive`"+`, so no uncommitted change is measured; `+"`-xvs-bin`"+` replaces it), with a private `+"`--pin-path`"+`.
  - **no proxy (floor)**: nothing runs; the client connects to the pod addresses themselves, through the same node.
- **Masquerade**: with `+"`clusterCIDR`"+` set, the client (outside it) is off-cluster, and kube-proxy (a `+"`mark-for-masquerade`"+` rule per Service, MASQUERADE with `+"`--random-fully`"+`) and xvs (in BPF) masquerade it to the node's address; without it neither does. Before every window one connection checks it: the pod that answers records the source it saw, and a case whose masquerade is not what it should be fails instead of being measured.
- **Load**: %d workers, each an OS thread in the client namespace looping connect, send 16 bytes, receive 16 bytes, close (raw non-blocking sockets and poll(2)), %s: every connection is a new flow. Only completions inside the window count; a window follows a %v warm-up.
- **Bulk** (at the smallest size, `+"`-bulk-streams`"+`): after its connection window, each case runs long TCP streams, in each direction with each number of parallel streams, for %v after %v of warm-up: the unmasqueraded cases to Service 0's ClusterIP, the masqueraded ones to its NodePort on the node's address (eTP=Cluster; every proxy masquerades it, and a check connection must see the node's address, not the client's), the floor to the pods. A download's pod sends a fixed 64 KiB xorshift pattern, repeated, and the client checks every byte it reads; an upload's client sends it, half-closes at the end, and the pod checks every byte and answers with the count it read, which must equal what the client wrote. A stream that fails, stalls for 2 s or moves nothing fails the case. Throughput is the payload moved inside the window (read by the client, or written by it: in steady state the socket buffers hold as much at the window's end as at its start).
- **Rounds**: each size runs %d rounds; a round runs every case once, one after another (the proxy started, its first sync awaited, the window, the proxy stopped), each round starting one case later than the previous one. The node's netfilter conntrack table is flushed before each case.
- **CPU per connection**: the benchmark process's user+system time (the load generator, the pods' servers, and the kernel's forwarding, NAT and conntrack done in their context: this kernel has no IRQ time accounting, so a softirq is charged to the task it interrupts) plus the proxy process's (from /proc/PID/stat) plus the ksoftirqd threads', over the window, divided by the connections completed in it.
- **Cleanup** after every case: the process is stopped by its PID (SIGTERM, then SIGKILL), its own cleanup runs (`+"`kube-proxy --cleanup`"+`, `+"`xvs cleanup`"+`), the node's ruleset is flushed and checked empty, and the node namespace's conntrack timeouts and `+"`route_localnet`"+` are put back. The namespaces, servers, API server and every process go when the run ends, on every path.

`, trafficNodeIP, joinAddrs(trafficPodIPs), trafficClientIP, "2", peersNode, peersClusterCIDR, o.Workers, targetsText(o), o.Warmup, o.BulkWindow, o.BulkWarmup, o.Rounds)
}

func writePeersNotes(b *bytes.Buffer) {
	fmt.Fprintf(b, `## What differs from a cluster, and why

- **Conntrack sysctls.** kube-proxy raises `+"`nf_conntrack_max`"+` to max(32768 per core, 131072) and the module's `+"`hashsize`"+` to a quarter of it, both global to the machine (the module parameter is under /sys, and the node namespace shares the host's). Here `+"`conntrack.maxPerCore: 0`"+` leaves them alone, for both proxies; on this machine (131072 and 262144) kube-proxy's defaults would not have changed them either. The per-namespace TCP timeouts (established 24 h, CLOSE_WAIT 1 h) are set by both, in the node namespace.
- **The `+"`conntrack`"+` tool** is not used by kube-proxy v1.37 (it deletes stale UDP flows over netlink); nothing here needs it.
- **One node, no kubelet or CNI**: pods are namespaces with veths and routes (lab), EndpointSlices are written by the benchmark as the EndpointSlice controller would.

## The shape-alike rule sets

docs/BENCHMARKS.md still compares xvs with nftables and iptables rule sets written by the benchmark in kube-proxy's shape (hack/bench/rules.go). What they add beside this report: the kept-alive request rate, the cost of loading the rule set alone (`+"`nft -f`"+`, `+"`iptables-restore`"+`) without kube-proxy's own sync, and runs without an API server (so in the VM rig too). For new connections per second and CPU per connection against kube-proxy, this report's figures are the ones to quote.
`)
}

// writePeerPlots draws conn/s and CPU per connection against N, one line
// per case.
func writePeerPlots(base string, o PeersOptions, rs []peerResult) (map[string]string, error) {
	plots := map[string]string{}
	if len(rs) == 0 {
		return plots, nil
	}
	lines := func(f func(peerRun) float64, scale float64) []any {
		var out []any
		for _, c := range o.cases() {
			var xy plotter.XYs
			for _, r := range rs {
				if v := peerMedian(r.Cells[c], f); v > 0 {
					xy = append(xy, plotter.XY{X: float64(r.N), Y: v / scale})
				}
			}
			if len(xy) > 0 {
				out = append(out, c.String(), xy)
			}
		}
		return out
	}
	for _, s := range []struct {
		key, title, ylabel string
		f                  func(peerRun) float64
		scale              float64
	}{
		{"cps", "New TCP connections per second, real proxies (median of rounds)", "connections / s", peerCPS, 1},
		{"cpu", "CPU per new connection, real proxies (median of rounds)", "µs", peerCPU, 1e3},
	} {
		path := base + "-" + s.key + ".png"
		if err := linePlot(path, s.title, s.ylabel, rs[0].N, rs[len(rs)-1].N, lines(s.f, s.scale)); err != nil {
			return nil, fmt.Errorf("%s: %w", s.key, err)
		}
		plots[s.key] = filepath.Base(path)
	}
	if r, ok := bulkResultAt(o, rs); ok {
		path := base + "-bulk.png"
		if err := bulkPlot(path, o, r); err != nil {
			return nil, fmt.Errorf("bulk: %w", err)
		}
		plots["bulk"] = filepath.Base(path)
	}
	return plots, nil
}

func targetsText(o PeersOptions) string {
	if o.OneService {
		return "all to Service 0's VIP (`-targets one`: the N Services are programmed, the traffic is the same at every N; the floor connects to the pods)"
	}
	return "to every VIP in turn (worker w's k-th connection to Service (w + k x workers) mod N; `-targets spread`, the default; the floor connects to the pods)"
}
