package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// TestPrivBenchPeersTiny runs the comparison with the real kube-proxy at a
// tiny size, every case once, so that the harness cannot rot between real
// runs: kube-proxy built (or found in its cache), both its modes and the
// xvs agent against the API server, masqueraded and not, a report with its
// plots, and nothing left behind. It asserts nothing about timings.
func TestPrivBenchPeersTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and runs proxies in them; run it as root")
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS-peers.md")
	o := PeersOptions{
		Out: out, Command: "go -C hack/bench test ./...", Sizes: []int{1, 3}, Rounds: 1, Workers: 2,
		Window: 300 * time.Millisecond, WindowUnmasq: 200 * time.Millisecond, Warmup: 100 * time.Millisecond,
		ReadyTimeout: time.Minute, Proxies: []peerProxy{ppFloor, ppNftables, ppIptables, ppXvs, ppXvsBypass}, Log: testLog{t},
		BulkStreams: []int{1, 3}, BulkWindow: 300 * time.Millisecond, BulkWarmup: 100 * time.Millisecond,
	}
	if err := RunPeers(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Goal | Measured | Met | Command |", "xvs (ebpf) ahead of kube-proxy nftables", "xvs (ebpf, bypass) ahead of kube-proxy iptables",
		"## Machine and run", "Kernel:", "Load average", "Kubernetes v1.37", "## Method", "### New TCP connections per second",
		"### CPU per connection", "kube-proxy iptables, masqueraded", "xvs (ebpf), not masqueraded", "xvs (ebpf, bypass), masqueraded", "| 3 |",
		"BENCHMARKS-peers-cps.png", "## The shape-alike rule sets",
		"### Bulk TCP throughput at N = 1", "| kube-proxy nftables, masqueraded | NodePort |", "| xvs (ebpf), not masqueraded | ClusterIP |",
		"bulk Gbit/s through a NodePort (xvs (ebpf, bypass), masqueraded) >= 0.95x the floor", "upload ×3", "BENCHMARKS-peers-bulk.png",
	} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(string(report), "stopped after") {
		t.Errorf("a case was not measured:\n%s", report)
	}
	for _, png := range []string{"BENCHMARKS-peers-cps.png", "BENCHMARKS-peers-cpu.png", "BENCHMARKS-peers-bulk.png"} {
		if fi, err := os.Stat(filepath.Join(filepath.Dir(out), png)); err != nil || fi.Size() == 0 {
			t.Errorf("plot %s missing or empty: %v", png, err)
		}
	}
	if left, _ := lab.List("xvs-bench" + strconv.Itoa(os.Getpid()) + "-"); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
	if left, _ := filepath.Glob("/sys/fs/bpf/xvs-bench-" + strconv.Itoa(os.Getpid()) + "-*"); len(left) > 0 {
		t.Errorf("pin paths left behind: %v", left)
	}
}

// TestPeerConfig: the proxies share one configuration; only the mode and,
// when masqueraded, clusterCIDR differ, and nothing global is sized.
func TestPeerConfig(t *testing.T) {
	nft := peerConfig(peerCase{ppNftables, false}, "/k")
	xvs := peerConfig(peerCase{ppXvs, true}, "/k")
	for _, want := range []string{"kind: KubeProxyConfiguration", "mode: nftables", "hostnameOverride: node", "kubeconfig: /k", "maxPerCore: 0"} {
		if !strings.Contains(nft, want) {
			t.Errorf("config lacks %q:\n%s", want, nft)
		}
	}
	if strings.Contains(nft, "clusterCIDR") {
		t.Errorf("unmasqueraded config sets clusterCIDR:\n%s", nft)
	}
	if got := strings.Replace(strings.Replace(xvs, "mode: ebpf", "mode: nftables", 1), "clusterCIDR: "+peersClusterCIDR+"\n", "", 1); got != nft {
		t.Errorf("configs differ beyond mode and clusterCIDR:\n%s\n---\n%s", nft, xvs)
	}
}
