package main

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
)

// newMultiNodeWorld builds the two-node lab, runs setup (changes to the
// nodes the agents must find at start), then starts both agents.
func newMultiNodeWorld(t *testing.T, setup ...func(*harness.Multi) error) *harness.Multi {
	t.Helper()
	return newMultiNodeWorldArgs(t, nil, setup...)
}

// newMultiNodeWorldArgs is newMultiNodeWorld with extra agent arguments
// (both nodes).
func newMultiNodeWorldArgs(t *testing.T, agentArgs []string, setup ...func(*harness.Multi) error) *harness.Multi {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("multi-node lab tests need root (network namespaces, BPF); run them as root")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w, err := harness.NewMulti("mn", bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range w.Agents {
				if log, err := os.ReadFile(p.Log); err == nil {
					t.Logf("agent %s log:\n%s", name, log)
				}
			}
		}
		w.Close()
	})
	for _, f := range setup {
		if err := f(w); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.StartAgents(agentArgs...); err != nil {
		t.Fatal(err)
	}
	return w
}

type probeFunc func(ns *lab.NS, src netip.Addr, dst netip.AddrPort, timeout time.Duration) lab.Result

var protos = map[string]probeFunc{"TCP": lab.ProbeTCP, "UDP": lab.ProbeUDP}

// expectReach checks that every try lands on one of backends and that the
// backend saw peer as the source; it returns the backends reached.
func expectReach(t *testing.T, probe probeFunc, ns *lab.NS, src netip.Addr, dst netip.AddrPort, peer netip.Addr, tries int, backends ...netip.AddrPort) map[netip.AddrPort]int {
	t.Helper()
	got := map[netip.AddrPort]int{}
	for i := range tries {
		r := probe(ns, src, dst, 2*time.Second)
		if r.Verdict != lab.OK {
			t.Fatalf("%s -> %s try %d: %v", src, dst, i, r)
		}
		ok := false
		for _, b := range backends {
			ok = ok || r.Reply.Local == b
		}
		if !ok {
			t.Fatalf("%s -> %s reached %s, want one of %v", src, dst, r.Reply.Local, backends)
		}
		if peer.IsValid() && r.Reply.Peer.Addr() != peer {
			t.Fatalf("%s -> %s: backend %s saw %s as the source, want %s", src, dst, r.Reply.Local, r.Reply.Peer, peer)
		}
		got[r.Reply.Local]++
	}
	return got
}

func expectVerdict(t *testing.T, probe probeFunc, ns *lab.NS, src netip.Addr, dst netip.AddrPort, want lab.Verdict) {
	t.Helper()
	start := time.Now()
	r := probe(ns, src, dst, time.Second)
	if r.Verdict != want {
		t.Fatalf("%s -> %s: %v, want %v", src, dst, r, want)
	}
	if want == lab.Refused && time.Since(start) > 500*time.Millisecond {
		t.Fatalf("%s -> %s: refused only after %v", src, dst, time.Since(start))
	}
}

