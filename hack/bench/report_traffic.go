package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The real-traffic goals.
const (
	goalFloorRatio = 0.9 // cps through a VIP at least 0.9x the no-proxy floor
	// Latency counts as flat when the median connect() time at every N is
	// within 1.2x of N = 1 (1.5x for the p99, which is noisier).
	flatP50 = 1.2
	flatP99 = 1.5
)

// median of a figure over the rounds of one cell.
// failures lists the datapaths that could not be measured, with why.
func writeFailures(b *bytes.Buffer, rs []trafficResult) {
	for _, r := range rs {
		for d := range numDatapaths {
			if c := r.Cells[d]; c != nil && c.Err != "" {
				fmt.Fprintf(b, "- **%s at %d Services: not measured.** %s\n", d, r.N, strings.ReplaceAll(tail(strings.TrimSpace(c.Err), 3), "\n", " / "))
			}
		}
	}
	fmt.Fprintln(b)
}

func cellMedian(c *trafficCell, f func(trafficRun) float64) float64 {
	if c == nil || len(c.Runs) == 0 {
		return 0
	}
	v := make([]float64, len(c.Runs))
	for i, r := range c.Runs {
		v[i] = f(r)
	}
	return medianF(v)
}

// roundRatio is the median over rounds of a's figure over b's in the same
// round: both ran back to back under the same noise.
func roundRatio(a, b *trafficCell, f func(trafficRun) float64) float64 {
	if a == nil || b == nil {
		return 0
	}
	var v []float64
	for i := range min(len(a.Runs), len(b.Runs)) {
		if d := f(b.Runs[i]); d > 0 {
			v = append(v, f(a.Runs[i])/d)
		}
	}
	return medianF(v)
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cps(r trafficRun) float64 { return r.CPS.Rate() }

// The CPU metrics are costs: the benchmark process's CPU time per
// connection or request, in ns. Their ratios are inverted (b's cost over
// a's) so that every ratio in the report reads as relative throughput.
func cpuConn(r trafficRun) float64 { return float64(r.CPS.CPUPerOp()) }
func cpuReq(r trafficRun) float64  { return float64(r.RR.CPUPerOp()) }

// metric is one figure of the real-traffic runs.
type metric struct {
	f    func(trafficRun) float64
	cost bool // lower is better; ratios are inverted
}

var (
	mCPS     = metric{cps, false}
	mRPS     = metric{rps, false}
	mCPUConn = metric{cpuConn, true}
	mCPUReq  = metric{cpuReq, true}
)

// ratio is a's figure relative to b's, as relative throughput, median over
// same-round pairs.
func (m metric) ratio(a, b *trafficCell) float64 {
	if m.cost {
		return roundRatio(b, a, m.f)
	}
	return roundRatio(a, b, m.f)
}
func rps(r trafficRun) float64 { return r.RR.Rate() }
func p50(r trafficRun) float64 { return float64(r.CPS.P50) }
func p99(r trafficRun) float64 { return float64(r.CPS.P99) }

func toolVersion(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return bin + ": not found"
	}
	return strings.TrimSpace(firstLines(string(out), 1))
}

