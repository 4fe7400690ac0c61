package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/conformance"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/lab"
)

// runCorpus runs dir through the conformance runner with this test binary
// as the agent (TestMain turns it into xvs), logging every probe line.
func runCorpus(t *testing.T, dir, filter string, extra ...string) *conformance.Results {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("conformance tests need root (network namespaces, BPF); run them as root")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts := conformance.Options{Mode: conformance.ModeEBPF, Bin: bin, ExtraAgentArgs: extra, Out: tlog{t}, LogDir: t.TempDir()}
	if filter != "" {
		opts.Filter = regexp.MustCompile(filter)
	}
	start := time.Now()
	res, err := conformance.Run(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d scenarios in %v", len(res.Scenarios), time.Since(start).Round(time.Millisecond))
	return res
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// probes indexes results as "scenario/step/probe" -> pass; agent, when
// true, selects the checks of the agent's endpoints instead of the
// scenario's own probes.
func probes(res *conformance.Results, agent ...bool) map[string]bool {
	return results(res, func(p conformance.ProbeResult) bool {
		return !p.Explain && !p.Monitor && p.Agent == (len(agent) > 0 && agent[0])
	})
}

// explains are the explain checks of a run (conformance/explain.go).
func explains(res *conformance.Results) map[string]bool {
	return results(res, func(p conformance.ProbeResult) bool { return p.Explain })
}

func results(res *conformance.Results, keep func(conformance.ProbeResult) bool) map[string]bool {
	out := map[string]bool{}
	for _, s := range res.Scenarios {
		for _, p := range s.Probes {
			if keep(p) {
				out[fmt.Sprintf("%s/%d/%s", s.Name, p.Step, p.Probe)] = p.Pass
			}
		}
	}
	return out
}

// freshScenario is written the way someone outside the project might
// write one: block style, JSON-style objects, explicit roles, bare node
// addresses, no section, a Node of its own, mode spelt "bpf". It uses only
// what the datapath does today, and one deliberately wrong expectation
// that the runner must report as failed.
const freshScenario = `# written for TestPrivConformanceFreshScenario
name: outsider-written
description: An independent author's ClusterIP check
node:
  name: worker-7
  addresses:
    - 198.18.40.7
cluster:
  podCIDRs: ["100.64.0.0/16"]
  serviceCIDRs: ["10.96.0.0/12"]
modes: [bpf]
objects:
  - {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-7"},
     "status": {"addresses": [{"type": "InternalIP", "address": "198.18.40.7"}]}}
  - apiVersion: v1
    kind: Service
    metadata:
      name: kv
    spec:
      clusterIP: 10.100.7.7
      ports:
        - name: client
          port: 2379
          targetPort: 12379
        - name: gossip
          port: 7946
          protocol: UDP
          targetPort: 17946
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: kv-xyz12
      labels:
        kubernetes.io/service-name: kv
    addressType: IPv4
    endpoints:
      - addresses: ["100.64.3.10"]
        nodeName: worker-7
        conditions: {ready: true, serving: true, terminating: false}
      - addresses: ["100.64.9.20"]
        nodeName: worker-9
    ports:
      - {name: client, port: 12379}
      - {name: gossip, port: 17946, protocol: UDP}
steps:
  - probes:
      - name: etcd client over TCP
        from: {ip: 100.64.3.99, role: pod}
        to: 10.100.7.7:2379
        expect: ["100.64.9.20:12379", "100.64.3.10:12379"]
        masquerade: false
        tries: 20
      - name: gossip over UDP
        from: 100.64.3.99
        to: 10.100.7.7:7946
        protocol: UDP
        expect: ["100.64.3.10:17946", "100.64.9.20:17946"]
      - name: deliberately wrong expectation
        from: 100.64.3.99
        to: 10.100.7.7:2379
        expect: REJECT
  - hold: {name: session, from: 100.64.3.99, to: "10.100.7.7:2379"}
  - delete:
      - {kind: EndpointSlice, name: kv-xyz12}
  - check: {held: session, alive: true}
  - probes:
      - {name: no endpoints left, from: 100.64.3.99, to: "10.100.7.7:2379", expect: REJECT, timeout: 2s}
`

// TestPrivConformanceFreshScenario: a scenario written outside the corpus,
// in another style, placed in a temporary directory, runs unchanged, and
// the runner tells pass from fail.
func TestPrivConformanceFreshScenario(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "outsider.yml"), []byte(freshScenario), 0o644); err != nil {
		t.Fatal(err)
	}
	res := runCorpus(t, dir, "")
	got := probes(res)
	want := map[string]bool{
		"outsider-written/1/etcd client over TCP":           true,
		"outsider-written/1/gossip over UDP":                true,
		"outsider-written/1/deliberately wrong expectation": false,
		"outsider-written/2/hold session":                   true,
		"outsider-written/4/check session":                  true,
		"outsider-written/5/no endpoints left":              true,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: pass=%v (reported: %v), want %v", k, g, ok, w)
		}
	}
	// The agent's endpoints after the scenario: its own Node (eligible),
	// no Local policy.
	checks := probes(res, true)
	for _, c := range []string{"agent /livez", "agent /healthz", "agent /proxyMode", "agent /metrics sync", "agent /metrics no_local_endpoints"} {
		if pass, ok := checks["outsider-written/0/"+c]; !ok || !pass {
			t.Errorf("%s: pass=%v (reported: %v), want pass", c, pass, ok)
		}
	}
	// xvs explain agreed with every passing probe it was asked about
	// (the failing one is not judged: its outcome is not the expectation).
	ex := explains(res)
	for _, k := range []string{"1/explain etcd client over TCP", "1/explain gossip over UDP", "5/explain no endpoints left"} {
		if pass, ok := ex["outsider-written/"+k]; !ok || !pass {
			t.Errorf("%s: pass=%v (reported: %v), want pass", k, pass, ok)
		}
	}
	// xvs monitor reported the probe explain said is refused, with the
	// reason.
	mon := results(res, func(p conformance.ProbeResult) bool { return p.Monitor })
	if pass, ok := mon["outsider-written/5/monitor no endpoints left"]; !ok || !pass {
		t.Errorf("monitor check of the refused probe: pass=%v (reported: %v), want pass; all: %v", pass, ok, mon)
	}
	if len(got) != len(want) || len(checks) != 5 || len(ex) != 3 || len(mon) != 1 || res.Passed != 5+5+3+1 || res.Failed != 1 {
		t.Errorf("results %v %v %v %v: %d passed, %d failed; want 14 and 1", got, checks, ex, mon, res.Passed, res.Failed)
	}
}