// TestPrivMultiNodeNorthSouth: every Service address kube-proxy serves,
// with real TCP and UDP through two nodes, each running its own agent.
func TestPrivMultiNodeNorthSouth(t *testing.T) {
	w := newMultiNodeWorld(t)
	podA := netip.AddrPortFrom(harness.MultiPodA, 8080)
	podB := netip.AddrPortFrom(harness.MultiPodB, 8080)
	ap := func(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

	for name, probe := range protos {
		t.Run(name, func(t *testing.T) {
			// NodePort, eTP=Cluster, backend on the other node: the
			// backend sees node A (masquerade), the client the NodePort.
			expectReach(t, probe, w.Client, harness.MultiClient, ap(harness.MultiNodeA, 30080), harness.MultiNodeA, 8, podB)
			// eTP=Local: the local endpoint only, with the client's own
			// address, on the NodePort, the ExternalIP and the LB IP.
			for _, dst := range []netip.AddrPort{ap(harness.MultiNodeA, 30081), ap(harness.MultiExtIP, 80), ap(harness.MultiLBIP, 80)} {
				expectReach(t, probe, w.Client, harness.MultiClient, dst, harness.MultiClient, 8, podA)
			}
			// loadBalancerSourceRanges: outside them, no answer from the
			// LB IP; the NodePort of the same Service ignores them.
			expectVerdict(t, probe, w.Outsider, harness.MultiOutsider, ap(harness.MultiLBIP, 80), lab.Timeout)
			expectReach(t, probe, w.Outsider, harness.MultiOutsider, ap(harness.MultiNodeA, 30081), harness.MultiOutsider, 4, podA)
			// No endpoints at all: refused, promptly.
			expectVerdict(t, probe, w.Client, harness.MultiClient, ap(harness.MultiNodeA, 30082), lab.Refused)
			expectVerdict(t, probe, w.PodA, harness.MultiPodA, ap(netip.MustParseAddr("172.30.0.32"), 80), lab.Refused)
			// Pod to ClusterIP, remote backend: the pod's own address.
			expectReach(t, probe, w.PodA, harness.MultiPodA, ap(netip.MustParseAddr("172.30.0.30"), 80), harness.MultiPodA, 4, podB)
			// Pod to an eTP=Local NodePort: short-circuited to every
			// endpoint, unmasqueraded (except when it lands on itself).
			got := expectReach(t, probe, w.PodB, harness.MultiPodB, ap(harness.MultiNodeB, 30081), netip.Addr{}, 24, podA, podB)
			if got[podA] == 0 || got[podB] == 0 {
				t.Fatalf("pod to eTP=Local NodePort reached %v, want both endpoints", got)
			}
			// Wrong port on a live ClusterIP: refused; an unallocated
			// service address: dropped.
			expectVerdict(t, probe, w.PodA, harness.MultiPodA, ap(netip.MustParseAddr("172.30.0.30"), 81), lab.Refused)
			expectVerdict(t, probe, w.PodA, harness.MultiPodA, ap(netip.MustParseAddr("172.30.5.5"), 80), lab.Timeout)
		})
	}

	// The node itself (socket-level balancing): host processes reach
	// ClusterIPs and NodePorts from the node's address; eTP=Local
	// short-circuits them to every endpoint; the LB IP's source ranges
	// do not hold the node, so it gets no answer; localhost NodePorts
	// are not served (nftables parity).
	for name, probe := range protos {
		t.Run("host-"+name, func(t *testing.T) {
			expectReach(t, probe, w.A.NS, harness.MultiNodeA, ap(netip.MustParseAddr("172.30.0.30"), 80), harness.MultiNodeA, 6, podB)
			expectReach(t, probe, w.A.NS, harness.MultiNodeA, ap(harness.MultiNodeA, 30080), harness.MultiNodeA, 6, podB)
			got := expectReach(t, probe, w.A.NS, harness.MultiNodeA, ap(harness.MultiNodeA, 30081), harness.MultiNodeA, 24, podA, podB)
			if got[podA] == 0 || got[podB] == 0 {
				t.Fatalf("host to eTP=Local NodePort reached %v, want both endpoints", got)
			}
			expectVerdict(t, probe, w.A.NS, harness.MultiNodeA, ap(harness.MultiLBIP, 80), lab.Timeout)
			expectVerdict(t, probe, w.A.NS, harness.MultiNodeA, ap(harness.MultiNodeA, 30082), lab.Refused)
			if r := probe(w.A.NS, netip.MustParseAddr("127.0.0.1"), ap(netip.MustParseAddr("127.0.0.1"), 30080), time.Second); r.Verdict == lab.OK {
				t.Fatalf("localhost NodePort answered: %v", r)
			}
		})
	}

	// Hairpin: pod A through a ClusterIP back to itself is masqueraded
	// to node A; to pod B it keeps its address.
	hair := 0
	for i := 0; i < 40 && hair < 2; i++ {
		r := lab.ProbeTCP(w.PodA, harness.MultiPodA, ap(netip.MustParseAddr("172.30.0.31"), 80), 2*time.Second)
		if r.Verdict != lab.OK {
			t.Fatal(r)
		}
		switch r.Reply.Local {
		case podA:
			hair++
			if r.Reply.Peer.Addr() != harness.MultiNodeA {
				t.Fatalf("hairpin: the pod saw itself as %s, want node A", r.Reply.Peer)
			}
		case podB:
			if r.Reply.Peer.Addr() != harness.MultiPodA {
				t.Fatalf("pod to ClusterIP, remote backend saw %s", r.Reply.Peer)
			}
		}
	}
	if hair == 0 {
		t.Fatal("40 connections never landed on the client pod itself")
	}

	// The client's packets came in on node A's external interface, where
	// the XDP program translated them.
	m, err := maps.OpenPinned(w.Pins["node-a"])
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Read(true)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := loader.XDPSupported(); errors.Is(err, loader.ErrXDPUnsupported) {
		// tc served node A's external interfaces alone.
		t.Logf("SKIP (kernel) the XDP fast path check: %v", err)
	} else if n := snap.Verdicts["forward_after_xdp"].PacketsIn; n == 0 {
		t.Fatalf("no packet went through the XDP fast path: %v", snap.Verdicts)
	}
	if n := snap.Verdicts["host_socket_balanced"].PacketsIn; n == 0 {
		t.Fatalf("no host socket went through the socket-level balancer: %v", snap.Verdicts)
	}
	t.Logf("node A verdicts: xdp-translated %d, source-range drops %d, no-endpoint rejects %d",
		snap.Verdicts["forward_after_xdp"].PacketsIn, snap.Verdicts["drop_source_range"].PacketsIn, snap.Verdicts["reject_no_endpoints"].PacketsIn)

	// ebpf mode adds no iptables rule and no nftables table but its
	// netfilter mode's masquerade table, one per family.
	for _, node := range []*lab.Node{w.A, w.B} {
		for _, cmd := range [][]string{{"iptables-save"}, {"nft", "list", "tables"}} {
			out, err := exec.Command("nsenter", append([]string{"--net=" + node.NS.Path(), "--"}, cmd...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s in %s: %v: %s", cmd, node.Name, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				line = strings.TrimSpace(line)
				if line == "table ip "+loader.NetfilterTable || line == "table ip6 "+loader.NetfilterTable {
					continue
				}
				if strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "table ") {
					t.Fatalf("%s in %s shows a rule: %q", cmd, node.Name, line)
				}
			}
		}
	}
}

// TestPrivMultiNodePolicies: internalTrafficPolicy Local, topology hints
// and the terminating fallback, seen from a pod on each node.
func TestPrivMultiNodePolicies(t *testing.T) {
	w := newMultiNodeWorld(t)
	podA := netip.AddrPortFrom(harness.MultiPodA, 8080)
	podB := netip.AddrPortFrom(harness.MultiPodB, 8080)
	svc := func(last byte) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 30, 0, last}), 80)
	}
	type client struct {
		ns   *lab.NS
		ip   netip.Addr
		self netip.AddrPort
	}
	a, b := client{w.PodA, harness.MultiPodA, podA}, client{w.PodB, harness.MultiPodB, podB}
	for name, probe := range protos {
		t.Run(name, func(t *testing.T) {
			for _, c := range []client{a, b} {
				// iTP=Local and both hint kinds: only the client's own
				// node (zone-a is node A, zone-b node B).
				for _, s := range []netip.AddrPort{svc(33), svc(34), svc(35)} {
					expectReach(t, probe, c.ns, c.ip, s, netip.Addr{}, 8, c.self)
				}
				// A ready endpoint without hints disables filtering.
				got := expectReach(t, probe, c.ns, c.ip, svc(36), netip.Addr{}, 24, podA, podB)
				if got[podA] == 0 || got[podB] == 0 {
					t.Fatalf("half-hinted Service reached %v from %s, want both", got, c.ip)
				}
				// No ready endpoint: the serving terminating one, wherever
				// it is; none serving: REJECT.
				expectReach(t, probe, c.ns, c.ip, svc(37), netip.Addr{}, 6, podB)
				expectVerdict(t, probe, c.ns, c.ip, svc(38), lab.Refused)
			}
			// iTP=Local whose only endpoint is on the other node: DROP on
			// node A, served on node B.
			expectVerdict(t, probe, a.ns, a.ip, svc(39), lab.Timeout)
			// (pod B reaching itself: hairpin, masqueraded to node B)
			expectReach(t, probe, b.ns, b.ip, svc(39), harness.MultiNodeB, 4, podB)
		})
	}
}
