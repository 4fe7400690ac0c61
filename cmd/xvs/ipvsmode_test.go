package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/agent"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/maps"
)

// The ipvs-mode namespace tests need a kernel with IPVS (the VM rig,
// hack/vm): like every TestPriv* they fail, never skip, where they cannot
// run.

// newIPVSWorld is newWorld with the agent in ipvs mode (or falling back to
// it) and a short drain interval.
func newIPVSWorld(t *testing.T, agentArgs ...string) *harness.Single {
	t.Helper()
	w := startIPVSWorld(t, agentArgs...)
	if err := waitIPVS(w, len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return w
}

// startIPVSWorld is newIPVSWorld without the wait: the agent started.
func startIPVSWorld(t *testing.T, agentArgs ...string) *harness.Single {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, IPVS); run them as root")
	}
	if err := ipvs.Available(); err != nil {
		t.Fatalf("ipvs-mode tests need kernel IPVS (run them in the VM: make vmtest): %v", err)
	}
	return startWorld(t, "i", agentArgs...)
}

// listIPVSOf runs `xvs list --proxy-mode ipvs -o json` in the node namespace.
func listIPVSOf(s *harness.Single) (*maps.Snapshot, error) {
	out, err := lab.Run(s.Node.NS, s.Bin, "list", "--proxy-mode", "ipvs", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("xvs list: %v: %s", err, out)
	}
	var snap maps.Snapshot
	if err := json.Unmarshal(out, &snap); err != nil {
		return nil, fmt.Errorf("xvs list output: %v: %s", err, out)
	}
	return &snap, nil
}

// realServers returns the real servers of the VIP's TCP port with their
// weights, as `xvs list` reads them from the kernel.
func realServers(s *harness.Single) (map[netip.AddrPort]maps.BackendView, error) {
	snap, err := listIPVSOf(s)
	if err != nil {
		return nil, err
	}
	out := map[netip.AddrPort]maps.BackendView{}
	for _, sv := range snap.Services {
		if sv.Address == netip.AddrPortFrom(harness.DemoVIP, 80) && sv.Protocol == "TCP" {
			for _, b := range sv.Backends {
				out[b.Address] = b
			}
		}
	}
	return out, nil
}

// waitIPVS polls until the VIP's TCP virtual server has want real servers
// of non-zero weight.
func waitIPVS(s *harness.Single, want int, timeout time.Duration) error {
	return s.WaitCount("IPVS: real servers of non-zero weight", want, timeout, func() (int, error) {
		rs, err := realServers(s)
		n := 0
		for _, b := range rs {
			if b.Weight > 0 {
				n++
			}
		}
		return n, err
	})
}

