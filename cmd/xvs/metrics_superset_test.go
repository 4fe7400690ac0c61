package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// kubeProxyOnlyNFTables are the metrics kube-proxy registers in nftables
// mode only (pkg/proxy/metrics RegisterMetrics): its own rule writer's.
// The IPVS mode xvs replaces has none of them.
var kubeProxyOnlyNFTables = []string{
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
	"kubeproxy_localhost_nodeport_listeners",
	"kubeproxy_localhost_nodeport_listener_creation_failures_total",
	"kubeproxy_localhost_nodeport_rejected_packets_total",
}

// kubeProxyLinked are the name prefixes of metrics kube-proxy exposes
// only because it links k8s.io/apiserver packages that register them at
// init (audit, envelope encryption, webhooks, declarative validation, the
// aggregator's discovery): it serves no API, and neither does xvs.
var kubeProxyLinked = []string{"apiserver_", "aggregator_"}

// kubeProxyIPVSMode are the metrics kube-proxy's IPVS mode registers
// beside the common ones, which an xvs sync observes too.
var kubeProxyIPVSMode = []string{
	"kubeproxy_conntrack_reconciler_sync_duration_seconds",
}

// TestPrivKubeMetricsSuperset: the real kube-proxy v1.37 (make kube-proxy,
// a step of make test) and xvs run side by side in one node namespace
// against one API server with the same Services; every metric name
// kube-proxy exposes, but for its nftables rule writer's, is in xvs's
// /metrics too, with kube-proxy's IPVS-mode additions: dashboards and
// alerts written for kube-proxy keep their series.
func TestPrivKubeMetricsSuperset(t *testing.T) {
	w := newKubeWorld(t)
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, 3, 60*time.Second)

	startKubeProxy(t, w, kubeProxyBin(t), "nftables")
	// Both have synced the Services; then one EndpointSlice change goes
	// through both.
	var kpText string
	w.updateSlice(t, "web", "web-1", harness.DemoPodIPs[:2], "node")
	w.waitBackends(t, harness.DemoVIP, 80, 2, 10*time.Second)
	time.Sleep(2 * time.Second) // kube-proxy's minSyncPeriod (1s) and a sync
	code, _, kpText, err := nsGet(w.Node.NS, "http://127.0.0.1:10259/metrics")
	if err != nil || code != 200 {
		t.Fatalf("kube-proxy /metrics: %d %v", code, err)
	}
	kpNames, xvsNames := metricNames(kpText), metricNames(w.metricsText(t))
	var missing []string
	for name := range kpNames {
		linked := slices.ContainsFunc(kubeProxyLinked, func(p string) bool { return strings.HasPrefix(name, p) })
		if !xvsNames[name] && !linked && !slices.Contains(kubeProxyOnlyNFTables, name) {
			missing = append(missing, name)
		}
	}
	for _, name := range kubeProxyIPVSMode {
		if !xvsNames[name] {
			missing = append(missing, name+" (IPVS mode)")
		}
	}
	slices.Sort(missing)
	t.Logf("kube-proxy exposes %d metric names, xvs %d", len(kpNames), len(xvsNames))
	if len(missing) > 0 {
		t.Errorf("%d of kube-proxy's metric names are not in xvs's /metrics:\n%s", len(missing), strings.Join(missing, "\n"))
	}
	if len(kpNames) < 30 || !kpNames["kubeproxy_sync_proxy_rules_duration_seconds"] || !kpNames["rest_client_requests_total"] {
		t.Errorf("kube-proxy's /metrics looks incomplete (%d names): the comparison proves nothing", len(kpNames))
	}
}

// metricNames are the metric family names of a Prometheus text exposition
// (from its TYPE lines: a histogram's _bucket, _sum and _count are one).
func metricNames(text string) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
		}
	}
	return out
}

// kubeProxyBin is the real kube-proxy v1.37 that make kube-proxy built.
func kubeProxyBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("XVS_KUBE_PROXY_BIN"); p != "" {
		return p // the VM rig's copy (hack/vm/vm.sh)
	}
	bins, _ := filepath.Glob("/var/cache/xvs/kube-proxy/v1.37.*/kube-proxy")
	if len(bins) == 0 {
		t.Fatal("no kube-proxy build under /var/cache/xvs/kube-proxy: run make kube-proxy (make test does)")
	}
	return bins[len(bins)-1]
}

// startKubeProxy runs the real kube-proxy in mode in the node namespace,
// against the world's API server (metrics on 127.0.0.1:10259), and waits
// until it has synced the Services. It is stopped, and its rules removed
// (kube-proxy --cleanup), with the test; its log is shown if the test
// failed.
func startKubeProxy(t *testing.T, w *kubeWorld, bin, mode string) *lab.Process {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
hostnameOverride: node
clientConnection: {kubeconfig: %s}
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10259
healthzBindAddress: 127.0.0.1:10266
`, mode, w.srv.Kubeconfig)), 0o644); err != nil {
		t.Fatal(err)
	}
	kpLog := filepath.Join(t.TempDir(), "kube-proxy.log")
	kp, err := lab.StartTied(w.Node.NS, kpLog, bin, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kp.Stop(5 * time.Second)
		lab.Run(w.Node.NS, bin, "--cleanup")
		if t.Failed() {
			b, _ := os.ReadFile(kpLog)
			t.Logf("kube-proxy log:\n%s", b)
		}
	})
	// It has synced once its sync timestamp is there (2 min: the VM
	// guest under emulation starts it slowly).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, _, body, err := nsGet(w.Node.NS, "http://127.0.0.1:10259/metrics")
		if err == nil && code == 200 && strings.Contains(body, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{") {
			return kp
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy never synced: %d %v", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