// trafficReport renders the real-traffic section.
func trafficReport(opts Options, rs []trafficResult, plots map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Real traffic through a node\n\n")
	if len(rs) == 0 {
		fmt.Fprintf(&b, "Not run (no -traffic-sizes).\n\n")
		return b.Bytes()
	}
	to := opts.Traffic
	fmt.Fprintf(&b, "Command: `%s` (traffic sizes %s; iptables and nftables up to %d Services; %d rounds; %d workers; %v warm-up and %v measured per run).\n\n",
		opts.Command, joinInts(to.Sizes), to.RulesMax, to.Rounds, to.Workers, to.Warmup, to.Window)
	fmt.Fprintf(&b, `### Method

- Topology (package lab): a node namespace (%s on lo, forwarding) with three pod namespaces (%s) behind veths and a client namespace (%s) behind another veth. Every datapath uses the same namespaces, the same servers and the same load generator; only one datapath is installed at a time, and the node's netfilter conntrack table is flushed before each run.
- N ClusterIP Services: Service i is %s+1+i port %d/TCP with the three pods on port %d as endpoints.
- Datapaths:
  - **%s**: the client connects to the pod addresses themselves, through the same node, with nothing installed (no rules, no conntrack, no program).
  - **%s**: the xvs objects loaded in-process with `+"`loader.Load`"+` (maps sized for the largest N of the run), the N Services written with one `+"`reconcile.Datapath.Sync`"+`, and the tc program attached to the client's and the pods' node-side interfaces, as the agent does (the agent binary's map sizes are fixed at 65536 Services, below 100k).
  - **%s**: kube-proxy's nftables-mode shape loaded with `+"`nft -f`"+` (table `+"`ip kube-proxy`"+`: a service-ips verdict map to a chain per Service, `+"`numgen random mod 3 vmap`"+` to endpoint chains that DNAT, masquerade marking, the cluster-ips check for new connections in forward). %s.
  - **%s**: kube-proxy's iptables-mode shape loaded with `+"`iptables-restore`"+` (nat KUBE-SERVICES with one rule per Service, KUBE-SVC-* chains with `+"`statistic --mode random`"+` probabilities 1/3, 1/2, 1, KUBE-SEP-* chains that DNAT, KUBE-MARK-MASQ/KUBE-POSTROUTING, filter KUBE-FORWARD). %s.
- The load generator (hack/bench/loadgen.go) runs inside the client namespace: %d worker threads that joined it, each with raw non-blocking sockets and poll(2). **Connections per second**: each worker loops connect, send %d bytes, read the %d-byte reply, close; worker w's k-th connection goes to VIP (w + k*workers) mod N, so the connections sweep all N Services. **connect() time** of those connections (SYN sent to SYN-ACK received, plus two syscalls) is the first-packet latency. **Requests per second**: each worker keeps one connection open and loops request and reply. The client closes first and reuses TIME_WAIT ports (tcp_tw_reuse).
- The servers (hack/bench/loadgen.go) run in the benchmark process with their sockets in the pod namespaces. Client, servers, node forwarding and the datapath share this machine's cores, as they would on one node.
- Before each run one connection to the first and to the last VIP must succeed, and a run with more than 1%% failed connections or requests fails the benchmark.
- Each round runs every datapath once at a size, one after the other; figures are medians over the rounds, and ratios are medians of the per-round ratios (both figures from the same round).

`, trafficNodeIP, joinAddrs(trafficPodIPs), trafficClientIP, trafficVIPBase, trafficVIPPort, trafficPodPort,
		dpFloor, dpXvs, dpNftables, toolVersion("nft", "--version"), dpIptables, toolVersion("iptables", "--version"),
		to.Workers, reqSize, respSize)

	fmt.Fprintf(&b, `**Two views of the same runs.** The rate (connections or requests per second) is what the goals are stated in, but on this machine it moves by tens of percent from one run to the next, because other sessions share the two cores (load average %s when the report was written). The benchmark process's own CPU time per connection or request (client, servers, and the kernel's forwarding and datapath work, which runs mostly in their context as softirqs) does not depend on what others run; with the cores saturated, it is what sets the rate. CPU-based ratios are the floor's cost over the datapath's cost, so that every ratio below reads as relative throughput (higher is better). Goals are judged on both.

`, loadAvg())
	if p := plots["cps"]; p != "" {
		fmt.Fprintf(&b, "![new connections per second against the number of Services](%s)\n\n", p)
	}
	writeMetricTable(&b, "New TCP connections per second", "conn/s", "%.0f", 1, rs, mCPS)
	if p := plots["cpu"]; p != "" {
		fmt.Fprintf(&b, "![CPU time per connection against the number of Services](%s)\n\n", p)
	}
	writeMetricTable(&b, "CPU time per new connection (µs)", "µs of process CPU per connection", "%.1f", 1e3, rs, mCPUConn)
	writeProgCost(&b, rs)
	if p := plots["rr"]; p != "" {
		fmt.Fprintf(&b, "![requests per second over kept-alive connections against the number of Services](%s)\n\n", p)
	}
	writeMetricTable(&b, "Requests per second over kept-alive connections", "req/s", "%.0f", 1, rs, mRPS)
	writeMetricTable(&b, "CPU time per request over kept-alive connections (µs)", "µs of process CPU per request", "%.1f", 1e3, rs, mCPUReq)
	if p := plots["latency"]; p != "" {
		fmt.Fprintf(&b, "![connect() time against the number of Services](%s)\n\n", p)
	}
	writeLatencyTable(&b, rs)
	writeProgramTable(&b, rs)
	writeTrafficGoals(&b, rs)
	return b.Bytes()
}

