package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/xvs-lb/xvs/agent"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/lab/kubeapi"
	"github.com/xvs-lb/xvs/maps"
)

// kubeWorld is the single-node world with a real API server instead of a
// manifest directory: the agent runs in the node namespace with
// --kubeconfig, and the test writes Services, EndpointSlices and the Node
// with client-go as the control plane would.
type kubeWorld struct {
	*harness.Single
	srv    *kubeapi.Server
	client kubernetes.Interface
	ctx    context.Context
}

const kubeNS = "demo"

func newKubeWorld(t *testing.T) *kubeWorld {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, BPF); run them as root")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The demo VIP's /24 is the cluster's service range.
	srv := kubeapi.StartT(t, kubeapi.Options{ServiceCIDRs: "172.30.0.0/24"})
	s, err := harness.NewSingle("k", bin)
	if err != nil {
		t.Fatal(err)
	}
	w := &kubeWorld{Single: s, srv: srv, client: srv.Client, ctx: context.Background()}
	t.Cleanup(func() {
		if t.Failed() && w.Agent != nil {
			if log, err := os.ReadFile(w.Agent.Log); err == nil {
				t.Logf("agent log:\n%s", log)
			}
		}
		w.Close()
	})
	// The API server listens on the host's loopback; the agent lives in
	// the node namespace. A forwarder listening on the same address inside
	// the node namespace keeps the kubeconfig (and its certificate's
	// 127.0.0.1 SAN) valid there.
	if err := forwardIntoNS(t, w.Node.NS, srv.Port); err != nil {
		t.Fatal(err)
	}
	w.create(t, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeNS}})
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}
	w.create(t, node)
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: harness.DemoNodeIP.String()}}
	if _, err := w.client.CoreV1().Nodes().UpdateStatus(w.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.create(t, webService("web", harness.DemoVIP, v1.ServiceTypeClusterIP))
	w.create(t, webSlice("web", "web-1", harness.DemoPodIPs, "node"))
	return w
}

// forwardIntoNS makes the API server on the host's 127.0.0.1:port
// reachable at the same address inside ns.
func forwardIntoNS(t *testing.T, ns *lab.NS, port int) error {
	ln, err := lab.ForwardInto(ns, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	t.Cleanup(func() { ln.Close() })
	return nil
}

// create writes obj, retrying transport errors (a freshly started API
// server on a loaded machine sometimes resets the first connections);
// errors from the API itself fail the test at once.
func (w *kubeWorld) create(t *testing.T, obj any) {
	t.Helper()
	var err error
	for range 5 {
		if err = w.tryCreate(t, obj); err == nil || apierrors.ReasonForError(err) != metav1.StatusReasonUnknown {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create %T: %v", obj, err)
	}
}

func (w *kubeWorld) tryCreate(t *testing.T, obj any) error {
	var err error
	switch o := obj.(type) {
	case *v1.Namespace:
		_, err = w.client.CoreV1().Namespaces().Create(w.ctx, o, metav1.CreateOptions{})
	case *v1.Node:
		var n *v1.Node
		if n, err = w.client.CoreV1().Nodes().Create(w.ctx, o, metav1.CreateOptions{}); err == nil {
			*o = *n
		}
	case *v1.Service:
		var s *v1.Service
		if s, err = w.client.CoreV1().Services(kubeNS).Create(w.ctx, o, metav1.CreateOptions{}); err == nil {
			*o = *s
		}
	case *discoveryv1.EndpointSlice:
		_, err = w.client.DiscoveryV1().EndpointSlices(kubeNS).Create(w.ctx, o, metav1.CreateOptions{})
	default:
		t.Fatalf("create %T", obj)
	}
	return err
}

func webService(name string, vip netip.Addr, typ v1.ServiceType) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNS},
		Spec: v1.ServiceSpec{
			Type: typ, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			Ports: []v1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(harness.DemoBackendPort), Protocol: v1.ProtocolTCP},
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(harness.DemoBackendPort), Protocol: v1.ProtocolUDP},
			},
		},
	}
}

// webSlice is the EndpointSlice the EndpointSlice controller would write,
// with the trigger-time annotation it sets (now).
func webSlice(svc, name string, ips []netip.Addr, node string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "test"},
			Annotations: map[string]string{
				v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: new("http"), Port: new(int32(harness.DemoBackendPort)), Protocol: new(v1.ProtocolTCP)},
			{Name: new("dns"), Port: new(int32(harness.DemoBackendPort)), Protocol: new(v1.ProtocolUDP)},
		},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()},
			NodeName: new(node), Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
	}
	return es
}