// TestPrivIPVSTraffic: real TCP and UDP from a client namespace through
// kernel IPVS to three backends; ipvsadm and `xvs list` show the same
// virtual servers; masquerade follows the ClusterCIDR detector.
func TestPrivIPVSTraffic(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs")
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	for name, probe := range map[string]func() lab.Result{
		"TCP": func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second) },
		"UDP": func() lab.Result { return lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 3*time.Second) },
	} {
		got, err := harness.Spread(30, probe)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 3 {
			t.Fatalf("%s: 30 connections reached %v, want all 3 backends", name, got)
		}
		t.Logf("%s through IPVS: %v", name, got)
	}

	// ipvsadm -Ln inside the node shows what xvs programmed.
	out, err := lab.Run(w.Node.NS, "ipvsadm", "-Ln")
	if err != nil {
		t.Fatalf("ipvsadm: %v: %s", err, out)
	}
	for _, want := range []string{"TCP  172.30.0.10:80 rr", "UDP  172.30.0.10:53 rr", "-> 10.244.0.11:8080", "-> 10.244.0.13:8080"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ipvsadm -Ln lacks %q:\n%s", want, out)
		}
	}
	// `xvs list` in ipvs mode, text form.
	list, err := lab.Run(w.Node.NS, w.Bin, "list")
	if err != nil {
		t.Fatalf("xvs list: %v: %s", err, list)
	}
	for _, want := range []string{"xvs (IPVS) virtual servers", "TCP  172.30.0.10:80 rr", "UDP  172.30.0.10:53 rr", "-> 10.244.0.12:8080",
		"  demo/web:http\n", "  demo/web:dns\n", "ready\n"} {
		if !strings.Contains(string(list), want) {
			t.Errorf("xvs list lacks %q:\n%s", want, list)
		}
	}
	t.Logf("xvs list:\n%s", list)
	// The VIP is on kube-ipvs0.
	if out, err := lab.Run(w.Node.NS, "ip", "-o", "addr", "show", "dev", "kube-ipvs0"); err != nil || !strings.Contains(string(out), harness.DemoVIP.String()+"/32") {
		t.Errorf("kube-ipvs0: %v %s", err, out)
	}
	// A host service (an sshd on every address) is not reachable through a
	// VIP on a port that is not a Service (KUBE-IPVS-FILTER, #72236), but
	// still is on the node's own address.
	if _, err := lab.StartEcho(w.Node.NS, netip.AddrPortFrom(netip.IPv4Unspecified(), 2222), lab.TCP); err != nil {
		t.Fatal(err)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoNodeIP, 2222), 3*time.Second); r.Verdict != lab.OK {
		t.Fatalf("host service on the node address: %v", r)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoVIP, 2222), 3*time.Second); r.Verdict != lab.Refused {
		t.Errorf("host service through the VIP: %v, want REFUSED", r)
	}

	// With a ClusterCIDR detector, off-cluster clients are masqueraded and
	// pods are not.
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.StartAgent("--proxy-mode", "ipvs", "--cluster-cidr", "10.244.0.0/16"); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 3, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	var r lab.Result
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if r = lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second); r.Verdict == lab.OK && r.Reply.Peer.Addr() == harness.DemoNodeIP {
			break
		}
	}
	if r.Verdict != lab.OK || r.Reply.Peer.Addr() != harness.DemoNodeIP {
		t.Fatalf("off-cluster client with a ClusterCIDR detector: %v, want the node's address %s as peer", r, harness.DemoNodeIP)
	}
	pod := w.Pods[0]
	sawOther, sawSelf := false, false
	for range 12 {
		r := lab.ProbeTCP(pod, harness.DemoPodIPs[0], tcp, 3*time.Second)
		if r.Verdict != lab.OK {
			t.Fatalf("pod to VIP: %v", r)
		}
		if r.Reply.Local.Addr() == harness.DemoPodIPs[0] {
			// Hairpin: the pod reached itself, which needs masquerade.
			sawSelf = true
			if r.Reply.Peer.Addr() == harness.DemoPodIPs[0] {
				t.Fatalf("hairpin connection not masqueraded: %v", r)
			}
			continue
		}
		sawOther = true
		if r.Reply.Peer.Addr() != harness.DemoPodIPs[0] {
			t.Fatalf("pod source masqueraded: %v, want the pod's own address", r)
		}
	}
	if !sawOther || !sawSelf {
		t.Fatalf("12 connections with rr: hairpin seen %v, other backends seen %v", sawSelf, sawOther)
	}
}

