package main

import (
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/model"
)

// TestPrivExplainLive: `xvs explain` against a running agent, checked by
// real traffic. An open connection is explained as tracked, to the pod it
// really reached; a new one as a translation to one of the Service's pods;
// a wrong port as the rejection a real connection meets, and an address
// no Service has as untouched. Explaining leaves no flow behind in the live
// maps.
func TestPrivExplainLive(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	explain := func(args ...string) model.Explanation {
		t.Helper()
		return explainJSON(t, w, append([]string{"--pin-path", w.PinPath}, args...)...)
	}

	reply, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := lab.EchoCheck(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if x := explain("--from", src.String(), "--to", tcp.String(), "--established"); x.Action != "translate" || !x.Tracked ||
		x.Backend.Addr() != reply.Local.Addr() {
		t.Fatalf("the open connection %s (at %s) explained as %+v", src, reply.Local, x)
	}

	fresh := netip.AddrPortFrom(harness.DemoClientIP, 40999)
	x := explain("--from", fresh.String(), "--to", tcp.String())
	if x.Action != "translate" || x.Tracked || x.Verdict != "forward_new" || !slices.Contains(harness.DemoPodIPs, x.Backend.Addr()) {
		t.Fatalf("a new connection explained as %+v, want a translation to one of %v", x, harness.DemoPodIPs)
	}
	if x.Frontend != tcp.String()+"/TCP" || x.Scope != "policy" {
		t.Fatalf("frontend %q scope %q", x.Frontend, x.Scope)
	}
	// The demo's scheduler is random: that run's draw is one of every pod.
	pods := demoPods()
	if x.Scheduler != "random" || !slices.Equal(x.Candidates, pods) {
		t.Fatalf("scheduler %q, candidates %v, want random among %v", x.Scheduler, x.Candidates, pods)
	}
	// Nothing of that run reached the live maps.
	out, err := lab.Run(w.Node.NS, w.Bin, "list", "-c", "--pin-path", w.PinPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), fresh.String()) {
		t.Fatalf("explain left a flow of %s in the live conntrack:\n%s", fresh, out)
	}

	wrong := netip.AddrPortFrom(harness.DemoVIP, 81)
	if x := explain("--from", fresh.String(), "--to", wrong.String()); x.Action != "reject" || x.Verdict != "reject_wrong_port" {
		t.Fatalf("wrong port explained as %+v", x)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, wrong, 2*time.Second); r.Verdict != lab.Refused {
		t.Fatalf("a real connection to the wrong port: %v, want refused as explained", r)
	}
	other := netip.MustParseAddrPort("198.51.100.77:80")
	if x := explain("--from", fresh.String(), "--to", other.String()); x.Action != "pass" {
		t.Fatalf("an address no Service has explained as %+v", x)
	}

	// The text form says the same, in words.
	text, err := lab.Run(w.Node.NS, w.Bin, "explain", "--pin-path", w.PinPath, "--from", fresh.String(), "--to", tcp.String())
	if err != nil || !strings.Contains(string(text), "verdict   forward_new") || !strings.Contains(string(text), "backend   ") {
		t.Fatalf("xvs explain: %v\n%s", err, text)
	}
	t.Logf("xvs explain:\n%s", text)

	// A socket of the node itself: the socket hooks' decision. With
	// round robin each answer names the pod the next real connection
	// from the node reaches (nothing else moves the cursor meanwhile, and
	// explaining moves only the copies').
	reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": "rr"}}, "rr")
	for i := range 4 {
		x := explain("--from-host", "--to", tcp.String())
		if !x.Host || x.Action != "translate" || x.Verdict != "host_socket_balanced" || x.Frontend != tcp.String()+"/TCP" ||
			!slices.Contains(harness.DemoPodIPs, x.Backend.Addr()) {
			t.Fatalf("a host socket explained as %+v", x)
		}
		if x.Scheduler != "rr" || len(x.Candidates) != 0 {
			t.Fatalf("round robin explained with scheduler %q, candidates %v", x.Scheduler, x.Candidates)
		}
		reply, c, err := lab.DialTCP(w.Node.NS, harness.DemoNodeIP, tcp, 2*time.Second)
		if err != nil {
			t.Fatalf("a real connection from the node: %v", err)
		}
		c.Close()
		if reply.Local != x.Backend {
			t.Fatalf("connection %d from the node reached %s, explained as %s", i, reply.Local, x.Backend)
		}
	}
	if x := explain("--from-host", "--to", other.String()); !x.Host || x.Action != "pass" || x.Frontend != "" {
		t.Fatalf("a host socket to an address no Service has explained as %+v", x)
	}
	text, err = lab.Run(w.Node.NS, w.Bin, "explain", "--pin-path", w.PinPath, "--from-host", "--to", tcp.String())
	if err != nil || !strings.Contains(string(text), "verdict   host_socket_balanced") || !strings.Contains(string(text), "backend   ") {
		t.Fatalf("xvs explain --from-host: %v\n%s", err, text)
	}
	t.Logf("xvs explain --from-host:\n%s", text)

	// Without endpoints the hooks refuse the connection at connect().
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitProgrammed(0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if x := explain("--from-host", "--to", tcp.String()); x.Action != "reject" || x.Verdict != "host_socket_refused" ||
		x.Cause != "reject_no_endpoints" {
		t.Fatalf("a host socket to a Service without endpoints explained as %+v", x)
	}
	if r := lab.ProbeTCP(w.Node.NS, harness.DemoNodeIP, tcp, 2*time.Second); r.Verdict != lab.Refused {
		t.Fatalf("a real connection from the node to a Service without endpoints: %v, want refused as explained", r)
	}
}

// TestPrivIPVSExplain: `xvs explain` in ipvs mode, from the kernel's IPVS
// state and xvs's rules, checked by real traffic. A new connection is
// explained with every pod as the scheduler's candidate, an open one as
// tracked to the pod it really reached (IPVS's connection), a wrong port
// as the rejection a real connection meets, an address no Service has as
// untouched, and a socket of the node as IPVS takes it at LOCAL_OUT.
func TestPrivIPVSExplain(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs")
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	explain := func(args ...string) model.Explanation {
		t.Helper()
		return explainJSON(t, w, args...)
	}
	pods := demoPods()
	fresh := netip.AddrPortFrom(harness.DemoClientIP, 40999)
	for _, args := range [][]string{{"--from", fresh.String()}, {"--from-host"}} {
		x := explain(append(args, "--to", tcp.String())...)
		if x.Action != "translate" || x.Verdict != "forward_new" || x.Scheduler != "rr" || x.Frontend != tcp.String()+"/TCP" ||
			!slices.Equal(x.Candidates, pods) {
			t.Fatalf("%v: a new connection explained as %+v, want the scheduler's choice among %v", args, x, pods)
		}
	}

	reply, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if x := explain("--from", src.String(), "--to", tcp.String(), "--established"); x.Action != "translate" || !x.Tracked ||
		x.Backend != reply.Local {
		t.Fatalf("the open connection %s (at %s) explained as %+v", src, reply.Local, x)
	}

	wrong := netip.AddrPortFrom(harness.DemoVIP, 81)
	if x := explain("--from", fresh.String(), "--to", wrong.String()); x.Action != "reject" || x.Verdict != "reject_wrong_port" {
		t.Fatalf("wrong port explained as %+v", x)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, wrong, 2*time.Second); r.Verdict != lab.Refused {
		t.Fatalf("a real connection to the wrong port: %v, want refused as explained", r)
	}
	if x := explain("--from", fresh.String(), "--to", "198.51.100.77:80"); x.Action != "pass" {
		t.Fatalf("an address no Service has explained as %+v", x)
	}
	text, err := lab.Run(w.Node.NS, w.Bin, "explain", "--from", fresh.String(), "--to", tcp.String())
	if err != nil || !strings.Contains(string(text), "verdict   forward_new") || !strings.Contains(string(text), "backend   one of ") {
		t.Fatalf("xvs explain: %v\n%s", err, text)
	}
	t.Logf("xvs explain (ipvs):\n%s", text)
}

// explainJSON runs `xvs explain -o json ARGS` in w's node.
func explainJSON(t *testing.T, w *harness.Single, args ...string) model.Explanation {
	t.Helper()
	out, err := lab.Run(w.Node.NS, w.Bin, append([]string{"explain", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("xvs explain %v: %v\n%s", args, err, out)
	}
	var x model.Explanation
	if err := json.Unmarshal(out, &x); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return x
}

// demoPods are the demo Service's backends, in address order.
func demoPods() []netip.AddrPort {
	pods := make([]netip.AddrPort, len(harness.DemoPodIPs))
	for i := range pods {
		pods[i] = podAddr(i)
	}
	return pods
}

// TestPrivKubeExplainFromPod: `xvs explain --from-pod NS/NAME` reads the
// pod's address from the API server and explains that client's packet; a
// pod without an address of the destination's family and a pod that does
// not exist are errors that say so.
func TestPrivKubeExplainFromPod(t *testing.T) {
	w := newKubeWorld(t)
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, 3, 60*time.Second)
	pods := w.client.CoreV1().Pods(kubeNS)
	// No controller manager makes the namespace's service account.
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: kubeNS}}
	if _, err := w.client.CoreV1().ServiceAccounts(kubeNS).Create(w.ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"client", "pending"} {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNS},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
		if _, err := pods.Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The client pod is the lab's first pod; "pending" has no address yet.
	p, err := pods.Get(w.ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := harness.DemoPodIPs[0].String()
	p.Status.PodIP, p.Status.PodIPs = ip, []v1.PodIP{{IP: ip}}
	if _, err := pods.UpdateStatus(w.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	explain := func(args ...string) ([]byte, error) {
		return lab.Run(w.Node.NS, w.Bin, append([]string{"explain", "-o", "json", "--pin-path", w.PinPath,
			"--kubeconfig", w.srv.Kubeconfig, "--to", tcp.String()}, args...)...)
	}
	out, err := explain("--from-pod", kubeNS+"/client", "--from-port", "41000")
	if err != nil {
		t.Fatalf("xvs explain --from-pod: %v\n%s", err, out)
	}
	var x model.Explanation
	if err := json.Unmarshal(out, &x); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	// The scheduler is random: when it picks the client pod itself, the
	// flow hairpins and is masqueraded; to any other pod it is not.
	want := netip.AddrPortFrom(harness.DemoPodIPs[0], 41000)
	hairpin := x.Backend.Addr() == harness.DemoPodIPs[0]
	if x.Action != "translate" || x.Source != want || (x.Masquerade != "") != hairpin {
		t.Fatalf("the pod's connection explained as %+v, want a translation from %s, masqueraded only when it hairpins (hairpin %v)", x, want, hairpin)
	}
	for pod, want := range map[string]string{"pending": "has no IPv4 address", "absent": "not found"} {
		if out, err := explain("--from-pod", kubeNS+"/"+pod); err == nil || !strings.Contains(string(out), want) {
			t.Errorf("--from-pod %s: %v, want an error saying %q:\n%s", pod, err, want, out)
		}
	}
}
