// Command bench measures the per-packet cost of the xvs tc program against
// the empty tc program (the floor) with BPF_PROG_TEST_RUN, at growing
// numbers of Services, and writes docs/BENCHMARKS.md with a PNG plot.
//
//	bin/bench [-out docs/BENCHMARKS.md] [-sizes 1,1000,10000,100000] [-samples N]
//
// It needs root (it loads BPF programs) and leaves nothing behind: every
// size loads fresh objects under /sys/fs/bpf/xvs-bench-<pid>-<n> and removes
// them afterwards, also on error or Ctrl-C. `make bench` builds it (hack/bench
// is its own module, so that gonum/plot stays out of the product's go.mod)
// into bin/bench, and runs it from the repository root.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == controlChildArg {
		if err := controlChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench control child:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 2 && os.Args[1] == "-build-kube-proxy" {
		// `make kube-proxy`: build (or find) the peer once, ahead of a run.
		path, err := kubeProxyBinary(context.Background(), os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Println(path)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "peers" {
		os.Exit(peersMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "monitor" {
		os.Exit(monitorMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "stages" {
		os.Exit(stagesMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "resize" {
		os.Exit(resizeMain(os.Args[2:]))
	}
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	// A signal cancels the run instead of killing the process, so that the
	// deferred cleanup of the pin paths still runs.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if opts.GuestJSON != "" {
		if err := guestMain(ctx, opts, opts.GuestJSON); err != nil {
			fmt.Fprintln(os.Stderr, "bench (guest):", err)
			os.Exit(1)
		}
		return
	}
	if err := Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "bench: wrote", opts.Out)
}

// parseFlags turns the command line into Options; the report quotes the
// command exactly as given, so a reader can rerun it.
func parseFlags(args []string) (Options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	out := fs.String("out", "docs/BENCHMARKS.md", "report to write (the PNG goes beside it)")
	sizes := fs.String("sizes", "1,1000,10000,100000", "comma-separated numbers of Services (10 backends each)")
	samples := fs.Int("samples", 20000, "timed packets per case and size (each one BPF_PROG_TEST_RUN with repeat 1)")
	trafficSizes := fs.String("traffic-sizes", "1,1000,10000,100000", "numbers of Services for the real-traffic comparison (empty: skip it)")
	rulesMax := fs.Int("rules-max", 10000, "largest number of Services iptables and nftables run at")
	rounds := fs.Int("rounds", 3, "real-traffic rounds (every datapath once per size per round)")
	workers := fs.Int("workers", 8, "load generator worker threads")
	window := fs.Duration("window", 3*time.Second, "measured time of each real-traffic run (after a warm-up of a sixth of it)")
	controlSizes := fs.String("control-sizes", "1000,10000,50000,100000", "numbers of Services for the control-plane figures (empty: skip them)")
	apiSizes := fs.String("api-sizes", "1000,10000,100000", "numbers of Services the real agent reads through a kube-apiserver (lab/kubeapi; empty: none)")
	changes := fs.Int("changes", 200, "EndpointSlice changes timed at the largest control size")
	cpuprofile := fs.String("control-cpuprofile", "", "write a CPU profile of the largest control-plane child")
	datapaths := fs.String("datapaths", "floor,xvs,nftables,iptables", "real-traffic datapaths: floor, xvs, nftables, iptables, agent-ebpf, agent-ipvs")
	xvsBin := fs.String("xvs-bin", "", "the xvs binary the agent datapaths run")
	warmup := fs.Duration("warmup", 0, "warm-up before each real-traffic run (default: a sixth of -window)")
	guestJSON := fs.String("guest-json", "", "run only the real-traffic benchmark and write its results as JSON here (the VM guest's mode)")
	vmKernel := fs.String("vm", "6.12", "Debian kernel series for the IPVS comparison in the VM rig (empty: skip it)")
	vmSizes := fs.String("vm-traffic-sizes", "1,1000", "numbers of Services for the VM comparison")
	vmRounds := fs.Int("vm-rounds", 3, "rounds of the VM comparison")
	vmWindow := fs.Duration("vm-window", 2*time.Second, "measured time of each run in the VM")
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	ts, err := parseOptSizes(*trafficSizes)
	if err != nil {
		return Options{}, fmt.Errorf("-traffic-sizes: %w", err)
	}
	cs, err := parseOptSizes(*controlSizes)
	if err != nil {
		return Options{}, fmt.Errorf("-control-sizes: %w", err)
	}
	as, err := parseOptSizes(*apiSizes)
	if err != nil {
		return Options{}, fmt.Errorf("-api-sizes: %w", err)
	}
	vs, err := parseOptSizes(*vmSizes)
	if err != nil {
		return Options{}, fmt.Errorf("-vm-traffic-sizes: %w", err)
	}
	dps, err := parseDatapaths(*datapaths)
	if err != nil {
		return Options{}, fmt.Errorf("-datapaths: %w", err)
	}
	if *warmup == 0 {
		*warmup = *window / 6
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ns, err := parseSizes(*sizes)
	if err != nil {
		return Options{}, err
	}
	return Options{
		Out:     *out,
		Sizes:   ns,
		Samples: *samples,
		Command: strings.TrimSpace("bin/bench " + strings.Join(args, " ")),
		Log:     os.Stderr,
		Traffic: TrafficOptions{Sizes: ts, RulesMax: *rulesMax, Rounds: *rounds, Workers: *workers, Warmup: *warmup, Window: *window,
			Datapaths: dps, XvsBin: *xvsBin, KeepGoing: *guestJSON != ""},
		Control: ControlOptions{Sizes: cs, Changes: *changes, Profile: *cpuprofile, APISizes: as},
		VM: VMOptions{Kernel: *vmKernel, Traffic: TrafficOptions{Sizes: vs, RulesMax: slices.Max(append(vs, 1)), Rounds: *vmRounds,
			Workers: *workers, Warmup: *vmWindow / 4, Window: *vmWindow}},
		GuestJSON: *guestJSON,
	}, nil
}

// parseOptSizes is parseSizes where an empty list means "skip".
func parseOptSizes(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	return parseSizes(s)
}

func parseSizes(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sizes: %q is not a positive number", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}
