package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// peersMain is `bin/bench peers [flags]`: the comparison with
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
	ready := fs.Duration("ready-timeout", 5*time.Minute, "longest wait for a proxy's first sync at a size (a proxy that misses it is reported, not run again at that size)")
	slowSync := fs.Duration("slow-sync", time.Minute, "a proxy whose first sync at a size takes longer runs in the first round only at that size (0: every round)")
	proxies := fs.String("proxies", "floor,kube-proxy-nftables,kube-proxy-iptables,xvs,xvs-bypass", "what to compare: floor, kube-proxy-nftables, kube-proxy-iptables, xvs (the agent's defaults), xvs-bypass (--netfilter-mode=bypass)")
	target := fs.String("targets", "spread", "where connections go: spread (every worker sweeps all N Services) or one (all to Service 0, the N programmed)")
	masq := fs.String("masquerade", "both", "cases to run: both, on (masqueraded only) or off")
	bulk := fs.String("bulk-streams", "1,8", "parallel bulk TCP streams per run, each direction, at the smallest size (a ClusterIP unmasqueraded, a NodePort masqueraded; \"\" for none)")
	bulkWindow := fs.Duration("bulk-window", 5*time.Second, "measured time of each bulk run")
	bulkWarmup := fs.Duration("bulk-warmup", time.Second, "bulk transfer before each bulk window, not counted")
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
	masqs, ok := map[string][]bool{"both": {false, true}, "on": {true}, "off": {false}}[*masq]
	if !ok {
		return PeersOptions{}, fmt.Errorf("-masquerade: %q is not both, on or off", *masq)
	}
	var bulkStreams []int
	if *bulk != "" {
		if bulkStreams, err = parseSizes(*bulk); err != nil {
			return PeersOptions{}, fmt.Errorf("-bulk-streams: %w", err)
		}
	}
	if *target != "spread" && *target != "one" {
		return PeersOptions{}, fmt.Errorf("-targets: %q is not spread or one", *target)
	}
	return PeersOptions{
		OneService: *target == "one",
		Out:        *out, Command: strings.TrimSpace("bin/bench peers " + strings.Join(args, " ")),
		Sizes: ns, Rounds: *rounds, Workers: *workers, Window: *window, WindowUnmasq: *windowUnmasq, Warmup: *warmup,
		ReadyTimeout: *ready, SlowSync: *slowSync, BulkStreams: bulkStreams, BulkWindow: *bulkWindow, BulkWarmup: *bulkWarmup, Proxies: ps, Masq: masqs, XvsBin: *xvsBin, KubeProxyBin: *kpBin, Log: os.Stderr,
	}, nil
}

// buildXvsCommitted builds the agent from the repository's HEAD, not the
// work tree: the machine is shared, and uncommitted changes of someone
// else's must not be what the report names. It returns the binary and the
// commit it was built from.
func buildXvsCommitted(ctx context.Context, dir string) (bin, commit string, err error) {
	root, err := repoRoot()
	if err != nil {
		return "", "", err
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "", "", fmt.Errorf("git rev-parse: %w", err)
	}
	commit = strings.TrimSpace(string(out))
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive HEAD | tar -x -C "$2"`, "sh", root, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("git archive HEAD: %v: %s", err, out)
	}
	bin = filepath.Join(dir, "xvs")
	build := exec.CommandContext(ctx, goBin(), "build", "-ldflags",
		"-X github.com/xvs-lb/xvs/version.version="+commit+" -X github.com/xvs-lb/xvs/version.gitCommit="+commit, "-o", bin, "./cmd/xvs")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("build xvs at %s: %v: %s", commit, err, out)
	}
	return bin, commit, nil
}