// updateSlice replaces the slice's endpoints (fresh trigger time).
func (w *kubeWorld) updateSlice(t *testing.T, svc, name string, ips []netip.Addr, node string) {
	t.Helper()
	cur, err := w.client.DiscoveryV1().EndpointSlices(kubeNS).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := webSlice(svc, name, ips, node)
	es.ResourceVersion = cur.ResourceVersion
	if _, err := w.client.DiscoveryV1().EndpointSlices(kubeNS).Update(w.ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startKubeAgent runs `xvs agent --kubeconfig` in the node namespace.
func (w *kubeWorld) startKubeAgent(t *testing.T, extra ...string) {
	t.Helper()
	w.startAgentArgs(t, append([]string{"--kubeconfig", w.srv.Kubeconfig, "--hostname-override", "node"}, extra...)...)
}

// startAgentArgs runs `xvs agent --pin-path ... args` in the node namespace.
func (w *kubeWorld) startAgentArgs(t *testing.T, args ...string) {
	t.Helper()
	args = append([]string{"agent", "--pin-path", w.PinPath}, args...)
	p, err := lab.Start(w.Node.NS, filepath.Join(w.Dir, "..", filepath.Base(w.Dir)+"-agent.log"), w.Bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	w.Agent = p
}

// agentPID finds the agent process by its unique --pin-path argument
// (lab.Start runs it through nsenter, which execs it under its own PID).
func (w *kubeWorld) agentPID(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && args[1] == "agent" && slices.Contains(args, w.PinPath) {
			return pid
		}
	}
	t.Fatal("agent process not found")
	return 0
}

// vipBackends reads the pinned maps: the backends of vip:port/TCP, -1 when
// the frontend is not programmed at all.
func (w *kubeWorld) vipBackends(vip netip.Addr, port uint16) (int, error) {
	m, err := maps.OpenPinned(w.PinPath)
	if err != nil {
		return -1, err
	}
	defer m.Close()
	snap, err := m.Read(false)
	if err != nil {
		return -1, err
	}
	for _, sv := range snap.Services {
		if sv.Address == netip.AddrPortFrom(vip, port) && sv.Protocol == "TCP" {
			return len(sv.Backends), nil
		}
	}
	return -1, nil
}

// waitBackends polls the maps every 2 ms until vip:port has want backends
// and returns how long it took.
func (w *kubeWorld) waitBackends(t *testing.T, vip netip.Addr, port uint16, want int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		n, err := w.vipBackends(vip, port)
		if err == nil && n == want {
			return time.Since(start)
		}
		if ended, aerr := w.Agent.Exited(); ended {
			t.Fatalf("agent exited: %v", aerr)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s:%d: %d backends after %v (err %v), want %d", vip, port, n, timeout, err, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// nsGet does an HTTP GET from inside ns (lab.HTTPGet).
func nsGet(ns *lab.NS, url string) (int, http.Header, string, error) { return lab.HTTPGet(ns, url) }

func (w *kubeWorld) healthz(t *testing.T, path string) (int, map[string]any) {
	t.Helper()
	code, hdr, body, err := nsGet(w.Node.NS, "http://127.0.0.1:10256"+path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s headers %v", path, hdr)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%s body %q: %v", path, body, err)
	}
	return code, m
}

func (w *kubeWorld) metricsText(t *testing.T) string {
	t.Helper()
	code, _, body, err := nsGet(w.Node.NS, "http://127.0.0.1:10249/metrics")
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	return body
}

// metricValue returns the value of the first sample line starting with
// series (name and labels, exactly as exposed), or -1.
func metricValue(body, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestPrivKubeAgent: the agent against a real API server. Services
// and EndpointSlices written with client-go reach the maps, real TCP and
// UDP from a client namespace reach the right pods, EndpointSlice changes
// are programmed in well under a second, kube-proxy's endpoints answer as
// kube-proxy's do, the Starting Event is on the Node, and bad input gets a
// Warning Event and a metric.
func TestPrivKubeAgent(t *testing.T) {
	w := newKubeWorld(t)
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, 3, 60*time.Second)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)

	t.Run("traffic", func(t *testing.T) {
		for name, probe := range map[string]func() lab.Result{
			"TCP": func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second) },
			"UDP": func() lab.Result { return lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 2*time.Second) },
		} {
			got, err := harness.Spread(60, probe)
			if err != nil || len(got) != 3 {
				t.Fatalf("%s: 60 connections reached %v (%v), want all 3 pods", name, got, err)
			}
		}
	})

	t.Run("programming latency", func(t *testing.T) {
		// Alternate 3 and 2 endpoints; each change must reach the maps
		// from its watch event, well before the periodic sync (30 s):
		// waitBackends gives it 5 s. The changes are 150 ms apart, past
		// minSyncPeriod (100 ms), so each is one isolated change (API
		// write, watch event, sync); the figures are logged, and measured
		// at scale by the control-plane benchmark (docs/BENCHMARKS.md).
		var took []time.Duration
		for i := range 10 {
			want := harness.DemoPodIPs[:2+i%2]
			time.Sleep(150 * time.Millisecond)
			start := time.Now()
			w.updateSlice(t, "web", "web-1", want, "node")
			w.waitBackends(t, harness.DemoVIP, 80, len(want), 5*time.Second)
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		t.Logf("EndpointSlice update -> maps: min %v, median %v, max %v (10 updates, API round trip included)",
			took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
		// The last state has 3 endpoints; connections spread over them.
		if got, err := harness.Spread(30, func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second) }); err != nil || len(got) != 3 {
			t.Fatalf("after the updates: %v %v", got, err)
		}
	})

	t.Run("services", func(t *testing.T) {
		// A second Service with one endpoint: only that pod answers.
		apiVIP := netip.MustParseAddr("172.30.0.11")
		w.create(t, webService("api", apiVIP, v1.ServiceTypeClusterIP))
		w.create(t, webSlice("api", "api-1", harness.DemoPodIPs[1:2], "node"))
		w.waitBackends(t, apiVIP, 80, 1, 5*time.Second)
		for range 10 {
			r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(apiVIP, 80), 2*time.Second)
			if r.Verdict != lab.OK || r.Reply.Local != podAddr(1) {
				t.Fatalf("api: %v, want pod2", r)
			}
		}
		// Its slice deleted: no endpoints, connections are refused.
		if err := w.client.DiscoveryV1().EndpointSlices(kubeNS).Delete(w.ctx, "api-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.waitBackends(t, apiVIP, 80, 0, 5*time.Second)
		if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(apiVIP, 80), 2*time.Second); r.Verdict != lab.Refused {
			t.Fatalf("api without endpoints: %v, want refused", r)
		}
		// The Service deleted: its frontend leaves the maps.
		if err := w.client.CoreV1().Services(kubeNS).Delete(w.ctx, "api", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.waitBackends(t, apiVIP, 80, -1, 5*time.Second)
		// Another proxy's Service is left alone.
		other := webService("other", netip.MustParseAddr("172.30.0.13"), v1.ServiceTypeClusterIP)
		other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
		w.create(t, other)
		w.create(t, webSlice("other", "other-1", harness.DemoPodIPs, "node"))
		time.Sleep(time.Second)
		if n, _ := w.vipBackends(netip.MustParseAddr("172.30.0.13"), 80); n != -1 {
			t.Fatalf("a Service labelled for another proxy was programmed (%d backends)", n)
		}
	})

	t.Run("service CIDRs", func(t *testing.T) {
		// No --service-cluster-ip-range: the ranges come from the API
		// server's ServiceCIDR objects. Its own "kubernetes" one holds
		// 172.30.0.0/24, so an address there that no Service has is
		// dropped; an extra ServiceCIDR created now extends the drop, and
		// its deletion ends it.
		unallocated := netip.AddrPortFrom(netip.MustParseAddr("172.30.0.200"), 80)
		extra := netip.AddrPortFrom(netip.MustParseAddr("172.31.0.9"), 80)
		dropped := func() uint64 {
			t.Helper()
			m, err := maps.OpenPinned(w.PinPath)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			snap, err := m.Read(true)
			if err != nil {
				t.Fatal(err)
			}
			return snap.Verdicts["drop_unallocated_service_ip"].PacketsIn
		}
		probe := func(dst netip.AddrPort) lab.Result {
			return lab.ProbeTCP(w.Client, harness.DemoClientIP, dst, time.Second)
		}
		before := dropped()
		if r := probe(unallocated); r.Verdict != lab.Timeout || dropped() == before {
			t.Fatalf("unallocated %s in the API server's ServiceCIDR: %v, drops %d -> %d; want TIMEOUT, counted",
				unallocated, r, before, dropped())
		}
		// Outside every range the node answers as it would without xvs.
		if r := probe(extra); r.Verdict == lab.Timeout {
			t.Fatalf("%s before its ServiceCIDR exists: %v, want the node's own answer", extra, r)
		}
		cidrs := w.client.NetworkingV1().ServiceCIDRs()
		if _, err := cidrs.Create(w.ctx, &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: "extra"},
			Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"172.31.0.0/24"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitVerdict := func(what string, want func(lab.Result) bool) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				r := probe(extra)
				if want(r) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s: %v", what, extra, r)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		before = dropped()
		waitVerdict("after the ServiceCIDR was created", func(r lab.Result) bool { return r.Verdict == lab.Timeout })
		if dropped() == before {
			t.Fatal("the extra range's probe timed out without a drop_unallocated_service_ip count")
		}
		if err := cidrs.Delete(w.ctx, "extra", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// The API server lets it go once no Service holds an address in
		// it (its finalizer); then the drop ends.
		waitVerdict("after the ServiceCIDR was deleted", func(r lab.Result) bool { return r.Verdict != lab.Timeout })
		if r := probe(unallocated); r.Verdict != lab.Timeout {
			t.Fatalf("the API server's own range after the extra one left: %v, want TIMEOUT", r)
		}
	})

	t.Run("kube-proxy endpoints", func(t *testing.T) {
		code, body := w.healthz(t, "/healthz")
		if code != 200 || body["nodeEligible"] != true || body["lastUpdated"] == nil || body["currentTime"] == nil {
			t.Fatalf("/healthz %d %v", code, body)
		}
		if code, body := w.healthz(t, "/livez"); code != 200 || body["lastUpdated"] == nil {
			t.Fatalf("/livez %d %v", code, body)
		}
		if code, _, mode, err := nsGet(w.Node.NS, "http://127.0.0.1:10249/proxyMode"); err != nil || code != 200 || mode != "ebpf" {
			t.Fatalf("/proxyMode %d %q %v", code, mode, err)
		}
		code, _, cz, err := nsGet(w.Node.NS, "http://127.0.0.1:10249/configz")
		var configz map[string]struct {
			Mode             string `json:"mode"`
			HostnameOverride string `json:"hostnameOverride"`
		}
		if err != nil || code != 200 || json.Unmarshal([]byte(cz), &configz) != nil ||
			configz["kubeproxy.config.k8s.io"].Mode != "ebpf" || configz["kubeproxy.config.k8s.io"].HostnameOverride != "node" {
			t.Fatalf("/configz %d %v: %s", code, err, cz)
		}
		// kube-proxy's text log format: klog's header, the message
		// quoted, key="value" pairs; client-go's lines in the same stream.
		if log, _ := os.ReadFile(w.Agent.Log); !regexp.MustCompile(`(?m)^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ agent\.go:\d+\] "xvs agent running" node="node" source="kubernetes"`).Match(log) {
			t.Errorf("agent log is not in klog's text format:\n%s", log)
		}
		// kube-proxy's z-pages (agent/zpages.go): the command line the
		// agent was started with, and what it is.
		if code, _, fz, err := nsGet(w.Node.NS, "http://127.0.0.1:10249/flagz"); err != nil || code != 200 ||
			!regexp.MustCompile(`(?m)^hostname-override(:|: |=| )node$`).MatchString(fz) {
			t.Fatalf("/flagz %d %v:\n%s", code, err, fz)
		}
		if code, _, sz, err := nsGet(w.Node.NS, "http://127.0.0.1:10249/statusz"); err != nil || code != 200 || !strings.Contains(sz, "Binary version") {
			t.Fatalf("/statusz %d %v:\n%s", code, err, sz)
		}
		m := w.metricsText(t)
		if n := metricValue(m, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`); n < 10 {
			t.Errorf("network programming latency observed %v times, want >= 10", n)
		}
		if n := metricValue(m, `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"}`); n < 10 {
			t.Errorf("%v programming latencies under 1 s", n)
		}
		for _, series := range []string{
			`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
			`kubeproxy_sync_proxy_rules_endpoint_changes_total`,
			`kubeproxy_sync_proxy_rules_service_changes_total`,
			`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
			`xvs_datapath_packets_total{verdict="forward_new"}`,
		} {
			if v := metricValue(m, series); v <= 0 {
				t.Errorf("%s = %v", series, v)
			}
		}
		if v := metricValue(m, `kubeproxy_proxy_healthz_total{code="200"}`); v < 1 {
			t.Errorf("healthz counter %v", v)
		}

		// The autoscaler's taint makes the node ineligible: /healthz
		// fails, /livez does not.
		setTaint := func(on bool) {
			n, err := w.client.CoreV1().Nodes().Get(w.ctx, "node", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Spec.Taints = nil
			if on {
				n.Spec.Taints = []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}
			}
			if _, err := w.client.CoreV1().Nodes().Update(w.ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		waitCode := func(want int) map[string]any {
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				code, body := w.healthz(t, "/healthz")
				if code == want {
					return body
				}
				if time.Now().After(deadline) {
					t.Fatalf("/healthz %d %v, want %d", code, body, want)
				}
			}
		}
		setTaint(true)
		if body := waitCode(503); body["nodeEligible"] != false {
			t.Fatalf("tainted node: %v", body)
		}
		if code, _ := w.healthz(t, "/livez"); code != 200 {
			t.Fatalf("/livez %d on a tainted node", code)
		}
		setTaint(false)
		waitCode(200)
	})

	t.Run("events", func(t *testing.T) {
		waitEvent(t, w, "Node", "node", "Starting")
		// An EndpointSlice without the kubernetes.io/service-name label
		// belongs to no Service: a Warning Event on it and a metric.
		orphan := webSlice("x", "orphan-1", harness.DemoPodIPs, "node")
		delete(orphan.Labels, discoveryv1.LabelServiceName)
		w.create(t, orphan)
		ev := waitEvent(t, w, "EndpointSlice", "orphan-1", "XvsInvalidInput")
		if ev.Type != v1.EventTypeWarning || !strings.Contains(ev.Note, "kubernetes.io/service-name") {
			t.Errorf("orphan slice event: %s %q", ev.Type, ev.Note)
		}
		// A Service the API accepts but xvs can only partly honour: an
		// unknown scheduler in the xvs.io/scheduler annotation. It is
		// still served (with the default scheduler), and says why.
		odd := webService("odd", netip.MustParseAddr("172.30.0.14"), v1.ServiceTypeClusterIP)
		odd.Annotations = map[string]string{"xvs.io/scheduler": "fastest"}
		w.create(t, odd)
		w.create(t, webSlice("odd", "odd-1", harness.DemoPodIPs[:1], "node"))
		ev = waitEvent(t, w, "Service", "odd", "XvsInvalidInput")
		if ev.Type != v1.EventTypeWarning || !strings.Contains(ev.Note, `"fastest"`) {
			t.Errorf("odd Service event: %s %q", ev.Type, ev.Note)
		}
		w.waitBackends(t, netip.MustParseAddr("172.30.0.14"), 80, 1, 5*time.Second)
		m := w.metricsText(t)
		for _, kind := range []string{"EndpointSlice", "Service"} {
			if v := metricValue(m, `xvs_problems{kind="`+kind+`"}`); v != 1 {
				t.Errorf(`xvs_problems{kind="%s"} = %v`, kind, v)
			}
		}
		if ended, err := w.Agent.Exited(); ended {
			t.Fatalf("agent exited on bad input: %v", err)
		}

		// A tenant rewriting the annotation ten times a second, a new bad
		// value each time: the Service gets at most the burst of Events,
		// the rest are counted as dropped, and it is served throughout.
		stop := time.Now().Add(8 * time.Second)
		for i := 0; time.Now().Before(stop); i++ {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"xvs.io/scheduler":"fastest-%d"}}}`, i)
			if _, err := w.client.CoreV1().Services(kubeNS).Patch(w.ctx, "odd", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		w.waitBackends(t, netip.MustParseAddr("172.30.0.14"), 80, 1, 5*time.Second)
		time.Sleep(2 * time.Second) // the last sync's Events, if any, reach the API
		list, err := w.client.EventsV1().Events("").List(w.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range list.Items {
			if e.Regarding.Kind == "Service" && e.Regarding.Name == "odd" && e.Reason == "XvsInvalidInput" {
				n++
			}
		}
		dropped := metricValue(w.metricsText(t), "xvs_events_dropped_total")
		t.Logf("annotation storm: %d Events on the Service, %v dropped", n, dropped)
		if n > agent.EventBurst || dropped < 1 {
			t.Errorf("annotation storm: %d Events on the Service (at most %d), %v dropped (want some)", n, agent.EventBurst, dropped)
		}
	})
}

type eventSummary struct{ Type, Note string }

// waitEvent waits for an events.k8s.io Event with reason about the object
// kind/name, from the xvs reporting controller.
func waitEvent(t *testing.T, w *kubeWorld, kind, name, reason string) eventSummary {
	t.Helper()
	return waitEventNote(t, w, kind, name, reason, "")
}

// waitEventNote is waitEvent for an Event whose note contains note.
func waitEventNote(t *testing.T, w *kubeWorld, kind, name, reason, note string) eventSummary {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := w.client.EventsV1().Events("").List(w.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason && e.ReportingController == "xvs" &&
				strings.Contains(e.Note, note) {
				t.Logf("%s event on %s/%s: %s %q (action %s, instance %s)", reason, kind, name, e.Type, e.Note, e.Action, e.ReportingInstance)
				return eventSummary{e.Type, e.Note}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on %s %s saying %q among %d events", reason, kind, name, note, len(list.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPrivKubeHealthCheckNodePort: an externalTrafficPolicy=Local
// LoadBalancer Service gets a health check server on its
// healthCheckNodePort, reachable from a client on the node's address,
// answering 200 with local endpoints and 503 without, with kube-proxy's
// body and headers.
func TestPrivKubeHealthCheckNodePort(t *testing.T) {
	w := newKubeWorld(t)
	lb := webService("lb", netip.MustParseAddr("172.30.0.12"), v1.ServiceTypeLoadBalancer)
	lb.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	w.create(t, lb)
	if lb.Spec.HealthCheckNodePort == 0 {
		t.Fatal("API server allocated no healthCheckNodePort")
	}
	w.create(t, webSlice("lb", "lb-1", harness.DemoPodIPs[:2], "node"))
	// This agent reads a KubeProxyConfiguration file, with a field xvs
	// does not support and a feature gate it does not know, and logs in
	// component-base's JSON format.
	cfg := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: `+w.srv.Kubeconfig+`}
hostnameOverride: node
oomScoreAdj: 500
nftables: {masqueradeAll: true}
featureGates: {SomeAlphaGate: true}
logging: {format: json}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	w.startAgentArgs(t, "--config", cfg)
	w.waitBackends(t, netip.MustParseAddr("172.30.0.12"), 80, 2, 60*time.Second)

	m := w.metricsText(t)
	for _, f := range []string{"nftables.masqueradeAll", "featureGates.SomeAlphaGate"} {
		if v := metricValue(m, `xvs_config_unsupported_fields{field="`+f+`"}`); v != 1 {
			t.Errorf("unsupported field %s: metric %v", f, v)
		}
	}
	// Every line is a JSON object (ts, caller, msg, v, and the pairs), the
	// warning about the field among them.
	log, _ := os.ReadFile(w.Agent.Log)
	named := false
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] == nil || rec["ts"] == nil || rec["caller"] == nil {
			t.Errorf("not a JSON log record (%v): %s", err, line)
			continue
		}
		named = named || rec["field"] == "nftables.masqueradeAll"
	}
	if !named {
		t.Errorf("agent log does not name the unsupported field:\n%s", log)
	}
	adj, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", w.agentPID(t)))
	if err != nil || strings.TrimSpace(string(adj)) != "500" {
		t.Errorf("oom_score_adj %q (%v), want 500 from oomScoreAdj", adj, err)
	}

	url := fmt.Sprintf("http://%s/", netip.AddrPortFrom(harness.DemoNodeIP, uint16(lb.Spec.HealthCheckNodePort)))
	check := func(wantCode, wantLocal int) {
		t.Helper()
		var code int
		var hdr http.Header
		var body string
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if code, hdr, body, err = nsGet(w.Client, url); err == nil && code == wantCode {
				break
			}
		}
		if err != nil || code != wantCode {
			t.Fatalf("GET %s from the client: %d %v %s, want %d", url, code, err, body, wantCode)
		}
		var got struct {
			Service             struct{ Namespace, Name string } `json:"service"`
			LocalEndpoints      int                              `json:"localEndpoints"`
			ServiceProxyHealthy bool                             `json:"serviceProxyHealthy"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if got.Service.Namespace != kubeNS || got.Service.Name != "lb" || got.LocalEndpoints != wantLocal || !got.ServiceProxyHealthy {
			t.Fatalf("body %+v", got)
		}
		if hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" ||
			hdr.Get("X-Load-Balancing-Endpoint-Weight") != strconv.Itoa(wantLocal) {
			t.Fatalf("headers %v", hdr)
		}
	}
	check(200, 2)
	// The endpoints move to another node: 503, 0 local endpoints.
	w.updateSlice(t, "lb", "lb-1", harness.DemoPodIPs[:2], "elsewhere")
	check(503, 0)
	w.updateSlice(t, "lb", "lb-1", harness.DemoPodIPs, "node")
	check(200, 3)

	// kube-proxy's --cleanup: the agent removes its datapath and exits.
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "agent", "--cleanup", "--pin-path", w.PinPath); err != nil {
		t.Fatalf("agent --cleanup: %v\n%s", err, out)
	}
	if _, err := os.Stat(w.PinPath); !os.IsNotExist(err) {
		t.Fatalf("pins left after --cleanup: %v", err)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(netip.MustParseAddr("172.30.0.12"), 80), time.Second); r.Verdict == lab.OK {
		t.Fatalf("VIP still served after --cleanup: %v", r)
	}
}