// TestPrivIPVSGracefulTermination: a held TCP connection keeps working
// after its endpoint is removed (the real server drains at weight 0 and
// gets no new connections) and the real server goes once it closes.
func TestPrivIPVSGracefulTermination(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs", "--ipvs-drain-interval", "1s")
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	reply, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held := reply.Local
	// xvs list -c reads the kernel's connection table in ipvs mode.
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	out, err := lab.Run(w.Node.NS, w.Bin, "list", "-c", "--proxy-mode", "ipvs", "-t", tcp.String(), "-o", "json")
	if err != nil {
		t.Fatalf("xvs list -c: %v\n%s", err, out)
	}
	var listed struct{ Connections []maps.Connection }
	if err := json.Unmarshal(out, &listed); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !slices.ContainsFunc(listed.Connections, func(lc maps.Connection) bool {
		return lc.Source == src && lc.Virtual == tcp && lc.Destination == held && lc.State == "ESTABLISHED" && lc.Expires > 0
	}) {
		t.Errorf("xvs list -c in ipvs mode lacks %s -> %s -> %s ESTABLISHED:\n%s", src, tcp, held, out)
	}
	var keep []netip.Addr
	for _, a := range harness.DemoPodIPs {
		if a != held.Addr() {
			keep = append(keep, a)
		}
	}
	if err := w.WriteService(keep); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	rs, err := realServers(w)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := rs[held]; !ok || b.Weight != 0 || b.ActiveConns != 1 {
		t.Fatalf("removed endpoint with a held connection: %+v (present %v), want weight 0 with 1 active connection", b, ok)
	}
	// No new connection goes to it; the held one still works, repeatedly,
	// across several drain passes.
	for i := range 15 {
		r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second)
		if r.Verdict != lab.OK || r.Reply.Local == held {
			t.Fatalf("new connection %d: %v (draining backend is %s)", i, r, held)
		}
		if err := lab.EchoCheck(c, 3*time.Second); err != nil {
			t.Fatalf("held connection broke after the endpoint was removed: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if rs, _ := realServers(w); rs[held].Weight != 0 {
		t.Fatalf("draining real server gone or revived while its connection is open: %v", rs)
	}
	// Close with a RST: IPVS keeps the entry for its short CLOSE timeout
	// (10 s), then the drain loop deletes the real server.
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rs, err := realServers(w)
		if err == nil {
			if _, ok := rs[held]; !ok {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("drained real server %s still present after its connection closed: %v %v", held, rs, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestPrivIPVSUDPEndpointChanges: a UDP client that keeps its source port
// moves to another backend once its backend is removed (the real server
// goes at once: UDP never drains), and is served again when a Service's
// endpoints come back after it had none (#139628). No conntrack entry of
// the removed backend is left. Note: kernel IPVS drops those entries
// itself here (expire_nodest_conn with vs.conntrack=1; datagrams to a
// virtual server without real servers are never confirmed), so this test
// passes without xvs's stale-UDP cleanup too; the cleanup's rule is unit
// tested (TestStaleUDPFilter).
func TestPrivIPVSUDPEndpointChanges(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs")
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	var uc *net.UDPConn
	if err := w.Client.Do(func() (err error) {
		uc, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(harness.DemoClientIP, 40053)), net.UDPAddrFromAddrPort(udp))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	ask := func() (lab.Reply, error) {
		if _, err := uc.Write([]byte("ping")); err != nil {
			return lab.Reply{}, err
		}
		_ = uc.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 512)
		n, err := uc.Read(buf)
		if err != nil {
			return lab.Reply{}, err
		}
		return lab.ParseGreeting(string(buf[:n]))
	}
	first, err := ask()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r, err := ask(); err != nil || r.Local != first.Local {
			t.Fatalf("same source port moved before any change: %v %v (first %v)", r, err, first)
		}
	}
	var keep []netip.Addr
	for _, a := range harness.DemoPodIPs {
		if a != first.Local.Addr() {
			keep = append(keep, a)
		}
	}
	if err := w.WriteService(keep); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	out, err := lab.Run(w.Node.NS, "conntrack", "-L", "-p", "udp", "--reply-src", first.Local.Addr().String())
	if err != nil {
		t.Fatalf("conntrack -L: %v: %s", err, out)
	}
	if strings.Contains(string(out), "dport=53") {
		t.Fatalf("conntrack entries of the removed UDP backend left:\n%s", out)
	}
	var r lab.Reply
	for i := range 5 {
		if r, err = ask(); err == nil {
			break
		}
		t.Logf("datagram %d after removal: %v", i, err)
	}
	if err != nil || r.Local == first.Local || r.Local.Port() != harness.DemoBackendPort {
		t.Fatalf("after removing %s: reply %v, %v; want another backend", first.Local, r, err)
	}

	// #139628: datagrams to a Service without endpoints leave an entry
	// that, kept, blackholes the client's flow once endpoints come back.
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r, err := ask(); err == nil {
			t.Fatalf("reply %v from a Service without endpoints", r)
		}
	}
	if err := w.WriteService(harness.DemoPodIPs); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if r, err = ask(); err == nil {
			break
		}
		t.Logf("datagram %d after the endpoints came back: %v", i, err)
	}
	if err != nil {
		t.Fatalf("the client's flow stays blackholed after the endpoints came back: %v", err)
	}
}

// TestPrivIPVSFallback: a forced BPF load failure with --fallback=ipvs
// serves through IPVS, says why (log line, Node Event to the recording
// sink --event-file, metric), and removes the BPF state; the next agent
// in ebpf mode removes the IPVS state again.
func TestPrivIPVSFallback(t *testing.T) {
	events := filepath.Join(t.TempDir(), "events.jsonl")
	const metricsAddr = "127.0.0.1:10249"
	w := newIPVSWorld(t, "--fallback", "ipvs", "--debug-fail-bpf-load", "--event-file", events, "--metrics-bind-address", metricsAddr)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	got, err := harness.Spread(15, func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second) })
	if err != nil || len(got) != 3 {
		t.Fatalf("traffic after fallback: %v %v", got, err)
	}
	log, _ := os.ReadFile(w.Agent.Log)
	if !strings.Contains(string(log), "falling back to IPVS") || !strings.Contains(string(log), "injected failure") {
		t.Errorf("agent log does not say why it fell back:\n%s", log)
	}
	b, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	var ev agent.EventRecord
	if err := json.Unmarshal([]byte(strings.SplitN(string(b), "\n", 2)[0]), &ev); err != nil {
		t.Fatalf("event file: %v: %s", err, b)
	}
	if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "node" || ev.Type != "Warning" ||
		ev.Reason != "DatapathFallback" || !strings.Contains(ev.Message, "injected failure") {
		t.Errorf("event %+v", ev)
	}
	// The metrics server listens in the node namespace: dial from a thread
	// inside it (net/http would dial from another thread).
	var conn net.Conn
	if err := w.Node.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", metricsAddr, 3*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	for _, want := range []string{`xvs_datapath_mode{mode="ipvs"} 1`, `xvs_datapath_fallbacks_total{reason="BPFLoadFailed",to="ipvs"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, body)
		}
	}
	// The per-Service metrics, from the kernel's IPVS counters, name the
	// Service: the 15 connections above, and the three real servers. The
	// kernel folds its per-CPU counters into what it reports every 2 s
	// (its rate estimator), so the count may lag the connections.
	web := `{frontend="172.30.0.10:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"}`
	if n := metricValue(body, "xvs_service_backends"+web); n != 3 {
		t.Errorf("xvs_service_backends%s = %v, want 3", web, n)
	}
	var conns float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		code, _, b, err := nsGet(w.Node.NS, "http://"+metricsAddr+"/metrics")
		if err == nil && code == 200 {
			conns = metricValue(b, "xvs_service_connections_total"+web)
		}
		if conns >= 15 || time.Now().After(deadline) {
			break
		}
	}
	if conns < 15 {
		t.Errorf("xvs_service_connections_total%s = %v 10 s after, want at least the 15 connections made", web, conns)
	}

	// Back to ebpf: the agent removes the virtual servers, VIPs and rules.
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.StartAgent(); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitProgrammed(3, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	out, err := lab.Run(w.Node.NS, "ipvsadm", "-Ln")
	if err != nil || strings.Contains(string(out), "172.30.0.10") {
		t.Errorf("IPVS state left after switching to ebpf: %v\n%s", err, out)
	}
	if out, err := lab.Run(w.Node.NS, "ip", "link", "show", "kube-ipvs0"); err == nil {
		t.Errorf("kube-ipvs0 left after switching to ebpf: %s", out)
	}
	if out, err := lab.Run(w.Node.NS, "nft", "list", "table", "ip", ipvs.TableName); err == nil {
		t.Errorf("nftables table left after switching to ebpf: %s", out)
	}
	if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second); r.Verdict != lab.OK {
		t.Fatalf("traffic through the BPF datapath after switching back: %v", r)
	}
}