func joinAddrs[T fmt.Stringer](as []T) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// present lists the datapaths measured at some size, in enum order.
func present(rs []trafficResult) []datapath {
	var out []datapath
	for d := range numDatapaths {
		if slices.ContainsFunc(rs, func(r trafficResult) bool { return r.Cells[d] != nil }) {
			out = append(out, d)
		}
	}
	return out
}

// ratioPairs are the comparisons a table shows: every datapath against
// the floor, then xvs against the rule-based datapaths.
func ratioPairs(ds []datapath) [][2]datapath {
	var out [][2]datapath
	for _, d := range ds {
		if d != dpFloor {
			out = append(out, [2]datapath{d, dpFloor})
		}
	}
	for _, x := range []datapath{dpXvs, dpAgentEBPF} {
		for _, o := range []datapath{dpNftables, dpIptables, dpAgentIPVS} {
			if slices.Contains(ds, x) && slices.Contains(ds, o) {
				out = append(out, [2]datapath{x, o})
			}
		}
	}
	return out
}

func writeMetricTable(b *bytes.Buffer, title, unit, format string, scale float64, rs []trafficResult, m metric) {
	fmt.Fprintf(b, "### %s\n\n", title)
	inv := ""
	if m.cost {
		inv = " (inverted: the second's cost over the first's)"
	}
	fmt.Fprintf(b, "Median %s over the rounds; ratios%s are medians of same-round ratios.\n\n", unit, inv)
	ds := present(rs)
	pairs := ratioPairs(ds)
	fmt.Fprintf(b, "| Services |")
	for _, d := range ds {
		fmt.Fprintf(b, " %s |", d)
	}
	for _, p := range pairs {
		fmt.Fprintf(b, " %s / %s |", p[0].short(), p[1].short())
	}
	fmt.Fprintf(b, "\n|---:|%s\n", strings.Repeat("---:|", len(ds)+len(pairs)))
	for _, r := range rs {
		fmt.Fprintf(b, "| %d |", r.N)
		for _, d := range ds {
			v := cellMedian(r.Cells[d], m.f)
			if v == 0 {
				fmt.Fprintf(b, " – |")
			} else {
				fmt.Fprintf(b, " "+format+" |", v/scale)
			}
		}
		for _, p := range pairs {
			fmt.Fprintf(b, " %s |", fmtRatio(m.ratio(r.Cells[p[0]], r.Cells[p[1]])))
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

// writeProgCost says how much of xvs's extra CPU per connection is the tc
// program itself, from the kernel's BPF run-time statistics.
func writeProgCost(b *bytes.Buffer, rs []trafficResult) {
	var rows []string
	for _, r := range rs {
		x, f := r.Cells[dpXvs], r.Cells[dpFloor]
		if x == nil || f == nil || len(x.Runs) == 0 || x.Runs[0].Prog == nil || x.Runs[0].Prog.Conns == 0 || x.Runs[0].Prog.Runs == 0 {
			continue
		}
		p := x.Runs[0].Prog
		perConn := float64(p.Runtime) / float64(p.Conns)
		extra := cellMedian(x, cpuConn) - cellMedian(f, cpuConn)
		rows = append(rows, fmt.Sprintf("| %d | %.1f | %.0f | %.1f | %.1f |", r.N, float64(p.Runs)/float64(p.Conns),
			float64(p.Runtime)/float64(p.Runs), perConn/1e3, extra/1e3))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "### Where xvs's extra cost per connection goes\n\n")
	fmt.Fprintf(b, "A separate connections run per size (first round, not counted above) with the kernel's BPF run-time statistics on: how often `xvs_tc_ingress` ran per connection (both directions: client to VIP on the client's interface, replies on the pods' interfaces) and for how long, beside the difference of the medians of CPU per connection (xvs minus floor). What the program does not explain is the rest of the tc path (TCX dispatch, FIB lookup, `bpf_redirect_neigh` instead of the stack's forwarding).\n\n")
	fmt.Fprintf(b, "| Services | program runs per connection | ns per run | program µs per connection | xvs CPU minus floor CPU per connection (µs) |\n|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		fmt.Fprintln(b, row)
	}
	fmt.Fprintln(b)
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func fmtRatio(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2fx", v)
}

func fmtUS(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", v/1e3)
}

func writeLatencyTable(b *bytes.Buffer, rs []trafficResult) {
	fmt.Fprintf(b, "### First-packet latency: connect() time (µs)\n\n")
	fmt.Fprintf(b, "p50 / p99 of every connection of the connections-per-second run, median over the rounds. Under full load, so queueing on the two shared cores is part of it.\n\n")
	ds := present(rs)
	fmt.Fprintf(b, "| Services |")
	for _, d := range ds {
		fmt.Fprintf(b, " %s p50 | %s p99 |", d.short(), d.short())
	}
	fmt.Fprintf(b, "\n|---:|%s\n", strings.Repeat("---:|", 2*len(ds)))
	for _, r := range rs {
		fmt.Fprintf(b, "| %d |", r.N)
		for _, d := range ds {
			fmt.Fprintf(b, " %s | %s |", fmtUS(cellMedian(r.Cells[d], p50)), fmtUS(cellMedian(r.Cells[d], p99)))
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

func writeProgramTable(b *bytes.Buffer, rs []trafficResult) {
	fmt.Fprintf(b, "### Time to program N Services (3 endpoints each)\n\n")
	fmt.Fprintf(b, "First round; xvs: one `reconcile.Datapath.Sync` into empty maps; nftables: `nft -f` of the whole rule set; iptables: `iptables-restore` of the whole rule set (rule rendering not counted); agent: from the agent's start to the last Service answering (reading the manifests, translating, programming).\n\n")
	ds := slices.DeleteFunc(present(rs), func(d datapath) bool { return d == dpFloor })
	fmt.Fprintf(b, "| Services |")
	for _, d := range ds {
		fmt.Fprintf(b, " %s |", d)
	}
	fmt.Fprintf(b, "\n|---:|%s\n", strings.Repeat("---:|", len(ds)))
	for _, r := range rs {
		fmt.Fprintf(b, "| %d |", r.N)
		for _, d := range ds {
			if c := r.Cells[d]; c != nil && len(c.Runs) > 0 {
				fmt.Fprintf(b, " %v |", c.Program.Round(time.Millisecond/10))
			} else {
				fmt.Fprintf(b, " – |")
			}
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

func writeTrafficGoals(b *bytes.Buffer, rs []trafficResult) {
	fmt.Fprintf(b, "### Goals\n\n")
	fmt.Fprintf(b, "| Goal | Services | Rate view | CPU view | Met (rate / CPU) |\n|---|---:|---|---|---|\n")
	for _, r := range rs {
		x := r.Cells[dpXvs]
		if x == nil {
			continue
		}
		rc, cc := mCPS.ratio(x, r.Cells[dpFloor]), mCPUConn.ratio(x, r.Cells[dpFloor])
		fmt.Fprintf(b, "| conn/s through a VIP >= %.1fx the floor | %d | %.2fx | %.2fx | %s / %s |\n", goalFloorRatio, r.N, rc, cc,
			yesNo(rc >= goalFloorRatio), yesNo(cc >= goalFloorRatio))
	}
	for _, r := range rs {
		x := r.Cells[dpXvs]
		for _, d := range []datapath{dpNftables, dpIptables} {
			if x == nil || r.Cells[d] == nil {
				continue
			}
			c, q := mCPS.ratio(x, r.Cells[d]), mRPS.ratio(x, r.Cells[d])
			cc, cq := mCPUConn.ratio(x, r.Cells[d]), mCPUReq.ratio(x, r.Cells[d])
			fmt.Fprintf(b, "| never slower than %s | %d | conn/s %.2fx, req/s %.2fx | per conn %.2fx, per req %.2fx | %s / %s |\n", d, r.N, c, q, cc, cq,
				yesNo(c >= 1 && q >= 1), yesNo(cc >= 1 && cq >= 1))
		}
	}
	base := rs[0]
	if bx := base.Cells[dpXvs]; bx != nil {
		b50, b99 := cellMedian(bx, p50), cellMedian(bx, p99)
		for _, r := range rs[1:] {
			x := r.Cells[dpXvs]
			if x == nil || b50 == 0 || b99 == 0 {
				continue
			}
			r50, r99 := cellMedian(x, p50)/b50, cellMedian(x, p99)/b99
			fmt.Fprintf(b, "| xvs connect() time flat in N (p50 <= %.1fx, p99 <= %.1fx of %d Service(s)) | %d | p50 %.2fx, p99 %.2fx | | %s |\n",
				flatP50, flatP99, base.N, r.N, r50, r99, yesNo(r50 <= flatP50 && r99 <= flatP99))
		}
	}
	fmt.Fprintf(b, "\nRatios are judged without a noise allowance: one within a few percent of the threshold is a tie rather than a clear result.\n\n")
	for _, r := range slices.Backward(rs) { // the largest size measured
		x, f := r.Cells[dpXvs], r.Cells[dpFloor]
		if x == nil || f == nil || len(x.Runs) == 0 || x.Runs[0].Prog == nil || x.Runs[0].Prog.Conns == 0 || x.Runs[0].Prog.Runs == 0 {
			continue
		}
		p := x.Runs[0].Prog
		extra := cellMedian(x, cpuConn) - cellMedian(f, cpuConn)
		if extra <= 0 {
			continue
		}
		fmt.Fprintf(b, "**What limits conn/s through xvs** (at %d Services): a connection is %.0f packets through `xvs_tc_ingress` at %.0f ns each in this traffic (more than the %s of the per-packet figures above, which run on warm caches), %.1f µs per connection, against %.1f µs of extra CPU per connection over the floor (the program's run time is %.0f%% of that gap). Staying within 10%% of the floor needs the whole extra cost below %.1f µs per connection, i.e. about %.0f ns per packet if the program were all of it.\n\n",
			r.N, float64(p.Runs)/float64(p.Conns), float64(p.Runtime)/float64(p.Runs), "BPF_PROG_TEST_RUN medians",
			float64(p.Runtime)/float64(p.Conns)/1e3, extra/1e3, 100*float64(p.Runtime)/float64(p.Conns)/extra,
			cellMedian(f, cpuConn)/9/1e3, cellMedian(f, cpuConn)/9/(float64(p.Runs)/float64(p.Conns)))
		break
	}
	fmt.Fprintf(b, `**The real kube-proxy** v1.37.2, in nftables and iptables mode, beside the real xvs agent, reading the same API server, masqueraded and not: [BENCHMARKS-peers.md](BENCHMARKS-peers.md) (`+"`make bench-peers`"+`, which `+"`make bench`"+` runs after this report). The rule sets here have kube-proxy's shape but not all of its rules (no NodePort, firewall or health-check chains, no masquerade of off-cluster clients), and no kube-proxy process: the figures above are the rule-matching and NAT part of kube-proxy's cost, and the kept-alive and rule-loading figures the peer report does not have.

`)
}

// writeTrafficPlots draws conn/s, req/s and connect() time against N, one
// line per datapath, and returns the PNG names by key.
func writeTrafficPlots(base string, rs []trafficResult) (map[string]string, error) {
	plots := map[string]string{}
	if len(rs) == 0 {
		return plots, nil
	}
	type spec struct {
		key, title, ylabel string
		lines              func() []any
	}
	perDP := func(f func(trafficRun) float64, scale float64, suffix string) []any {
		return perDatapath(rs, f, scale, suffix)
	}
	for _, s := range []spec{
		{"cps", "New TCP connections per second through the node (median)", "connections / s", func() []any { return perDP(cps, 1, "") }},
		{"cpu", "Process CPU time per new connection (median)", "µs", func() []any { return perDP(cpuConn, 1e3, "") }},
		{"rr", "Requests per second over kept-alive connections (median)", "requests / s", func() []any { return perDP(rps, 1, "") }},
		{"latency", "connect() time under load (median of rounds)", "µs", func() []any {
			return append(perDP(p50, 1e3, " p50"), perDP(p99, 1e3, " p99")...)
		}},
	} {
		path := base + "-traffic-" + s.key + ".png"
		if err := linePlot(path, s.title, s.ylabel, rs[0].N, rs[len(rs)-1].N, s.lines()); err != nil {
			return nil, fmt.Errorf("%s: %w", s.key, err)
		}
		plots[s.key] = filepath.Base(path)
	}
	return plots, nil
}

// perDatapath is one plot line per datapath: the median of f against N.
func perDatapath(rs []trafficResult, f func(trafficRun) float64, scale float64, suffix string) []any {
	var out []any
	for _, d := range present(rs) {
		var xy plotter.XYs
		for _, r := range rs {
			if c := r.Cells[d]; c != nil {
				xy = append(xy, plotter.XY{X: float64(r.N), Y: cellMedian(c, f) / scale})
			}
		}
		if len(xy) > 0 {
			out = append(out, d.String()+suffix, xy)
		}
	}
	return out
}

// linePlot draws figure-against-N lines on a log x axis and a zero-based y
// axis.
func linePlot(path, title, ylabel string, minN, maxN int, series []any) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "Services"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	if err := plotutil.AddLinePoints(p, series...); err != nil {
		return err
	}
	p.X.Min, p.X.Max = float64(minN)/2, float64(maxN)*2
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.4
	p.Y.Tick.Marker = nsTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(4)
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

func reproduce() []byte {
	return []byte(`## Reproduce

As root: ` + "`make bench`" + `, or ` + "`bin/bench [-out docs/BENCHMARKS.md] [-sizes 1,1000,10000,100000] [-samples 20000] [-traffic-sizes 1,1000,10000,100000] [-rules-max 10000] [-rounds 3] [-workers 8] [-window 3s] [-datapaths floor,xvs,nftables,iptables] [-control-sizes 1000,10000,50000,100000] [-changes 200] [-vm 6.12] [-vm-traffic-sizes 1,1000] [-vm-rounds 3] [-vm-window 2s]`" + ` (` + "`-traffic-sizes \"\"`" + `, ` + "`-control-sizes \"\"`" + ` and ` + "`-vm \"\"`" + ` skip those parts; ` + "`bin/bench -h`" + ` lists every flag). Each per-packet size loads its own objects under ` + "`/sys/fs/bpf/xvs-bench-<pid>-<N>`" + `, the traffic benchmark builds its namespaces with the prefix ` + "`xvs-bench<pid>-`" + `, and everything is removed afterwards. ` + "`go -C hack/bench test ./...`" + ` (TestPrivBenchTiny, and TestPrivBenchVMTiny for the VM comparison) runs every part of the benchmark at a tiny size so it cannot rot; it asserts nothing about timings.
`)
}