// TestPrivConformanceMalformed: broken files are reported as failed with
// their path and reason, and the good scenario next to them still runs.
func TestPrivConformanceMalformed(t *testing.T) {
	dir := t.TempDir()
	good := strings.Replace(freshScenario, "name: outsider-written", "name: good-one", 1)
	files := map[string]string{
		"a-good.yaml":      good,
		"b-typo.yaml":      strings.Replace(good, "name: good-one", "name: typo", 1) + "expcet: DROP\n",
		"c-not-yaml.yaml":  "name: [unclosed\n",
		"d-no-probes.yaml": "name: empty\nnode: {name: n, addresses: [192.0.2.1]}\n",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res := runCorpus(t, dir, "")
	status := map[string]conformance.ScenarioResult{}
	for _, s := range res.Scenarios {
		status[filepath.Base(s.File)] = s
	}
	for n, reason := range map[string]string{
		"b-typo.yaml":      `unknown field "expcet"`,
		"c-not-yaml.yaml":  "YAML",
		"d-no-probes.yaml": "no probes",
	} {
		s := status[n]
		if s.Status != conformance.StatusMalformed || !strings.Contains(s.Error, reason) {
			t.Errorf("%s: status %q, error %q; want malformed with %q", n, s.Status, s.Error, reason)
		}
	}
	if g := status["a-good.yaml"]; g.Status != conformance.StatusFail || len(g.Probes) != 6+5+3+1 { // 5 agent checks, 3 explain checks, 1 monitor check
		t.Errorf("the good scenario did not run fully: %+v", g)
	}
	if res.Failed != 3+1 {
		t.Errorf("failed = %d, want 3 malformed + 1 wrong expectation", res.Failed)
	}
}

// TestPrivConformanceBreakRevNAT: with reverse NAT disabled in the
// datapath (--debug-disable-rev-nat), every corpus probe that needs a reply
// from a backend through the VIP fails, and the probes that do not (REJECT
// with no endpoints, traffic the proxy leaves alone) still pass.
func TestPrivConformanceBreakRevNAT(t *testing.T) {
	dir, err := filepath.Abs("../../conformance/corpus")
	if err != nil {
		t.Fatal(err)
	}
	const pick = `^(svc-ports-independent|svc-named-targetport|clusterip-same-port-protocols|svc-fqdn-slice-ignored|svc-headless-ignored)$`
	healthyRes := runCorpus(t, dir, pick)
	brokenRes := runCorpus(t, dir, pick, "--debug-disable-rev-nat")
	healthy, broken := probes(healthyRes), probes(brokenRes)
	// The agent's own endpoints do not go through the datapath: every
	// check passes either way.
	for _, res := range []*conformance.Results{healthyRes, brokenRes} {
		checks := probes(res, true)
		for k, pass := range checks {
			if !pass {
				t.Errorf("%s fails", k)
			}
		}
		if len(checks) != 5*5 {
			t.Errorf("%d agent checks, want 5 for each of 5 scenarios", len(checks))
		}
	}
	needsRevNAT := map[string]bool{
		"svc-ports-independent/0/port 80 goes to 8080":                                    true,
		"svc-ports-independent/0/port 81 goes to 9000":                                    true,
		"svc-named-targetport/0/each pod is reached on its own container port":            true,
		"clusterip-same-port-protocols/0/TCP 53 goes to the TCP target":                   true,
		"clusterip-same-port-protocols/0/UDP 53 goes to the UDP target":                   true,
		"svc-fqdn-slice-ignored/0/the IPv4 slice next to an FQDN slice is used":           true,
		"svc-fqdn-slice-ignored/0/only an FQDN slice means no endpoints":                  false,
		"svc-headless-ignored/0/pod reaches a headless endpoint directly, untouched":      false,
		"svc-headless-ignored/0/clusterIP of a Service labelled headless is not captured": false,
	}
	if len(healthy) != len(needsRevNAT) {
		t.Fatalf("ran %d probes, want %d: %v", len(healthy), len(needsRevNAT), healthy)
	}
	for k, needs := range needsRevNAT {
		if !healthy[k] {
			t.Errorf("%s fails on the healthy datapath", k)
		}
		if broken[k] == needs {
			t.Errorf("%s: pass=%v without reverse NAT, want %v", k, broken[k], !needs)
		}
	}
}

// TestPrivConformanceCrashCleanup: a runner killed with SIGKILL in the
// middle of a scenario takes its agent with it (parent-death signal), and
// the next run's CleanupStale removes the namespaces, pins and object
// directory it left behind.
func TestPrivConformanceCrashCleanup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("conformance tests need root (network namespaces, BPF); run them as root")
	}
	dir := t.TempDir()
	sc := strings.Replace(freshScenario, "name: outsider-written", "name: crash-me", 1)
	sc = strings.Replace(sc, "  - hold: {name: session", "  - sleep: 60s\n  - hold: {name: session", 1)
	if err := os.WriteFile(filepath.Join(dir, "crash.yaml"), []byte(sc), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Its agent logs go under the test's own directory: a killed runner
	// cannot remove a log directory of its own.
	cmd := exec.Command(bin, "conformance", "run", dir, "--mode", "ebpf", "--log-dir", t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The first probe line means the world is built and the agent runs;
	// the runner is then in its 60 s sleep step.
	lines := bufio.NewScanner(out)
	var seen []string
	for lines.Scan() && !strings.Contains(lines.Text(), "crash-me | step 1") {
		seen = append(seen, lines.Text())
	}
	if lines.Err() != nil || !strings.Contains(lines.Text(), "crash-me | step 1") {
		t.Fatalf("the runner never reached the scenario's first step:\n%s", strings.Join(seen, "\n"))
	}
	prefix := fmt.Sprintf("xvs-cf%d-", cmd.Process.Pid)
	names, err := lab.List(prefix)
	if err != nil || len(names) == 0 {
		t.Fatalf("no namespaces %s* while the runner runs (%v)", prefix, err)
	}
	agent := findProcess(t, "--pin-path /sys/fs/bpf/"+prefix)
	if agent == 0 {
		t.Fatal("no agent process found")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(agent, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("agent %d outlived its killed runner", agent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	left, _ := lab.List(prefix)
	if len(left) == 0 {
		t.Fatal("a SIGKILLed runner left nothing behind: the test proves nothing")
	}
	// Its agent's Services file (agent/publish.go), which the killed agent
	// could not remove, goes with its namespace.
	var records []string
	for _, n := range left {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(lab.NetnsDir, n), &st) == nil {
			if f := ipvs.NamespaceFileOf("services", st.Ino); fileExists(f) {
				records = append(records, f)
			}
		}
	}
	if len(records) == 0 {
		t.Error("the killed agent left no Services file: the check below proves nothing")
	}
	if err := conformance.CleanupStale(); err != nil {
		t.Logf("CleanupStale: %v (leftovers of other runs may be involved)", err)
	}
	if left, _ := lab.List(prefix); len(left) > 0 {
		t.Errorf("namespaces left after CleanupStale: %v", left)
	}
	for _, f := range records {
		if fileExists(f) {
			t.Errorf("%s left after CleanupStale", f)
		}
	}
	if pins, _ := filepath.Glob("/sys/fs/bpf/" + prefix + "*"); len(pins) > 0 {
		t.Errorf("pins left after CleanupStale: %v", pins)
	}
	if objs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*")); len(objs) > 0 {
		t.Errorf("object directories left after CleanupStale: %v", objs)
	}
}

// findProcess returns the PID of a process whose command line contains s.
func findProcess(t *testing.T, s string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		return pid
	}
	return 0
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
