package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/loader"
)

// TestPrivBenchTiny runs the whole benchmark at a tiny size, so that the
// harness cannot rot between the rare real runs. It fails (never skips)
// without root, like the other privileged tests, and asserts nothing about
// timings: only that a complete report and plot come out and no pin is left.
func TestPrivBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF programs and needs root (CAP_BPF, CAP_NET_ADMIN); run it as root")
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	// The agent datapath runs the real binary.
	bin := filepath.Join(t.TempDir(), "xvs")
	// In the product's module: this one (hack/bench) lacks its go.sum.
	if b, err := exec.Command("go", "-C", "../..", "build", "-o", bin, "./cmd/xvs").CombinedOutput(); err != nil {
		t.Fatalf("build xvs: %v: %s", err, b)
	}
	opts := Options{
		Out: out, Sizes: []int{10, 1}, Samples: 300, Command: "go -C hack/bench test ./...", Log: testLog{t},
		Traffic: TrafficOptions{Sizes: []int{1, 20}, RulesMax: 20, Rounds: 1, Workers: 2, Warmup: 50 * time.Millisecond, Window: 200 * time.Millisecond,
			Datapaths: []datapath{dpFloor, dpXvs, dpNftables, dpIptables, dpAgentEBPF}, XvsBin: bin},
		Control: ControlOptions{Sizes: []int{10, 50}, Changes: 4, APISizes: []int{20}},
	}
	if err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	xdpWant := "remote backend with SNAT"
	if err := loader.XDPSupported(); err != nil {
		xdpWant = "Not measured on this machine: " + err.Error()
	}
	for _, want := range []string{
		xdpWant, "## Machine", "Kernel:", "CPU:", "Load average", "## Summary of the goals", "real traffic: never slower than nftables", "## Method", "## Results", "![", "BENCHMARKS.png",
		"### Conntrack hit", "### New flow", "### Goal", "## Control plane: full sync", "## Reproduce",
		"| 1 |", "| 10 |", "## Schedulers", "## XDP per-packet",
		"## Real traffic through a node", "### New TCP connections per second", "### Requests per second",
		"### First-packet latency", "### Time to program", "### CPU time per new connection", "xvs agent, ebpf mode", "agent-ebpf / floor", "### Where xvs's extra cost per connection goes", "| 20 |", "never slower than iptables",
		"## Control plane: the agent's pipeline", "| 50 | 500 |", "The real agent process", "| api | 20 | 200 |", "| file | 50 | 500 |", "one EndpointSlice change through the API server to the maps p50", "Scrape: time, size", "One EndpointSlice change to the maps at 50 Services",
	} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	for _, png := range []string{"BENCHMARKS.png", "BENCHMARKS-traffic-cps.png", "BENCHMARKS-traffic-rr.png", "BENCHMARKS-traffic-cpu.png", "BENCHMARKS-traffic-latency.png", "BENCHMARKS-control.png"} {
		if fi, err := os.Stat(filepath.Join(filepath.Dir(out), png)); err != nil || fi.Size() == 0 {
			t.Errorf("plot %s missing or empty: %v", png, err)
		}
		if !strings.Contains(string(report), "("+png+")") {
			t.Errorf("report does not embed %s", png)
		}
	}
	if left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/bpf/xvs-bench-%d-*", os.Getpid())); len(left) > 0 {
		t.Errorf("pin paths left behind: %v", left)
	}
	if left, _ := lab.List("xvs-bench" + strconv.Itoa(os.Getpid()) + "-"); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}

// TestPrivBenchVMTiny runs the IPVS comparison in the VM rig at a tiny
// size: static binaries into the guest, both agent modes there, results
// back and into the report. The guest goes on without a mode whose
// datapath cannot load; ipvs mode must have been measured.
func TestPrivBenchVMTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test boots the VM rig and needs root; run it as root")
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	opts := Options{
		Out: out, Sizes: []int{1}, Samples: 100, Command: "go -C hack/bench test ./...", Log: testLog{t},
		VM: VMOptions{Kernel: "6.12", Timeout: 10 * time.Minute, Traffic: TrafficOptions{Sizes: []int{1}, RulesMax: 1, Rounds: 1, Workers: 2,
			Warmup: 100 * time.Millisecond, Window: 300 * time.Millisecond}},
	}
	if err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## IPVS mode against ebpf mode, inside the VM rig", "Debian's 6.12 kernel", "agent-ipvs / floor", "BENCHMARKS-vm.png"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(string(report), "xvs agent, ipvs mode at 1 Services: not measured") {
		t.Errorf("ipvs mode was not measured in the VM:\n%s", report)
	}
}

// TestMain lets the test binary serve as the control-plane child process,
// as the benchmark binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == controlChildArg {
		if err := controlChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench control child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRuleShapes: the iptables and nftables rule sets have kube-proxy's
// structure for every Service and endpoint.
func TestRuleShapes(t *testing.T) {
	svcs := trafficServices(2)
	ipt := iptablesRules(svcs)
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-A KUBE-SERVICES -d 10.96.0.2/32 -p tcp -m comment --comment \"bench/svc-1:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-",
		"-m statistic --mode random --probability 0.33333333333 -j KUBE-SEP-",
		"-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-",
		"-j DNAT --to-destination 10.244.0.13:8080",
		"COMMIT",
	} {
		if !strings.Contains(ipt, want) {
			t.Errorf("iptables rules lack %q", want)
		}
	}
	// Two Services x 3 endpoints: 2 KUBE-SVC and 6 KUBE-SEP chains, and
	// the last endpoint of each Service is taken unconditionally.
	if n := strings.Count(ipt, ":KUBE-SVC-"); n != 2 {
		t.Errorf("%d KUBE-SVC chains, want 2", n)
	}
	if n := strings.Count(ipt, ":KUBE-SEP-"); n != 6 {
		t.Errorf("%d KUBE-SEP chains, want 6", n)
	}
	if n := strings.Count(ipt, "--probability"); n != 4 {
		t.Errorf("%d probability rules, want 4", n)
	}
	nft := nftablesRules(svcs)
	for _, want := range []string{
		"add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict",
		"add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
		"numgen random mod 3 vmap { 0 : goto endpoint-",
		"add element ip kube-proxy service-ips { 10.96.0.2 . tcp . 80 : goto service-",
		"meta l4proto tcp dnat to 10.244.0.12:8080",
	} {
		if !strings.Contains(nft, want) {
			t.Errorf("nftables rules lack %q", want)
		}
	}
	if n := strings.Count(nft, "dnat to"); n != 6 {
		t.Errorf("%d dnat rules, want 6", n)
	}
}

// TestBenchOptionsValidate: bad options are refused before anything is
// loaded.
func TestBenchOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Out: "", Sizes: []int{1}, Samples: 1},
		{Out: "x.md", Sizes: nil, Samples: 1},
		{Out: "x.md", Sizes: []int{0}, Samples: 1},
		{Out: "x.md", Sizes: []int{1}, Samples: 0},
		{Out: "x.md", Sizes: []int{1}, Samples: 1, Traffic: TrafficOptions{Sizes: []int{1}}},
		{Out: "x.md", Sizes: []int{1}, Samples: 1, Control: ControlOptions{Sizes: []int{1}}},
		{Out: "x.md", Sizes: []int{1}, Samples: 1, Traffic: TrafficOptions{Sizes: []int{1}, Rounds: 1, Workers: 1, Window: 1, Datapaths: []datapath{dpXvs}}},
		{Out: "x.md", Sizes: []int{1}, Samples: 1, VM: VMOptions{Kernel: "6.12"}},
	} {
		if err := Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) accepted bad options", o)
		}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
