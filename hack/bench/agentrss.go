package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
)

// agentResult is the real agent process at one size: from its start to
// every Service in the maps, through the file source, and its memory then.
type agentResult struct {
	N        int
	Ready    time.Duration
	RSS, HWM uint64
}

// measureAgentProcess runs the real `xvs agent` binary (ebpf mode, file
// source) on manifests for N Services x 10 endpoints, in a node namespace
// of its own, for every control size, with its map-size flags set as
// docs/configuration.md advises for that size.
func measureAgentProcess(ctx context.Context, opts Options, bin string) ([]agentResult, error) {
	var out []agentResult
	for _, n := range opts.Control.Sizes {
		r, err := agentProcessAt(ctx, n, bin)
		if err != nil {
			return nil, fmt.Errorf("%d services: %w", n, err)
		}
		logf(opts.Log, "control plane: the agent process at %d services: ready in %v, RSS %d MiB (peak %d MiB)", n, r.Ready.Round(time.Millisecond), r.RSS>>20, r.HWM>>20)
		out = append(out, r)
	}
	return out, nil
}

func agentProcessAt(ctx context.Context, n int, bin string) (res agentResult, err error) {
	res.N = n
	l, err := lab.New(lab.UniquePrefix("bench"))
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	node, err := l.AddNode("node", trafficNodeIP)
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "xvs-bench-agent-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	objects := filepath.Join(dir, "objects")
	if err := os.Mkdir(objects, 0o755); err != nil {
		return res, err
	}
	svcs := trafficServices(n)
	for i := range svcs {
		svcs[i].VIP = vipOf(i)
		svcs[i].Endpoints = make([]netip.AddrPort, backendsPerService)
		for j := range backendsPerService {
			svcs[i].Endpoints[j] = netip.AddrPortFrom(addAddr(backendBase, 1+i*backendsPerService+j), trafficPodPort)
		}
	}
	if err := writeManifests(objects, svcs); err != nil {
		return res, err
	}
	pin := filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-agent", os.Getpid()))
	start := time.Now()
	args := append([]string{"agent", "--objects", objects, "--hostname-override", "node",
		"--node-ip", trafficNodeIP.String(), "--pin-path", pin}, agentMapFlags(n)...)
	p, err := lab.StartTied(node.NS, filepath.Join(dir, "agent.log"), bin, args...)
	if err != nil {
		return res, err
	}
	defer func() {
		err = errors.Join(err, p.Stop(10*time.Second))
		if out, cerr := lab.Run(node.NS, bin, "cleanup", "--pin-path", pin); cerr != nil {
			err = errors.Join(err, fmt.Errorf("xvs cleanup: %v: %s", cerr, out))
		}
	}()
	deadline := time.Now().Add(agentReady)
	for {
		heads, err := countHeads(pin)
		if err == nil && heads == n {
			res.Ready = time.Since(start)
			break
		}
		if ended, aerr := p.Exited(); ended {
			log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
			return res, fmt.Errorf("agent exited (%v): %s", aerr, tail(string(log), 10))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, fmt.Errorf("%d of %d Services in the maps after %v (%v)", heads, n, agentReady, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	status := filepath.Join("/proc", strconv.Itoa(p.Pid()), "status")
	if res.RSS, err = statusField(status, "VmRSS"); err != nil {
		return res, err
	}
	res.HWM, err = statusField(status, "VmHWM")
	return res, err
}

// countHeads counts the frontends (slot 0 of scope 0) in the pinned
// services map.
func countHeads(pin string) (int, error) {
	m, err := maps.OpenPinned(pin)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	var k xbpf.SvcKey
	var v xbpf.SvcValue
	n := 0
	it := m.Services.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 && k.Scope == 0 {
			n++
		}
	}
	return n, it.Err()
}

// buildXvs builds the agent binary into dir.
func buildXvs(ctx context.Context, dir string, static bool) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "xvs")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/xvs")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build xvs: %v: %s", err, out)
	}
	return bin, nil
}

// agentMapFlags sizes the agent's maps for n Services x 10 endpoints, no
// smaller than its defaults.
func agentMapFlags(n int) []string {
	def := loader.DefaultConfig()
	size := func(flag string, want int, min uint32) []string {
		return []string{flag, strconv.FormatUint(uint64(max(pow2(want), min)), 10)}
	}
	var out []string
	out = append(out, size("--bpf-max-services", n, def.MaxServices)...)
	out = append(out, size("--bpf-max-backends", n*backendsPerService, def.MaxBackends)...)
	return append(out, size("--bpf-max-service-slots", n*(1+backendsPerService), def.MaxServiceSlots)...)
}