// TestPrivKubeAPIServerOutage: with the API server stopped for 60 s the
// datapath keeps serving its last state and /healthz stays 200 (nothing is
// pending), even across an agent restart in the middle of the outage; when
// the server returns the agent's watches resume (or, for the restarted
// agent, its caches sync), and a change made then is applied.
func TestPrivKubeAPIServerOutage(t *testing.T) {
	w := newKubeWorld(t)
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, 3, 60*time.Second)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)

	if err := w.srv.Stop(); err != nil {
		// Stop reports a server that had to be killed; what matters here
		// is that it is gone.
		if w.srv.Running() {
			t.Fatal(err)
		}
		t.Logf("stop: %v", err)
	}
	down := time.Now()
	probes := 0
	restarted := false
	for time.Since(down) < 60*time.Second {
		if !restarted && time.Since(down) > 25*time.Second {
			// An agent (re)started while the API server is away must not
			// sync before its informers have synced: the pinned state
			// keeps serving instead of an empty one.
			if err := w.Agent.Stop(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			w.startKubeAgent(t)
			restarted = true
			// Until the new agent serves /healthz (it loads its program
			// first), connections must keep working.
			for deadline := time.Now().Add(30 * time.Second); ; {
				if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second); r.Verdict != lab.OK {
					t.Fatalf("while the agent restarts: %v", r)
				}
				probes++
				if code, _, _, err := nsGet(w.Node.NS, "http://127.0.0.1:10256/healthz"); err == nil && code == 200 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("restarted agent never served /healthz")
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		// 15 connections over 3 backends all land on one with
		// probability 3^-14 (about 2e-7) per round; with 6 it was 1/243,
		// which flaked a CI run.
		got, err := harness.Spread(15, func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second) })
		if err != nil || len(got) < 2 {
			t.Fatalf("%v into the outage: %v %v", time.Since(down).Round(time.Second), got, err)
		}
		probes += 15
		if code, _ := w.healthz(t, "/healthz"); code != 200 {
			t.Fatalf("/healthz %d during the outage with nothing pending", code)
		}
		if ended, err := w.Agent.Exited(); ended {
			t.Fatalf("agent exited during the outage: %v", err)
		}
		time.Sleep(5 * time.Second)
	}
	t.Logf("%d connections through the datapath during a %v API server outage", probes, time.Since(down).Round(time.Second))

	if err := w.srv.Restart(w.ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	w.updateSlice(t, "web", "web-1", harness.DemoPodIPs[:1], "node")
	took := w.waitBackends(t, harness.DemoVIP, 80, 1, 90*time.Second)
	t.Logf("first change after the API server returned applied %v after the restart (%v after the update)",
		time.Since(back).Round(time.Millisecond), took.Round(time.Millisecond))
	for range 10 {
		if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second); r.Verdict != lab.OK || r.Reply.Local != podAddr(0) {
			t.Fatalf("after resync: %v, want pod1 only", r)
		}
	}
	// Changes keep flowing at the usual speed once the watches are back.
	start := time.Now()
	w.updateSlice(t, "web", "web-1", harness.DemoPodIPs, "node")
	w.waitBackends(t, harness.DemoVIP, 80, 3, 5*time.Second)
	t.Logf("next change applied in %v", time.Since(start).Round(time.Millisecond))
}

