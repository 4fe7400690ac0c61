// Command bench measures the per-packet cost of the xvs tc program against
// the empty tc program (the floor) with BPF_PROG_TEST_RUN, at growing
// numbers of Services, and writes docs/BENCHMARKS.md with a PNG plot.
//
//	go run ./hack/bench [-out docs/BENCHMARKS.md] [-sizes 1,1000,10000,100000] [-samples N]
//
// It needs root (it loads BPF programs) and leaves nothing behind: every
// size loads fresh objects under /sys/fs/bpf/xvs-bench-<pid>-<n> and removes
// them afterwards, also on error or Ctrl-C. `make bench` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	// A signal cancels the run instead of killing the process, so that the
	// deferred cleanup of the pin paths still runs.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	if err := fs.Parse(args); err != nil {
		return Options{}, err
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
		Command: strings.TrimSpace("go run ./hack/bench " + strings.Join(args, " ")),
		Log:     os.Stderr,
	}, nil
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