// TestIPVSModeWithoutIPVS: on a kernel without IPVS (this host's), the
// agent in ipvs mode exits at once and names what is missing.
func TestIPVSModeWithoutIPVS(t *testing.T) {
	if ipvs.Available() == nil {
		t.Skip("this kernel has IPVS; the test is for kernels without it")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := time.Now()
	cmd := exec.Command(bin, "agent", "--objects", dir, "--hostname-override", "n1", "--proxy-mode", "ipvs",
		"--pin-path", filepath.Join(dir, "pins"), "--ipvs-state-file", filepath.Join(dir, "state.json"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("agent in ipvs mode ran without IPVS:\n%s", out)
	}
	if !strings.Contains(string(out), "ip_vs kernel module not available") {
		t.Errorf("error does not name the missing module:\n%s", out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to fail", d)
	}
}

// kernelOlderThan reports whether the running kernel is older than
// major.minor.
func kernelOlderThan(major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}

// TestPrivIPVSBesideKubeProxy: kube-proxy's IPVS mode has left its state on
// the node, as a node being migrated has it (kube-ipvs0 with a ClusterIP, a
// virtual server to a pod, its KUBE-SERVICES chain), and a connection
// through it is carrying data. xvs then runs on that node in every way an
// operator would run it during a migration and a rollback: ebpf mode,
// `xvs cleanup` and `xvs agent --cleanup`; ipvs mode on the same
// kube-ipvs0; the switch from ipvs mode back to ebpf; a last cleanup.
// After each step kube-proxy's state is whole, a new transfer through it
// arrives intact, and the held stream through it has lost nothing.
func TestPrivIPVSBesideKubeProxy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, IPVS); run them as root")
	}
	if err := ipvs.Available(); err != nil {
		t.Fatalf("ipvs-mode tests need kernel IPVS (run them in the VM: make vmtest): %v", err)
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := harness.NewSingleT(t, "k", bin)
	if err := w.WriteService(harness.DemoPodIPs); err != nil {
		t.Fatal(err)
	}
	ns := w.Node.NS
	kp := netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), 443)
	kpReal := podAddr(0)
	for _, args := range [][]string{
		{"ip", "link", "add", ipvs.DefaultDevice, "type", "dummy"},
		{"ip", "addr", "add", kp.Addr().String() + "/32", "dev", ipvs.DefaultDevice},
		{"ipvsadm", "-A", "-t", kp.String(), "-s", "rr"},
		{"ipvsadm", "-a", "-t", kp.String(), "-r", kpReal.String(), "-m"},
		{"iptables", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"iptables", "-t", "nat", "-A", "KUBE-SERVICES", "-d", kp.Addr().String() + "/32", "-p", "tcp", "--dport", "443", "-j", "RETURN"},
	} {
		if out, err := lab.Run(ns, args[0], args[1:]...); err != nil {
			t.Fatalf("kube-proxy's state: %v: %v\n%s", args, err, out)
		}
	}
	if err := ns.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/vs/conntrack", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}

	held, err := lab.StartHeldStream(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), kp, lab.HeldSpec{Rate: 256 << 10, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("a connection through kube-proxy's virtual server: %v", err)
	}
	defer held.Close()
	if held.Server.Local != kpReal {
		t.Fatalf("held stream reached %s, want kube-proxy's real server %s", held.Server.Local, kpReal)
	}
	var last int64
	kubeProxyWhole := func(step string) {
		t.Helper()
		out, err := lab.Run(ns, "ipvsadm", "-Ln")
		if got := strings.Join(strings.Fields(string(out)), " "); err != nil || !strings.Contains(got, "TCP "+kp.String()+" rr") ||
			!strings.Contains(got, "-> "+kpReal.String()+" Masq 1") {
			t.Fatalf("%s: kube-proxy's virtual server is gone or changed: %v\n%s", step, err, out)
		}
		if out, err := lab.Run(ns, "ip", "-o", "addr", "show", "dev", ipvs.DefaultDevice); err != nil || !strings.Contains(string(out), kp.Addr().String()+"/32") {
			t.Fatalf("%s: kube-proxy's ClusterIP is no longer on %s: %v\n%s", step, ipvs.DefaultDevice, err, out)
		}
		if out, err := lab.Run(ns, "iptables", "-t", "nat", "-S", "KUBE-SERVICES"); err != nil || !strings.Contains(string(out), "-j RETURN") {
			t.Fatalf("%s: kube-proxy's KUBE-SERVICES chain is gone or changed: %v\n%s", step, err, out)
		}
		res, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), kp, lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20})
		if err != nil || res.Server.Local != kpReal {
			t.Fatalf("%s: a new transfer through kube-proxy's virtual server: %v (reached %s)", step, err, res.Server.Local)
		}
		st, err := held.Check(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if st.Bytes <= last {
			t.Fatalf("%s: the held stream moved no data since the last step (%d bytes)", step, st.Bytes)
		}
		last = st.Bytes
	}
	xvsServes := func(step string) {
		t.Helper()
		_, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80), lab.TransferSpec{Download: 4 << 20})
		if err != nil {
			t.Fatalf("%s: a transfer through xvs's Service: %v", step, err)
		}
	}
	cleanup := func(args ...string) {
		t.Helper()
		if out, err := lab.Run(ns, bin, append(args, "--pin-path", w.PinPath)...); err != nil {
			t.Fatalf("xvs %v: %v\n%s", args, err, out)
		}
	}
	stop := func() {
		t.Helper()
		if err := w.Agent.Stop(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		w.Agent = nil
	}
	startEBPF := func() {
		t.Helper()
		if err := w.StartAgent(); err != nil {
			t.Fatal(err)
		}
		if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	kubeProxyWhole("before xvs")

	// ebpf mode: its programs see kube-proxy's ClusterIP first and leave
	// it to IPVS.
	startEBPF()
	xvsServes("ebpf mode")
	kubeProxyWhole("ebpf mode running")
	stop()
	kubeProxyWhole("ebpf mode stopped")
	cleanup("cleanup")
	kubeProxyWhole("xvs cleanup")
	cleanup("agent", "--cleanup")
	kubeProxyWhole("xvs agent --cleanup")

	// ipvs mode, on kube-proxy's kube-ipvs0.
	if err := w.StartAgent("--proxy-mode", "ipvs"); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	xvsServes("ipvs mode")
	kubeProxyWhole("ipvs mode running")
	snap, err := listIPVSOf(w)
	if err != nil {
		t.Fatal(err)
	}
	for _, sv := range snap.Services {
		if sv.Address == kp {
			t.Errorf("xvs list shows kube-proxy's virtual server %s as xvs's", kp)
		}
	}
	stop()
	kubeProxyWhole("ipvs mode stopped")

	// Back to ebpf: the start removes what xvs's ipvs mode made, only that.
	startEBPF()
	xvsServes("ebpf mode after ipvs mode")
	kubeProxyWhole("ebpf mode after ipvs mode")
	out, err := lab.Run(ns, "ipvsadm", "-Ln")
	if err != nil || strings.Contains(string(out), harness.DemoVIP.String()) {
		t.Errorf("xvs's virtual servers left after switching to ebpf: %v\n%s", err, out)
	}
	if out, err := lab.Run(ns, "ip", "-o", "addr", "show", "dev", ipvs.DefaultDevice); err != nil || strings.Contains(string(out), harness.DemoVIP.String()) {
		t.Errorf("xvs's VIP left on %s after switching to ebpf: %v\n%s", ipvs.DefaultDevice, err, out)
	}
	stop()
	cleanup("cleanup")
	kubeProxyWhole("last xvs cleanup")
	var record string
	ns.Do(func() error { record = ipvs.NamespaceFile("ipvs-state"); return nil })
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("xvs's IPVS record %s after the last cleanup: %v", record, err)
	}
}

