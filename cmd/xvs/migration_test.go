package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/maps"
)

// The switch from kube-proxy to xvs as docs/migration.md describes it, with
// connections in flight: kube-proxy's state serves the demo Service (its
// rules, or its IPVS virtual servers); three TCP streams and a UDP client
// that keeps its port flow through it; xvs starts for the same Service,
// then kube-proxy's state is removed as `kube-proxy --cleanup` removes it.
// With adoption (the default) every stream carries on, on its backend,
// every byte intact, and the UDP client keeps its backend; without it
// (--adopt-connections=false) the streams stall, which is what the test
// would see if adoption did nothing.

// kubeProxyShape is kube-proxy's state for the demo Service in one mode.
type kubeProxyShape struct {
	setup   [][]string        // commands in the node namespace
	sysctls map[string]string // under /proc/sys/, set after setup
	cleanup [][]string        // what `kube-proxy --cleanup` does
	// masquerade: the backends see the node's address, not the client's.
	masquerade bool
	// through reports whether a client's connection to the VIP went
	// through kube-proxy's state.
	through func(ns *lab.NS, client netip.AddrPort, proto uint8) (bool, error)
}

// kubeForward is kube-proxy's KUBE-FORWARD chain, which drops INVALID
// packets: a mid-flow segment netfilter cannot place is dropped there.
var kubeForward = [][]string{
	{"iptables", "-N", "KUBE-FORWARD"},
	{"iptables", "-A", "FORWARD", "-j", "KUBE-FORWARD"},
	{"iptables", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
	{"iptables", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
}

var kubeForwardCleanup = [][]string{
	{"iptables", "-D", "FORWARD", "-j", "KUBE-FORWARD"},
	{"iptables", "-F", "KUBE-FORWARD"},
	{"iptables", "-X", "KUBE-FORWARD"},
}

// iptablesShape: kube-proxy's iptables mode (KUBE-SERVICES, a KUBE-SVC
// chain per port choosing a KUBE-SEP chain at random, DNAT there). With
// masquerade, what kube-proxy adds for clients outside the cluster CIDR:
// KUBE-MARK-MASQ, and KUBE-POSTROUTING's MASQUERADE --random-fully (the
// backend sees the node's address and another port).
func iptablesShape(masquerade bool) kubeProxyShape {
	vip := harness.DemoVIP.String()
	k := kubeProxyShape{masquerade: masquerade, setup: [][]string{
		{"iptables", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"iptables", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"},
	}, cleanup: [][]string{
		{"iptables", "-t", "nat", "-D", "PREROUTING", "-j", "KUBE-SERVICES"},
		{"iptables", "-t", "nat", "-F"},
		{"iptables", "-t", "nat", "-X"},
	}}
	for _, p := range []struct{ proto, port, svc string }{{"tcp", "80", "KUBE-SVC-WEB"}, {"udp", "53", "KUBE-SVC-DNS"}} {
		k.setup = append(k.setup, []string{"iptables", "-t", "nat", "-N", p.svc},
			[]string{"iptables", "-t", "nat", "-A", "KUBE-SERVICES", "-d", vip + "/32", "-p", p.proto, "--dport", p.port, "-j", p.svc})
		if masquerade {
			k.setup = append(k.setup, []string{"iptables", "-t", "nat", "-A", p.svc, "!", "-s", "10.244.0.0/16", "-j", "KUBE-MARK-MASQ"})
		}
		n := len(harness.DemoPodIPs)
		for i := range n {
			sep := fmt.Sprintf("KUBE-SEP-%s-%d", p.proto, i)
			k.setup = append(k.setup, []string{"iptables", "-t", "nat", "-N", sep},
				[]string{"iptables", "-t", "nat", "-A", sep, "-p", p.proto, "-j", "DNAT", "--to-destination", podAddr(i).String()})
			rule := []string{"iptables", "-t", "nat", "-A", p.svc}
			if i < n-1 {
				rule = append(rule, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.5f", 1/float64(n-i)))
			}
			k.setup = append(k.setup, append(rule, "-j", sep))
		}
	}
	if masquerade {
		k.setup = append([][]string{
			{"iptables", "-t", "nat", "-N", "KUBE-MARK-MASQ"},
			{"iptables", "-t", "nat", "-A", "KUBE-MARK-MASQ", "-j", "MARK", "--or-mark", "0x4000"},
			{"iptables", "-t", "nat", "-N", "KUBE-POSTROUTING"},
			{"iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"},
			{"iptables", "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "mark", "!", "--mark", "0x4000/0x4000", "-j", "RETURN"},
			{"iptables", "-t", "nat", "-A", "KUBE-POSTROUTING", "-j", "MARK", "--xor-mark", "0x4000"},
			{"iptables", "-t", "nat", "-A", "KUBE-POSTROUTING", "-j", "MASQUERADE", "--random-fully"},
		}, k.setup...)
		k.cleanup = append([][]string{{"iptables", "-t", "nat", "-D", "POSTROUTING", "-j", "KUBE-POSTROUTING"}}, k.cleanup...)
	}
	k.setup = append(k.setup, kubeForward...)
	k.cleanup = append(kubeForwardCleanup, k.cleanup...)
	k.through = func(ns *lab.NS, client netip.AddrPort, proto uint8) (found bool, err error) {
		err = ns.Do(func() error {
			flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
			for _, f := range flows {
				src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
				dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
				if f.Forward.Protocol == proto && netip.AddrPortFrom(src, f.Forward.SrcPort) == client && dst == harness.DemoVIP {
					found = true
				}
			}
			return err
		})
		return found, err
	}
	return k
}

// ipvsShape: kube-proxy's IPVS mode (kube-ipvs0, NAT-mode virtual servers,
// net.ipv4.vs.conntrack=1).
func ipvsShape() kubeProxyShape {
	vip := harness.DemoVIP.String()
	k := kubeProxyShape{setup: [][]string{
		{"ip", "link", "add", ipvs.DefaultDevice, "type", "dummy"},
		{"ip", "addr", "add", vip + "/32", "dev", ipvs.DefaultDevice},
		{"ipvsadm", "-A", "-t", vip + ":80", "-s", "rr"},
		{"ipvsadm", "-A", "-u", vip + ":53", "-s", "rr"},
	}, sysctls: map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1"},
		cleanup: append([][]string{{"ipvsadm", "-C"}, {"ip", "link", "del", ipvs.DefaultDevice}}, kubeForwardCleanup...)}
	for i := range harness.DemoPodIPs {
		k.setup = append(k.setup, []string{"ipvsadm", "-a", "-t", vip + ":80", "-r", podAddr(i).String(), "-m"},
			[]string{"ipvsadm", "-a", "-u", vip + ":53", "-r", podAddr(i).String(), "-m"})
	}
	k.setup = append(k.setup, kubeForward...)
	k.through = func(ns *lab.NS, client netip.AddrPort, _ uint8) (found bool, err error) {
		// /proc/net is the main thread's namespace: read this thread's.
		var conns []ipvs.Conn
		err = ns.Do(func() error {
			f, err := os.Open("/proc/thread-self/net/ip_vs_conn")
			if err != nil {
				return err
			}
			defer f.Close()
			conns, err = ipvs.ParseConns(f)
			return err
		})
		for _, c := range conns {
			found = found || c.Client == client
		}
		return found, err
	}
	return k
}

// testMigration runs the switch from shape to xvs, with and without
// adoption.
func testMigration(t *testing.T, shape kubeProxyShape) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		adopt bool
	}{
		{"adopted", nil, true},
		{"without-adoption", []string{"--adopt-connections=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := harness.NewSingleT(t, "m", bin)
			ns := w.Node.NS
			t.Cleanup(func() {
				if t.Failed() && w.Agent != nil {
					// What the programs did with the packets.
					if _, _, body, err := nsGet(ns, "http://127.0.0.1:10249/metrics"); err == nil {
						for _, line := range strings.Split(body, "\n") {
							if strings.HasPrefix(line, "xvs_datapath_packets_total") {
								t.Log(line)
							}
						}
					}
				}
			})
			if err := w.WriteService(harness.DemoPodIPs); err != nil {
				t.Fatal(err)
			}
			// A node has a default route: a Service address is not
			// local there (without one, the programs leave a mid-flow
			// segment to a VIP to the stack, as to the node's own address).
			setup := append([][]string{{"ip", "route", "add", "default", "via", harness.DemoClientIP.String(), "dev", w.Client.NodeIface, "onlink"}}, shape.setup...)
			for _, args := range setup {
				if out, err := lab.Run(ns, args[0], args[1:]...); err != nil {
					t.Fatalf("kube-proxy's state: %v: %v\n%s", args, err, out)
				}
			}
			if err := ns.Do(func() error {
				for k, v := range shape.sysctls {
					if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			flows := startMigrationFlows(t, w, shape.through)
			for _, h := range flows.streams {
				if masqueraded := h.Server.Peer.Addr() != harness.DemoClientIP; masqueraded != shape.masquerade {
					t.Fatalf("stream %s: the backend saw %s (masqueraded %v, want %v)", h.Local, h.Server.Peer, masqueraded, shape.masquerade)
				}
			}
			var ev bytes.Buffer
			if os.Getenv("XVS_DEBUG_CT") != "" {
				// conntrack's events in the node namespace, shown at the end.
				cmd := exec.Command("nsenter", "--net=/run/netns/"+ns.Name, "conntrack", "-E", "-o", "timestamp")
				cmd.Stdout, cmd.Stderr = &ev, &ev
				cmd.Start()
				defer func() { cmd.Process.Kill(); cmd.Wait(); t.Logf("conntrack events:\n%s", ev.String()) }()
			}
			// The switch: xvs serves the Service, kube-proxy's state goes.
			if err := w.StartAgent(tc.args...); err != nil {
				t.Fatal(err)
			}
			if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
				t.Fatal(err)
			}
			for _, args := range shape.cleanup {
				if out, err := lab.Run(ns, args[0], args[1:]...); err != nil {
					t.Fatalf("kube-proxy --cleanup: %v: %v\n%s", args, err, out)
				}
			}
			flows.verdict(t, w, tc.adopt, shape.masquerade)
		})
	}
}

// migrationFlows are the connections open through kube-proxy at the
// switch: three TCP streams (round robin: one per backend when kube-proxy
// balances so) and a UDP client that keeps its port.
type migrationFlows struct {
	streams []*lab.HeldStream
	udp     *lab.UDPSession
	first   lab.UDPReply // the UDP client's first reply: its backend
}

// startMigrationFlows opens them, and checks with through that they went
// through kube-proxy's state (nil: not checked).
func startMigrationFlows(t *testing.T, w *harness.Single, through func(*lab.NS, netip.AddrPort, uint8) (bool, error)) *migrationFlows {
	t.Helper()
	f := &migrationFlows{}
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	for range harness.DemoPodIPs {
		h, err := lab.StartHeldStream(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), tcp, lab.HeldSpec{Rate: 128 << 10, Timeout: 3 * time.Second})
		if err != nil {
			t.Fatalf("a stream through kube-proxy: %v", err)
		}
		t.Cleanup(func() { h.Close() })
		f.streams = append(f.streams, h)
	}
	var err error
	f.udp, err = lab.StartUDPSession(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 40053), netip.AddrPortFrom(harness.DemoVIP, 53), lab.UDPSpec{Size: 512})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.udp.Close() })
	if f.first, err = f.udp.Await(time.Now(), 5*time.Second, podAddr(0), podAddr(1), podAddr(2)); err != nil {
		t.Fatalf("UDP through kube-proxy: %v", err)
	}
	for _, h := range f.streams {
		if through != nil {
			if ok, err := through(w.Node.NS, h.Local, unix.IPPROTO_TCP); err != nil || !ok {
				t.Fatalf("stream %s did not go through kube-proxy's state (%v)", h.Local, err)
			}
		}
		if _, err := h.Check(10 * time.Second); err != nil {
			t.Fatalf("before the switch: %v", err)
		}
	}
	if through != nil {
		if ok, err := through(w.Node.NS, f.udp.Local, unix.IPPROTO_UDP); err != nil || !ok {
			t.Fatalf("the UDP client %s did not go through kube-proxy's state (%v)", f.udp.Local, err)
		}
	}
	return f
}

// verdict checks the flows once kube-proxy's state is gone: with adoption
// every stream carries on with every byte intact, the UDP client keeps its
// backend, a new connection works and the agent says it took all four
// over; without it, streams stall. A masqueraded UDP client is not taken
// over (reconcile.Datapath.Adopt): it only has to be answered again.
func (f *migrationFlows) verdict(t *testing.T, w *harness.Single, adopted, masqueraded bool) {
	t.Helper()
	switched := time.Now()
	time.Sleep(2 * time.Second)
	if !adopted {
		stalled := 0
		for _, h := range f.streams {
			if _, err := h.Check(3 * time.Second); err != nil {
				stalled++
				break
			}
		}
		if stalled == 0 {
			t.Fatal("without adoption every stream carried on: the test cannot tell adoption from its absence")
		}
		return
	}
	for round := range 2 {
		for _, h := range f.streams {
			st, err := h.Check(10 * time.Second)
			if err != nil {
				t.Fatalf("after the switch (round %d): %v", round, err)
			}
			t.Logf("stream %s -> %s: %d bytes intact (sha256 %s...)", h.Local, h.Server.Local, st.Bytes, st.SHA256[:12])
		}
		time.Sleep(time.Second)
	}
	backends := []netip.AddrPort{f.first.Server.Local}
	want := len(f.streams) + 1
	if masqueraded {
		backends, want = []netip.AddrPort{podAddr(0), podAddr(1), podAddr(2)}, len(f.streams)
	}
	if _, err := f.udp.Await(switched, 10*time.Second, backends...); err != nil {
		t.Fatalf("the UDP client after the switch: %v", err)
	}
	if _, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80),
		lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20}); err != nil {
		t.Fatalf("a new connection after the switch: %v", err)
	}
	log, _ := os.ReadFile(w.Agent.Log)
	m := regexp.MustCompile(`Took over the connections.* adopted=(\d+)`).FindSubmatch(log)
	if m == nil || string(m[1]) != strconv.Itoa(want) {
		t.Errorf("agent log: want %d connections adopted:\n%s", want, log)
	}
}

