package conformance

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// TestPrivRejectICMPUnreachable: a node that answers a pod's SYN with an
// ICMP port unreachable (nftables `reject`, as ipvs mode does for a wrong
// port, and as IPVS does for a Service without real servers) is a REJECT
// for the runner's TCP probe, in both families, at every try.
//
// The node answers within the softirq that carries the pod's SYN, while
// connect() still holds the socket. Linux then keeps the error as a soft
// error; for IPv4 it still wakes the connect (tcp_v4_err queues it on the
// error queue), for IPv6 only with IPV6_RECVERR (ipv6_icmp_error). Without
// that option every IPv6 try waited for the SYN retransmit at 1 s and was
// judged DROP: the ipvs-mode IPv6 REJECT failures.
func TestPrivRejectICMPUnreachable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces, nftables); run as root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("needs nft:", err)
	}
	l, err := lab.New(lab.UniquePrefix("rj"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	node4, node6 := netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("2001:db8:1::2")
	pod4, pod6 := netip.MustParseAddr("10.0.1.100"), netip.MustParseAddr("fd00:10:1::100")
	node, err := l.AddNode("node", node4, node6)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := l.AddPod(node, "p1", pod4, pod6)
	if err != nil {
		t.Fatal(err)
	}
	// The node's filter input rejects port 81 with the family's default,
	// ICMP (v6) port unreachable, as ipvs mode's filter_input does.
	rules := "table inet xvs-rj-test {\n\tchain in {\n\t\ttype filter hook input priority filter; policy accept;\n" +
		"\t\ttcp dport 81 counter reject\n\t}\n}\n"
	cmd := exec.Command("nsenter", "--net="+node.NS.Path(), "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	for _, c := range []struct{ src, dst netip.Addr }{{pod4, node4}, {pod6, node6}} {
		to := netip.AddrPortFrom(c.dst, 81)
		// The family's first SYN also resolves the node's address (ND for
		// IPv6): a CI run saw that one try, and only it, answered after the
		// retransmit. The verdict counts for it; the time limit, which is
		// about how the connect is woken, counts for the tries after it.
		if r := lab.ProbeTCP(pod, c.src, to, DefaultTimeout); r.Verdict != lab.Refused {
			t.Fatalf("first try %s -> %s: %s, want REJECT (refused)", c.src, to, r)
		}
		for i := range 8 {
			start := time.Now()
			r := lab.ProbeTCP(pod, c.src, to, DefaultTimeout)
			if r.Verdict != lab.Refused {
				t.Fatalf("try %d %s -> %s: %s after %v, want REJECT (refused)", i+1, c.src, to, r, time.Since(start).Round(time.Millisecond))
			}
			if d := time.Since(start); d > DefaultTimeout/2 {
				t.Errorf("try %d %s -> %s: refused only after %v (the SYN retransmit?)", i+1, c.src, to, d.Round(time.Millisecond))
			}
		}
	}
	// A held connection still sees the other end's data after connecting:
	// IPV6_RECVERR is cleared once connected.
	srv := netip.AddrPortFrom(node6, 8080)
	if _, err := lab.StartEcho(node.NS, srv, lab.TCP); err != nil {
		t.Fatal(err)
	}
	_, conn, err := lab.DialTCP(pod, pod6, srv, DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := lab.EchoCheck(conn, DefaultTimeout); err != nil {
		t.Fatal(err)
	}
}