// ipvsadmTable reads ipvsadm -Ln's --rate or --stats layout, as ipvsadm
// prints it and as `xvs list` does: the two header lines' fields, and the
// figures of each row, by "TCP ADDR:PORT" for a virtual server and
// "-> ADDR:PORT" for its real servers.
func ipvsadmTable(out []byte) (header []string, rows map[string][]float64, err error) {
	rows = map[string][]float64{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case f[0] == "Prot" || (f[0] == "->" && len(f) == 2 && f[1] == "RemoteAddress:Port"):
			header = append(header, f...)
		case f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP" || f[0] == "->":
			var v []float64
			for _, s := range f[2:] {
				x, perr := strconv.ParseFloat(s, 64)
				if perr != nil {
					return nil, nil, fmt.Errorf("%q: %v", l, perr)
				}
				v = append(v, x)
			}
			rows[f[0]+" "+f[1]] = v
		}
	}
	return header, rows, nil
}

// TestPrivIPVSListRate: `xvs list --rate` in ipvs mode over real traffic
// through kernel IPVS: a new connection every 200 ms to the Service's one
// endpoint, each 128 KiB up and 512 KiB down, every byte checked. Once
// the kernel's rate estimator (what ipvsadm -Ln --rate shows; it folds
// the counters and updates every 2 s) has the traffic, each run of `xvs
// list --rate` with its defaults, -o json and text, shows for the virtual
// server and its real server nonzero CPS, InPPS, OutPPS, InBPS and OutBPS:
// text under ipvsadm --rate's columns; the figures of the order of what
// was sent (In the client's bytes, Out the server's, bytes a second, 40
// to 64 KiB a packet) and of ipvsadm --rate's. Then, the traffic stopped,
// `xvs list --stats` counts every connection made and the bytes sent, as
// ipvsadm -Ln --stats does, under its columns.
func TestPrivIPVSListRate(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs")
	if err := w.WriteService(harness.DemoPodIPs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := waitIPVS(w, 1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	server := podAddr(0)
	vsRow, rsRow := "TCP "+tcp.String(), "-> "+server.String()

	const up, down = 128 << 10, 512 << 10
	type sent struct {
		at       time.Time
		up, down int64
	}
	var (
		mu    sync.Mutex
		done  []sent
		xfail error
	)
	stop, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			r, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), tcp, lab.TransferSpec{Upload: up, Download: down, Timeout: 10 * time.Second})
			if err == nil && r.Server.Local != server {
				err = fmt.Errorf("served by %s, want %s", r.Server.Local, server)
			}
			mu.Lock()
			if err != nil && xfail == nil {
				xfail = err
			}
			if err == nil {
				done = append(done, sent{time.Now(), r.Uploaded, r.Downloaded})
			}
			mu.Unlock()
		}
	}()
	stopTraffic := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-finished
	}
	defer stopTraffic()
	// What was sent a second over the last 10 s (the estimator's memory
	// is about 8 s).
	generated := func() (cps, upBps, downBps float64) {
		mu.Lock()
		defer mu.Unlock()
		if xfail != nil {
			t.Fatalf("a transfer through %s: %v", tcp, xfail)
		}
		const window = 10 * time.Second
		for _, s := range done {
			if time.Since(s.at) < window {
				cps++
				upBps += float64(s.up)
				downBps += float64(s.down)
			}
		}
		return cps / window.Seconds(), upBps / window.Seconds(), downBps / window.Seconds()
	}
	ipvsadm := func(args ...string) ([]string, map[string][]float64) {
		t.Helper()
		out, err := lab.Run(w.Node.NS, "ipvsadm", append([]string{"-Ln", "--exact", "-t", tcp.String()}, args...)...)
		if err != nil {
			t.Fatalf("ipvsadm %v: %v\n%s", args, err, out)
		}
		h, rows, err := ipvsadmTable(out)
		if err != nil || len(rows[vsRow]) != 5 || len(rows[rsRow]) != 5 {
			t.Fatalf("ipvsadm %v (%v): want %s and %s with 5 figures each:\n%s", args, err, vsRow, rsRow, out)
		}
		return h, rows
	}

	// The kernel's estimator has the traffic (and ten seconds of it).
	began := time.Now()
	for deadline := began.Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		_, rows := ipvsadm("--rate")
		if !slices.Contains(rows[vsRow], 0) && !slices.Contains(rows[rsRow], 0) && time.Since(began) > 10*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipvsadm --rate after %v of traffic: %s %v, %s %v", time.Since(began).Round(time.Second), vsRow, rows[vsRow], rsRow, rows[rsRow])
		}
	}

	names := []string{"CPS", "InPPS", "OutPPS", "InBPS", "OutBPS"}
	// plausible checks one row of figures: nonzero, of the order of what
	// was sent, and of the kernel's (ipvsadm's) figures for the row.
	plausible := func(how, row string, got, kernel []float64) {
		t.Helper()
		cps, upBps, downBps := generated()
		if len(got) != 5 {
			t.Errorf("%s: %s: %v, want the 5 figures %v", how, row, got, names)
			return
		}
		for i, want := range []float64{cps, 0, 0, upBps, downBps} {
			if got[i] <= 0 {
				t.Errorf("%s: %s %s = %v, want it nonzero", how, row, names[i], got[i])
			}
			if want > 0 && (got[i] < want/10 || got[i] > want*10) {
				t.Errorf("%s: %s %s = %.0f, sent %.0f a second: not of the same order", how, row, names[i], got[i], want)
			}
			if kernel[i] > 0 && (got[i] < kernel[i]/3 || got[i] > kernel[i]*3) {
				t.Errorf("%s: %s %s = %.0f, ipvsadm --rate %.0f", how, row, names[i], got[i], kernel[i])
			}
		}
		for i, dir := range []string{"In", "Out"} {
			if pps, bps := got[1+i], got[3+i]; pps > 0 && (bps/pps < 40 || bps/pps > 65<<10) {
				t.Errorf("%s: %s %sBPS/%sPPS = %.0f bytes a packet, want 40 to 64 KiB", how, row, dir, dir, bps/pps)
			}
		}
		if got[4] < 2*got[3] {
			t.Errorf("%s: %s OutBPS %.0f, InBPS %.0f: the server sends 4 times what the client does", how, row, got[4], got[3])
		}
	}
	for round := range 3 {
		out, err := lab.Run(w.Node.NS, w.Bin, "list", "--rate", "-t", tcp.String(), "-o", "json")
		if err != nil {
			t.Fatalf("xvs list --rate -o json: %v\n%s", err, out)
		}
		type rate struct {
			Address                           netip.AddrPort
			CPS, InPPS, OutPPS, InBPS, OutBPS float64
		}
		var v struct {
			Services []struct {
				Protocol string
				rate
				Backends []rate
			}
		}
		if err := json.Unmarshal(out, &v); err != nil || len(v.Services) != 1 || v.Services[0].Protocol != "TCP" || v.Services[0].Address != tcp {
			t.Fatalf("xvs list --rate -t %s -o json (%v): want that virtual server alone:\n%s", tcp, err, out)
		}
		_, kernel := ipvsadm("--rate")
		figures := func(r rate) []float64 { return []float64{r.CPS, r.InPPS, r.OutPPS, r.InBPS, r.OutBPS} }
		plausible(fmt.Sprintf("round %d, -o json", round), vsRow, figures(v.Services[0].rate), kernel[vsRow])
		i := slices.IndexFunc(v.Services[0].Backends, func(r rate) bool { return r.Address == server })
		if i < 0 {
			t.Fatalf("xvs list --rate -o json: no real server %s:\n%s", server, out)
		}
		plausible(fmt.Sprintf("round %d, -o json", round), rsRow, figures(v.Services[0].Backends[i]), kernel[rsRow])

		out, err = lab.Run(w.Node.NS, w.Bin, "list", "--rate", "-t", tcp.String())
		if err != nil {
			t.Fatalf("xvs list --rate: %v\n%s", err, out)
		}
		header, rows, err := ipvsadmTable(out)
		kheader, kernel := ipvsadm("--rate")
		if err != nil || !slices.Equal(header, kheader) {
			t.Errorf("xvs list --rate (%v): columns %q, ipvsadm --rate's %q:\n%s", err, header, kheader, out)
		}
		for _, row := range []string{vsRow, rsRow} {
			plausible(fmt.Sprintf("round %d, text", round), row, rows[row], kernel[row])
		}
		cps, upBps, downBps := generated()
		t.Logf("round %d: sent %.1f conn/s, %.0f B/s up, %.0f B/s down; xvs list --rate:\n%s", round, cps, upBps, downBps, out)
	}

	// --stats, once the traffic has stopped and the kernel has folded
	// the last of it: every connection made, the bytes sent (and their
	// headers) each way, the same figures as ipvsadm --stats.
	stopTraffic()
	mu.Lock()
	made, upTotal, downTotal := float64(len(done)), 0.0, 0.0
	for _, s := range done {
		upTotal += float64(s.up)
		downTotal += float64(s.down)
	}
	mu.Unlock()
	var out []byte
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var err error
		out, err = lab.Run(w.Node.NS, w.Bin, "list", "--stats", "-t", tcp.String())
		if err != nil {
			t.Fatalf("xvs list --stats: %v\n%s", err, out)
		}
		header, rows, err := ipvsadmTable(out)
		kheader, kernel := ipvsadm("--stats")
		if err == nil && slices.Equal(header, kheader) && slices.Equal(rows[vsRow], kernel[vsRow]) && slices.Equal(rows[rsRow], kernel[rsRow]) &&
			len(rows[vsRow]) == 5 && rows[vsRow][0] == made {
			for _, row := range []string{vsRow, rsRow} {
				s := rows[row]
				if s[0] != made || s[3] < upTotal || s[3] > 1.2*upTotal || s[4] < downTotal || s[4] > 1.2*downTotal || s[1] < 3*made || s[2] < 3*made {
					t.Errorf("xvs list --stats: %s %v (Conns InPkts OutPkts InBytes OutBytes), want %.0f connections, %.0f bytes in and %.0f out, and their headers", row, s, made, upTotal, downTotal)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("xvs list --stats 15 s after the last of %.0f connections (%v), ipvsadm --stats %v %q:\n%s", made, err, kernel, kheader, out)
		}
	}
	t.Logf("%.0f connections, %.0f bytes up, %.0f down; xvs list --stats:\n%s", made, upTotal, downTotal, out)
}

