package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// peersMain is `go run ./hack/bench peers [flags]`: the comparison with
// the real kube-proxy alone, into its own report.
func peersMain(args []string) int {
	o, err := parsePeersFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench peers:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunPeers(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench peers:", err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "bench peers: wrote", o.Out)
	return 0
}

// envPeersWindow sets -window's default (the masqueraded windows), so that
// `make bench` can be given longer ones without editing the Makefile.
const envPeersWindow = "XVS_PEERS_WINDOW"

func parsePeersFlags(args []string) (PeersOptions, error) {
	fs := flag.NewFlagSet("bench peers", flag.ContinueOnError)
	defWindow := 30 * time.Second
	if v := os.Getenv(envPeersWindow); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return PeersOptions{}, fmt.Errorf("$%s: %w", envPeersWindow, err)
		}
		defWindow = d
	}
	out := fs.String("out", "docs/BENCHMARKS-peers.md", "report to write (the PNGs go beside it)")
	sizes := fs.String("sizes", "1,1000,10000", "numbers of Services (created through the API server)")
	rounds := fs.Int("rounds", 2, "rounds: every case once per size per round, interleaved")
	workers := fs.Int("workers", 16, "load generator workers (connect, send, receive, close)")
	window := fs.Duration("window", defWindow, "measured time of each masqueraded case ($"+envPeersWindow+" sets the default)")
	windowUnmasq := fs.Duration("window-unmasq", 10*time.Second, "measured time of each unmasqueraded case and of the floor")
	warmup := fs.Duration("warmup", 3*time.Second, "load before each window, not counted")
	ready := fs.Duration("ready-timeout", 4*time.Minute, "longest wait for a proxy's first sync at a size (a proxy that misses it is reported, not run again at that size)")
	proxies := fs.String("proxies", "floor,kube-proxy-nftables,kube-proxy-iptables,xvs", "what to compare")
	xvsBin := fs.String("xvs-bin", "", "xvs binary (default: built from this tree)")
	kpBin := fs.String("kube-proxy-bin", "", "kube-proxy binary (default: built from test/kubeproxy into the cache, or $"+envKubeProxyBin+")")
	if err := fs.Parse(args); err != nil {
		return PeersOptions{}, err
	}
	if fs.NArg() > 0 {
		return PeersOptions{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ns, err := parseSizes(*sizes)
	if err != nil {
		return PeersOptions{}, err
	}
	ps, err := parsePeerProxies(*proxies)
	if err != nil {
		return PeersOptions{}, fmt.Errorf("-proxies: %w", err)
	}
	return PeersOptions{
		Out: *out, Command: strings.TrimSpace("go run ./hack/bench peers " + strings.Join(args, " ")),
		Sizes: ns, Rounds: *rounds, Workers: *workers, Window: *window, WindowUnmasq: *windowUnmasq, Warmup: *warmup,
		ReadyTimeout: *ready, Proxies: ps, XvsBin: *xvsBin, KubeProxyBin: *kpBin, Log: os.Stderr,
	}, nil
}
