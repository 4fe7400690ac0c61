package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// The node's firewall and a NetworkPolicy engine's rules against Service
// traffic. The rules are shaped like Calico's iptables dataplane: a
// cali-FORWARD chain jumped to from FORWARD, a from-workload chain per pod
// interface (-i: the pod's egress policy) and a to-workload chain (-o: its
// ingress policy), dropping by pod and client address after conntrack's
// ESTABLISHED accept; and kube-proxy's own "drop ctstate INVALID" at the
// top of FORWARD, which drops replies when netfilter's conntrack and the
// datapath disagree on a flow. Each policy denies TCP to the pod's port
// and leaves UDP alone, so one address shows both outcomes.

// calicoRules installs the rules on node A of w and returns a reader of the
// INVALID drop counter.
func calicoRules(t *testing.T, w *harness.Multi) func() string {
	t.Helper()
	podIf := w.PodA.NodeIface
	ipt := func(args ...string) {
		t.Helper()
		if out, err := lab.Run(w.A.NS, "iptables", args...); err != nil {
			t.Fatalf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ipt("-N", "KUBE-FORWARD")
	ipt("-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	ipt("-A", "FORWARD", "-j", "KUBE-FORWARD")
	ipt("-N", "cali-FORWARD")
	ipt("-A", "FORWARD", "-j", "cali-FORWARD")
	fw, tw := "cali-fw-"+podIf, "cali-tw-"+podIf
	for _, c := range []string{fw, tw} {
		ipt("-N", c)
		ipt("-A", c, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	}
	ipt("-A", "cali-FORWARD", "-i", podIf, "-j", fw)
	ipt("-A", "cali-FORWARD", "-o", podIf, "-j", tw)
	// Pod A's egress policy: no TCP to pod B.
	ipt("-A", fw, "-d", harness.MultiPodB.String(), "-p", "tcp", "--dport", "8080", "-j", "DROP")
	// Pod A's ingress policy: no TCP from the client.
	ipt("-A", tw, "-s", harness.MultiClient.String(), "-p", "tcp", "--dport", "8080", "-j", "DROP")
	// The node's host firewall: the client may not reach pod B over TCP
	// (through node A, whatever the Service).
	ipt("-A", "cali-FORWARD", "-s", harness.MultiClient.String(), "-d", harness.MultiPodB.String(), "-p", "tcp", "-j", "DROP")
	return func() string {
		out, err := lab.Run(w.A.NS, "iptables", "-L", "KUBE-FORWARD", "-v", "-n", "-x")
		if err != nil {
			return fmt.Sprintf("iptables -L: %v: %s", err, out)
		}
		return string(out)
	}
}

func firewallCases(w *harness.Multi) []clientCase {
	return []clientCase{
		{"pod egress policy, ClusterIP", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.30:80")},
		{"pod ingress policy, NodePort eTP=Local", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30081)},
		{"pod ingress policy, LoadBalancer IP", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiLBIP, 80)},
		{"pod ingress policy, ExternalIP", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiExtIP, 80)},
		{"host firewall, masqueraded NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080)},
	}
}

// TestPrivFirewallNetfilterMode: in the default mode (--netfilter-mode=pass)
// the policies deny TCP through every Service address as they deny it to
// the pod's own address, UDP still flows, allowed clients move real data,
// and no reply is dropped as INVALID.
func TestPrivFirewallNetfilterMode(t *testing.T) {
	var invalid func() string
	w := newMultiNodeWorldArgs(t, nil, func(w *harness.Multi) error { invalid = calicoRules(t, w); return nil })
	logVerdicts(t, w)
	for _, c := range firewallCases(w) {
		t.Run(c.name, func(t *testing.T) {
			if r := lab.ProbeTCP(c.ns, c.src, c.dst, time.Second); r.Verdict != lab.Timeout {
				t.Fatalf("TCP %s -> %s: %v, want the policy's drop (a timeout)", c.src, c.dst, r)
			}
			if r := lab.ProbeUDP(c.ns, c.src, c.dst, 2*time.Second); r.Verdict != lab.OK {
				t.Fatalf("UDP %s -> %s: %v, want an answer (the policy denies TCP only)", c.src, c.dst, r)
			}
		})
	}
	// The pod's own address is denied the same way: the Service adds no
	// way around the policy.
	if r := lab.ProbeTCP(w.PodA, harness.MultiPodA, netip.AddrPortFrom(harness.MultiPodB, 8080), time.Second); r.Verdict != lab.Timeout {
		t.Fatalf("TCP pod A -> pod B directly: %v, want a timeout", r)
	}
	// Allowed: the outsider, through the eTP=Local NodePort to pod A
	// (its address kept) and through the masqueraded NodePort to pod B
	// (netfilter's MASQUERADE: pod B sees node A's fabric address); real
	// transfers both ways, and a half-closed stream.
	for _, c := range []struct {
		dst        netip.AddrPort
		serve, see netip.Addr
	}{
		{netip.AddrPortFrom(harness.MultiNodeA, 30081), harness.MultiPodA, harness.MultiOutsider},
		{netip.AddrPortFrom(harness.MultiNodeA, 30080), harness.MultiPodB, harness.MultiNodeA},
	} {
		for _, spec := range []lab.TransferSpec{
			{Download: 8 * mib, Upload: 4 * mib},
			{HalfClose: lab.HalfCloseClient, Stream: 2 * time.Second, Interval: 200 * time.Millisecond, ChunkSize: 32 << 10},
		} {
			r := transfer(t, w.Outsider, harness.MultiOutsider, c.dst, spec)
			if r.Server.Local != netip.AddrPortFrom(c.serve, 8080) || r.Server.Peer.Addr() != c.see {
				t.Fatalf("%s %+v: served by %s seeing %s, want %s seeing %s", c.dst, spec, r.Server.Local, r.Server.Peer, c.serve, c.see)
			}
		}
	}
	out := invalid()
	if !strings.Contains(out, "DROP") {
		t.Fatalf("no INVALID rule:\n%s", out)
	}
	if n := firstCounter(out); n != "0" {
		t.Fatalf("netfilter dropped %s packets as INVALID (replies its conntrack did not expect):\n%s", n, out)
	}
}

// firstCounter is the packet count of the first rule in `iptables -L -v -x`
// output.
func firstCounter(out string) string {
	lines := strings.Split(out, "\n")
	if len(lines) < 3 {
		return "?"
	}
	f := strings.Fields(lines[2])
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// TestPrivFirewallBypassMode: with --netfilter-mode=bypass the programs
// forward Service traffic past FORWARD, so the same policies do not see it
// (what docs/nodes.md says the mode skips); the pod's own address stays
// denied, as that traffic is not a Service's.
func TestPrivFirewallBypassMode(t *testing.T) {
	w := newMultiNodeWorldArgs(t, []string{"--netfilter-mode=bypass"}, func(w *harness.Multi) error { calicoRules(t, w); return nil })
	logVerdicts(t, w)
	for _, c := range firewallCases(w) {
		t.Run(c.name, func(t *testing.T) {
			if r := lab.ProbeTCP(c.ns, c.src, c.dst, 2*time.Second); r.Verdict != lab.OK {
				t.Fatalf("TCP %s -> %s: %v, want an answer: bypass mode skips FORWARD", c.src, c.dst, r)
			}
		})
	}
	if r := lab.ProbeTCP(w.PodA, harness.MultiPodA, netip.AddrPortFrom(harness.MultiPodB, 8080), time.Second); r.Verdict != lab.Timeout {
		t.Fatalf("TCP pod A -> pod B directly: %v, want a timeout", r)
	}
}