// TestPrivIPVSAgentJSONLog: an ipvs-mode agent with --logging-format=json
// where `modprobe` fails, as in a container without the host's
// /lib/modules (kernel IPVS is there: the module is loaded): moby/ipvs
// says so through logrus, and that line is a JSON line of the agent's
// stream as every other one, not logrus's text.
func TestPrivIPVSAgentJSONLog(t *testing.T) {
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "modprobe"), []byte("#!/bin/sh\necho \"modprobe: FATAL: Module ${2:-$1} not found in directory /lib/modules/$(uname -r)\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The agent's PATH alone: `xvs list` opens IPVS through moby/ipvs
	// too, and its stderr would have the line.
	path := os.Getenv("PATH")
	t.Setenv("PATH", stub+":"+path)
	start := time.Now()
	w := startIPVSWorld(t, "--proxy-mode", "ipvs", "--logging-format=json")
	os.Setenv("PATH", path)
	if err := waitIPVS(w, len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	if got, err := harness.Spread(15, func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 3*time.Second) }); err != nil || len(got) != 3 {
		t.Fatalf("traffic: %v %v", got, err)
	}
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(w.Agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := parseJSONLog(out, start, time.Now())
	if err != nil {
		t.Error(err)
	}
	if i := slices.IndexFunc(lines, func(l jsonLine) bool {
		return strings.HasPrefix(l.msg(), "Running modprobe ip_vs failed") && l["v"] == 0.0
	}); i < 0 {
		t.Errorf("no JSON line (v 0) from moby/ipvs about the failed modprobe:\n%s", out)
	}
	for _, want := range []string{"xvs agent running", "xvs agent stopping; the datapath stays in place"} {
		if findLine(lines, want, 0, map[string]any{}) == nil {
			t.Errorf("no JSON line %q:\n%s", want, out)
		}
	}
}