// TestPrivKubeFirstSyncGuard: a restarted agent whose first list has lost
// most Services (here really deleted while it was down) checks with a
// direct list of the API server before removing them, finds the same
// picture, and applies it: the guard never holds a true change.
func TestPrivKubeFirstSyncGuard(t *testing.T) {
	w := newKubeWorld(t)
	vips := make([]netip.Addr, 20)
	for i := range vips {
		vips[i] = netip.AddrFrom4([4]byte{172, 30, 0, byte(100 + i)})
		w.create(t, webService(fmt.Sprintf("many-%d", i), vips[i], v1.ServiceTypeClusterIP))
		w.create(t, webSlice(fmt.Sprintf("many-%d", i), fmt.Sprintf("many-%d-1", i), harness.DemoPodIPs[:1], "node"))
	}
	w.startKubeAgent(t)
	w.waitBackends(t, vips[19], 80, 1, 20*time.Second)
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 18 {
		if err := w.client.CoreV1().Services(kubeNS).Delete(w.ctx, fmt.Sprintf("many-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.startKubeAgent(t)
	w.waitBackends(t, vips[0], 80, -1, 20*time.Second)
	w.waitBackends(t, vips[19], 80, 1, time.Second)
	log, err := os.ReadFile(w.Agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "a second, direct list of the API server agrees") {
		t.Errorf("the first sync removed 18 of 21 Services without a confirming list:\n%s", log)
	}
	if v := metricValue(w.metricsText(t), "xvs_first_sync_held_total"); v != 0 {
		t.Errorf("xvs_first_sync_held_total = %v, want 0", v)
	}
}

// TestPrivKubeContestedAddress: a tenant's Service (first by name, and
// older than nothing it competes with but the ClusterIP) that lists
// another Service's ClusterIP among its externalIPs takes nothing: the
// address keeps its three backends and the owner is still reached through
// it by real traffic. By default the externalIP is refused for being in
// the API server's ServiceCIDR, with a Warning Event saying so; an agent
// started with --allow-external-ips-in-service-cidrs (a full sync, which
// gave the address to the first name before the collision rule) serves
// the externalIP but keeps the address for its owner, and the tenant's
// Service gets a Warning Event saying who keeps it.
func TestPrivKubeContestedAddress(t *testing.T) {
	w := newKubeWorld(t)
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, len(harness.DemoPodIPs), 60*time.Second)
	thief := webService("aaa-thief", netip.MustParseAddr("172.30.0.20"), v1.ServiceTypeClusterIP)
	thief.Spec.ExternalIPs = []string{harness.DemoVIP.String()}
	w.create(t, thief)
	w.create(t, webSlice("aaa-thief", "aaa-thief-1", harness.DemoPodIPs[:1], "node"))
	w.waitBackends(t, netip.MustParseAddr("172.30.0.20"), 80, 1, 10*time.Second)
	if ev := waitEventNote(t, w, "Service", "aaa-thief", "XvsInvalidInput", "inside the service CIDR"); ev.Type != v1.EventTypeWarning ||
		!strings.Contains(ev.Note, harness.DemoVIP.String()) {
		t.Errorf("the tenant's Event: %s %q", ev.Type, ev.Note)
	}
	check := func(when string) {
		t.Helper()
		if n, err := w.vipBackends(harness.DemoVIP, 80); err != nil || n != len(harness.DemoPodIPs) {
			t.Fatalf("%s: %s:80 has %d backends (%v), want demo/web's %d", when, harness.DemoVIP, n, err, len(harness.DemoPodIPs))
		}
		got, err := harness.Spread(30, func() lab.Result {
			return lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoVIP, 80), 3*time.Second)
		})
		if err != nil || len(got) != len(harness.DemoPodIPs) {
			t.Fatalf("%s: 30 connections to %s:80 reached %v (%v), want all of demo/web's pods", when, harness.DemoVIP, got, err)
		}
	}
	check("while the agent runs")
	if err := w.Agent.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	w.startKubeAgent(t, "--allow-external-ips-in-service-cidrs")
	w.waitBackends(t, netip.MustParseAddr("172.30.0.20"), 80, 1, 60*time.Second)
	time.Sleep(time.Second) // the first full sync is done: nothing changes after it
	check("after a restart that allows externalIPs in the service CIDRs")
	if ev := waitEventNote(t, w, "Service", "aaa-thief", "XvsInvalidInput", "which keeps it"); ev.Type != v1.EventTypeWarning ||
		!strings.Contains(ev.Note, "ExternalIP "+harness.DemoVIP.String()+":") || !strings.Contains(ev.Note, "demo/web (ClusterIP), which keeps it") {
		t.Errorf("the tenant's Event: %s %q", ev.Type, ev.Note)
	}
}
