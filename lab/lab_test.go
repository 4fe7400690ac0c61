package lab

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Every test here needs root and network namespaces. They are named TestPriv*
// and FAIL when the privilege is missing, so CI never silently stops running
// them.

var (
	ap  = netip.MustParseAddrPort
	ip  = netip.MustParseAddr
	pfx = netip.MustParsePrefix
)

// TestMain fails the run if any namespace of this process survived its test.
func TestMain(m *testing.M) {
	code := m.Run()
	left, err := List(fmt.Sprintf("xvs-t%d-", os.Getpid()))
	if err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "leaked namespaces: %v (err %v)\n", left, err)
		Cleanup(fmt.Sprintf("xvs-t%d-", os.Getpid()))
		code = 1
	}
	os.Exit(code)
}

func requirePriv(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("TestPriv* needs root (network namespaces, veths)")
	}
}

func newLab(t *testing.T) *Lab {
	t.Helper()
	requirePriv(t)
	l, err := New(UniquePrefix("t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	return l
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// family holds one address plan; the same checks run for IPv4 and IPv6.
type family struct {
	name                   string
	node, pod1, pod2       netip.Addr
	client, client2, black netip.Addr
	blackhole              netip.Prefix
	any                    netip.Addr
}

var families = []family{
	{"v4", ip("198.51.100.1"), ip("10.0.0.2"), ip("10.0.0.3"),
		ip("203.0.113.2"), ip("203.0.113.3"), ip("10.99.0.1"), pfx("10.99.0.0/16"), ip("0.0.0.0")},
	{"v6", ip("2001:db8:ff::1"), ip("fd00:10::2"), ip("fd00:10::3"),
		ip("2001:db8:c::2"), ip("2001:db8:c::3"), ip("fd00:99::1"), pfx("fd00:99::/32"), ip("::")},
}

// TestPrivRouting builds node + 2 pods + client, dual-stack, and checks plain
// routed traffic (no load balancer) in both families and both protocols.
func TestPrivRouting(t *testing.T) {
	l := newLab(t)
	v4, v6 := families[0], families[1]
	node := must[*Node](t)(l.AddNode("node", v4.node, v6.node))
	pod1 := must[*NS](t)(l.AddPod(node, "pod1", v4.pod1, v6.pod1))
	pod2 := must[*NS](t)(l.AddPod(node, "pod2", v4.pod2, v6.pod2))
	client := must[*NS](t)(l.AddClient(node, "client", v4.client, v4.client2, v6.client, v6.client2))

	if got := strings.Join(node.IfaceNames(RolePod), ","); got != "lxc1,lxc2" {
		t.Errorf("pod ifaces = %s", got)
	}
	if got := node.IfaceNames(RoleExternal); len(got) != 1 || got[0] != client.NodeIface {
		t.Errorf("external ifaces = %v, client on %s", got, client.NodeIface)
	}
	if l.Owner(v6.pod2) != pod2 || l.Owner(v4.node) != node.NS {
		t.Error("Owner does not find address owners")
	}
	checkSysctls(t, node.NS, map[string]string{
		"net/ipv4/ip_forward":                              "1",
		"net/ipv6/conf/all/forwarding":                     "1",
		"net/ipv4/conf/all/rp_filter":                      "0",
		"net/ipv4/conf/lxc1/rp_filter":                     "0",
		"net/ipv4/conf/" + client.NodeIface + "/rp_filter": "0",
	})
	checkSysctls(t, pod1, map[string]string{"net/ipv4/ip_forward": "0", "net/ipv6/conf/eth0/accept_dad": "0"})
	if err := node.AddBlackhole(v4.blackhole); err != nil {
		t.Fatal(err)
	}
	if err := node.AddBlackhole(v6.blackhole); err != nil {
		t.Fatal(err)
	}

	for _, f := range families {
		// pod1 listens on its own IP, pod2 on the wildcard address.
		must[*EchoServer](t)(StartEcho(pod1, netip.AddrPortFrom(f.pod1, 8080)))
		must[*EchoServer](t)(StartEcho(pod2, netip.AddrPortFrom(f.any, 8080)))
		t.Run(f.name, func(t *testing.T) { checkRouting(t, f, node, pod1, client) })
	}
}

// checkSysctls reads sysctls inside ns: it proves the values landed in the
// lab namespace (net sysctls resolve against the reading thread's netns).
func checkSysctls(t *testing.T, ns *NS, want map[string]string) {
	t.Helper()
	ns.Do(func() error {
		for k, v := range want {
			b, err := os.ReadFile("/proc/sys/" + k)
			if got := strings.TrimSpace(string(b)); err != nil || got != v {
				t.Errorf("%s: %s = %q (%v), want %q", ns.Name, k, got, err, v)
			}
		}
		return nil
	})
}

func checkRouting(t *testing.T, f family, node *Node, pod1, client *NS) {
	const wait = 2 * time.Second
	dst1, dst2 := netip.AddrPortFrom(f.pod1, 8080), netip.AddrPortFrom(f.pod2, 8080)
	for _, c := range []struct {
		name    string
		ns      *NS
		src     netip.Addr
		dst     netip.AddrPort
		wantSrc netip.Addr // address the backend must see as peer
	}{
		{"client->pod1", client, f.client, dst1, f.client},
		{"client2->pod2-wildcard", client, f.client2, dst2, f.client2},
		{"node->pod1 uses node IP", node.NS, netip.Addr{}, dst1, f.node},
		{"pod1->pod2 via node", pod1, netip.Addr{}, dst2, f.pod1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, conn, err := DialTCP(c.ns, c.src, c.dst, wait)
			if err != nil {
				t.Fatalf("tcp: %v", err)
			}
			defer conn.Close()
			if r.Local != c.dst || r.Peer.Addr() != c.wantSrc || r.Peer != conn.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort() {
				t.Errorf("tcp greeting %+v, want local %s peer %s (conn %s)", r, c.dst, c.wantSrc, conn.LocalAddr())
			}
			if err := EchoCheck(conn, wait); err != nil {
				t.Error(err)
			}
			u := ProbeUDP(c.ns, c.src, c.dst, wait)
			if u.Verdict != OK || u.Reply.Local != c.dst || u.Reply.Peer.Addr() != c.wantSrc {
				t.Errorf("udp: %v, want local %s peer %s", u, c.dst, c.wantSrc)
			}
		})
	}

	closed := netip.AddrPortFrom(f.pod1, 9)
	if r := ProbeTCP(client, f.client, closed, wait); r.Verdict != Refused {
		t.Errorf("tcp to closed port: %v, want REFUSED (RST)", r)
	}
	if r := ProbeUDP(client, f.client, closed, wait); r.Verdict != Refused {
		t.Errorf("udp to closed port: %v, want REFUSED (ICMP port unreachable)", r)
	}
	// Repeated rejects must stay rejects: ICMP rate limiting is off.
	for i := range 10 {
		if r := ProbeUDP(client, f.client, closed, wait); r.Verdict != Refused {
			t.Fatalf("udp reject #%d: %v", i, r)
		}
	}

	black := netip.AddrPortFrom(f.black, 80)
	if r := ProbeTCP(client, f.client, black, 300*time.Millisecond); r.Verdict != Timeout {
		t.Errorf("tcp into blackhole: %v, want TIMEOUT", r)
	}
	if r := ProbeUDP(client, f.client, black, 300*time.Millisecond); r.Verdict != Timeout {
		t.Errorf("udp into blackhole: %v, want TIMEOUT", r)
	}
}

// TestPrivFabric reaches a pod on a second node across a fabric link.
func TestPrivFabric(t *testing.T) {
	l := newLab(t)
	n1 := must[*Node](t)(l.AddNode("n1", ip("198.51.100.1"), ip("2001:db8:ff::1")))
	n2 := must[*Node](t)(l.AddNode("n2", ip("198.51.100.2"), ip("2001:db8:ff::2")))
	pod := must[*NS](t)(l.AddPod(n2, "pod", ip("10.1.0.2"), ip("fd00:11::2")))
	client := must[*NS](t)(l.AddClient(n1, "client", ip("203.0.113.2"), ip("2001:db8:c::2")))
	fab := must[*Fabric](t)(l.Link(n1, n2))
	if err := fab.Route(n1, pfx("10.1.0.0/24"), pfx("fd00:11::/64")); err != nil {
		t.Fatal(err)
	}
	// n2 sends replies to anything it does not know back across the fabric.
	if err := fab.Route(n2, pfx("0.0.0.0/0"), pfx("::/0")); err != nil {
		t.Fatal(err)
	}
	if got := n1.IfaceNames(RoleFabric); len(got) != 1 || got[0] != fab.AIface {
		t.Errorf("n1 fabric ifaces %v", got)
	}
	for _, c := range []struct{ src, dst, node1, node2 string }{
		{"203.0.113.2", "10.1.0.2:80", "198.51.100.1", "198.51.100.2:80"},
		{"2001:db8:c::2", "[fd00:11::2]:80", "2001:db8:ff::1", "[2001:db8:ff::2]:80"},
	} {
		must[*EchoServer](t)(StartEcho(pod, ap(c.dst)))
		must[*EchoServer](t)(StartEcho(n2.NS, ap(c.node2), TCP))
		if r := ProbeTCP(client, ip(c.src), ap(c.dst), 2*time.Second); r.Verdict != OK || r.Reply.Peer.Addr() != ip(c.src) {
			t.Errorf("client->remote pod tcp: %v", r)
		}
		if r := ProbeUDP(client, ip(c.src), ap(c.dst), 2*time.Second); r.Verdict != OK || r.Reply.Peer.Addr() != ip(c.src) {
			t.Errorf("client->remote pod udp: %v", r)
		}
		// Node to node: n1's own IP is the source it picks towards n2.
		if r := ProbeTCP(n1.NS, netip.Addr{}, ap(c.node2), 2*time.Second); r.Verdict != OK || r.Reply.Peer.Addr() != ip(c.node1) {
			t.Errorf("n1->n2 node IP: %v", r)
		}
	}
}

// TestPrivCleanup simulates a crashed run: Cleanup(prefix) must remove the
// lab's namespaces, and only those.
func TestPrivCleanup(t *testing.T) {
	l := newLab(t)
	other := newLab(t)
	node := must[*Node](t)(l.AddNode("node", ip("198.51.100.1")))
	must[*NS](t)(l.AddPod(node, "pod", ip("10.0.0.2")))
	must[*Node](t)(other.AddNode("node"))
	if got := must[[]string](t)(List(l.Prefix)); len(got) != 2 {
		t.Fatalf("namespaces before cleanup: %v", got)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), l.Prefix+"pod") {
		t.Errorf("ip netns list does not show the lab (%v): %s", err, out)
	}
	if err := Cleanup(l.Prefix); err != nil {
		t.Fatal(err)
	}
	if got := must[[]string](t)(List(l.Prefix)); len(got) != 0 {
		t.Errorf("left after Cleanup: %v", got)
	}
	if got := must[[]string](t)(List(other.Prefix)); len(got) != 1 {
		t.Errorf("Cleanup touched another prefix: %v", got)
	}
	out, _ = exec.Command("ip", "netns", "list").CombinedOutput()
	if strings.Contains(string(out), l.Prefix) {
		t.Errorf("ip netns list still shows %s: %s", l.Prefix, out)
	}
	if err := l.Close(); err != nil { // after Cleanup: must tolerate the gap
		t.Error(err)
	}
	if err := Cleanup(""); err == nil {
		t.Error("Cleanup(\"\") must refuse")
	}
}

// TestPrivErrors checks that misuse is refused without leaving namespaces.
func TestPrivErrors(t *testing.T) {
	l := newLab(t)
	node := must[*Node](t)(l.AddNode("node", ip("198.51.100.1")))
	must[*NS](t)(l.AddPod(node, "pod", ip("10.0.0.2")))
	for name, err := range map[string]error{
		"dup name":    second(l.AddPod(node, "pod", ip("10.0.0.3"))),
		"dup address": second(l.AddClient(node, "client", ip("10.0.0.2"))),
		"no address":  second(l.AddPod(node, "pod2")),
		"bad name":    second(l.AddNode("a/b")),
		"bad prefix":  second(New("")),
		"self link":   second(l.Link(node, node)),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if got := must[[]string](t)(List(l.Prefix)); len(got) != 2 {
		t.Errorf("namespaces after refused calls: %v", got)
	}
}

func second[T any](_ T, err error) error { return err }