// TestPrivMigrationFromIPTables: from kube-proxy's iptables mode (runs on
// the host), with clients kube-proxy does not masquerade, and with clients
// it masquerades (from outside the cluster CIDR).
func TestPrivMigrationFromIPTables(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, netfilter); run them as root")
	}
	t.Run("plain", func(t *testing.T) { testMigration(t, iptablesShape(false)) })
	t.Run("masqueraded", func(t *testing.T) { testMigration(t, iptablesShape(true)) })
}

// TestPrivIPVSMigration: from kube-proxy's IPVS mode (the VM rig).
func TestPrivIPVSMigration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, IPVS); run them as root")
	}
	if err := ipvs.Available(); err != nil {
		t.Fatalf("ipvs-mode tests need kernel IPVS (run them in the VM: make vmtest): %v", err)
	}
	testMigration(t, ipvsShape())
}

// defaultRoute gives the node namespace a default route, as nodes have
// (see testMigration).
func (w *kubeWorld) defaultRoute(t *testing.T) {
	t.Helper()
	if out, err := lab.Run(w.Node.NS, "ip", "route", "add", "default", "via", harness.DemoClientIP.String(), "dev", w.Client.NodeIface, "onlink"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// switchFromKubeProxy stops the real kube-proxy (its state stays, as when
// its DaemonSet is scheduled away, and still serves the flows), then
// starts xvs and waits until it serves the Service.
func (w *kubeWorld) switchFromKubeProxy(t *testing.T, kp *lab.Process, flows *migrationFlows) {
	t.Helper()
	if err := kp.Stop(5 * time.Second); err != nil {
		t.Fatalf("stopping kube-proxy: %v", err)
	}
	for _, h := range flows.streams {
		if _, err := h.Check(10 * time.Second); err != nil {
			t.Fatalf("with kube-proxy stopped, its state still serves: %v", err)
		}
	}
	w.startKubeAgent(t)
	w.waitBackends(t, harness.DemoVIP, 80, len(harness.DemoPodIPs), 60*time.Second)
}

// TestPrivIPVSKubeProxyMigration: from the real kube-proxy v1.37 in IPVS
// mode (the VM rig, whose kernels have IPVS; the rig hands the guest the
// API server and kube-proxy binaries), as TestPrivKubeProxyMigration does
// from its nftables and iptables modes: connections open through
// kube-proxy's virtual servers; kube-proxy stops (IPVS keeps serving them);
// xvs starts and adopts them from netfilter's conntrack, which kube-proxy's
// net.ipv4.vs.conntrack=1 fills; `kube-proxy --cleanup` removes the
// virtual servers, kube-ipvs0, its ipsets and rules. Every connection
// carries on, on its backend, with every byte.
func TestPrivIPVSKubeProxyMigration(t *testing.T) {
	if err := ipvs.Available(); err != nil {
		t.Fatalf("ipvs-mode tests need kernel IPVS (run them in the VM: make vmtest): %v", err)
	}
	kpBin := kubeProxyBin(t)
	w := newKubeWorld(t)
	ns := w.Node.NS
	w.defaultRoute(t)
	kp := startKubeProxy(t, w, kpBin, "ipvs")
	if out, err := lab.Run(ns, "ipvsadm", "-Ln"); err != nil || !strings.Contains(string(out), harness.DemoVIP.String()+":80") {
		t.Fatalf("kube-proxy's virtual servers (%v):\n%s", err, out)
	}
	flows := startMigrationFlows(t, w.Single, ipvsShape().through)
	w.switchFromKubeProxy(t, kp, flows)
	out, _ := lab.Run(ns, kpBin, "--cleanup")
	if vs, _ := lab.Run(ns, "ipvsadm", "-Ln"); strings.Contains(string(vs), harness.DemoVIP.String()) {
		t.Errorf("kube-proxy --cleanup left its virtual servers: %s\n%s", out, vs)
	}
	if _, err := lab.Run(ns, "ip", "link", "show", ipvs.DefaultDevice); err == nil {
		t.Errorf("kube-proxy --cleanup left %s: %s", ipvs.DefaultDevice, out)
	}
	flows.verdict(t, w.Single, true, false)
}

// TestPrivKubeProxyDrainBack: the way back, from xvs to the real
// kube-proxy v1.37 (nftables), without cutting a connection. xvs serves
// three streams and a UDP client that keeps its port; its agent stops (the
// pinned programs go on); kube-proxy starts; `xvs cleanup --drain` leaves
// every new flow to kube-proxy's rules while xvs's own carry on, with
// every byte; once they end it removes the BPF datapath by itself, well
// before its deadline, and kube-proxy alone serves.
func TestPrivKubeProxyDrainBack(t *testing.T) {
	kpBin := kubeProxyBin(t)
	w := newKubeWorld(t)
	ns := w.Node.NS
	w.defaultRoute(t)
	// Short UDP timeouts: a UDP flow is open until it times out.
	w.startKubeAgent(t, "--conntrack-udp-timeout=3s", "--conntrack-udp-timeout-stream=3s")
	w.waitBackends(t, harness.DemoVIP, 80, len(harness.DemoPodIPs), 60*time.Second)
	xvsFlows := func(client netip.AddrPort) (bool, error) {
		m, err := maps.OpenPinned(w.PinPath)
		if err != nil {
			return false, err
		}
		defer m.Close()
		cs, err := m.Connections(maps.ConnectionFilter{Source: client})
		return len(cs) > 0, err
	}
	flows := startMigrationFlows(t, w.Single, func(_ *lab.NS, client netip.AddrPort, _ uint8) (bool, error) { return xvsFlows(client) })
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatalf("stopping the agent: %v", err)
	}
	startKubeProxy(t, w, kpBin, "nftables")

	drain, err := lab.Start(ns, filepath.Join(t.TempDir(), "drain.log"), w.Bin, "cleanup", "--pin-path", w.PinPath, "--drain", "90s")
	if err != nil {
		t.Fatal(err)
	}
	drainStart := time.Now()
	t.Cleanup(func() { drain.Stop(time.Second) })
	time.Sleep(time.Second)
	for _, h := range flows.streams {
		if _, err := h.Check(10 * time.Second); err != nil {
			t.Fatalf("an xvs stream while draining: %v", err)
		}
	}
	// A new connection is kube-proxy's: netfilter translates it, xvs
	// leaves it.
	tr, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80),
		lab.TransferSpec{Download: 2 << 20, Upload: 256 << 10})
	if err != nil {
		t.Fatalf("a new connection while draining: %v", err)
	}
	if ours, err := xvsFlows(tr.Client); err != nil || ours {
		t.Fatalf("the new connection %s is in xvs's conntrack (%v): drain must leave it to kube-proxy", tr.Client, err)
	}
	if out, err := lab.Run(ns, "conntrack", "-L", "-p", "tcp", "--sport", strconv.Itoa(int(tr.Client.Port())), "--orig-dst", harness.DemoVIP.String()); err != nil || !strings.Contains(string(out), "dport=80") {
		t.Fatalf("the new connection is not in netfilter's conntrack with kube-proxy's DNAT (%v):\n%s", err, out)
	}
	if _, err := os.Stat(w.PinPath); err != nil {
		t.Fatalf("the BPF datapath went while its flows were open: %v", err)
	}
	// xvs's flows end: every byte arrived, then the drain finishes.
	for _, h := range flows.streams {
		st, err := h.Check(10 * time.Second)
		if err != nil {
			t.Fatalf("an xvs stream before its end: %v", err)
		}
		t.Logf("stream %s -> %s: %d bytes intact (sha256 %s...)", h.Local, h.Server.Local, st.Bytes, st.SHA256[:12])
		h.Close()
	}
	if _, err := flows.udp.Await(time.Now(), 5*time.Second, flows.first.Server.Local); err != nil {
		t.Fatalf("the UDP client while draining left its backend: %v", err)
	}
	flows.udp.Close()
	if err := drain.Wait(60 * time.Second); err != nil {
		log, _ := os.ReadFile(drain.Log)
		t.Fatalf("xvs cleanup --drain: %v\n%s", err, log)
	}
	log, _ := os.ReadFile(drain.Log)
	if !strings.Contains(string(log), "Drained") || time.Since(drainStart) > 80*time.Second {
		t.Fatalf("the drain ran out its time instead of ending with the flows (%v):\n%s", time.Since(drainStart), log)
	}
	if _, err := os.Stat(w.PinPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the BPF datapath is still pinned after the drain: %v", err)
	}
	if _, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80),
		lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20}); err != nil {
		t.Fatalf("kube-proxy alone after the drain: %v", err)
	}
}

// TestPrivKubeProxyMigration: from the real kube-proxy v1.37 (make
// kube-proxy), in nftables and in iptables mode, against the tests' API
// server: kube-proxy serves the Service; connections open; kube-proxy
// stops (its rules stay, as when its DaemonSet is scheduled away); xvs
// starts from the same API server; `kube-proxy --cleanup` removes
// kube-proxy's rules. Every connection carries on.
func TestPrivKubeProxyMigration(t *testing.T) {
	kpBin := kubeProxyBin(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			w := newKubeWorld(t)
			ns := w.Node.NS
			w.defaultRoute(t)
			kp := startKubeProxy(t, w, kpBin, mode)
			cleanup := func() {
				out, _ := lab.Run(ns, kpBin, "--cleanup")
				if rules, _ := lab.Run(ns, "nft", "list", "ruleset"); strings.Contains(string(rules), "kube-proxy") || strings.Contains(string(rules), "KUBE-SERVICES") {
					t.Errorf("kube-proxy --cleanup left its rules: %s\n%s", out, rules)
				}
			}
			flows := startMigrationFlows(t, w.Single, iptablesShape(false).through)
			w.switchFromKubeProxy(t, kp, flows)
			cleanup()
			flows.verdict(t, w.Single, true, false)
		})
	}
}
