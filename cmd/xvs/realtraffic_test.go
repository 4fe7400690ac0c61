package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/maps"
)

// Real application traffic through the two-node lab: bulk transfers both
// ways through a masqueraded NodePort and a ClusterIP, a half-closed
// stream longer than any closing timeout, a UDP client that keeps its
// port across an endpoint change, and endpoints on a node's own address
// (hostNetwork pods). Every byte is checked (the bulk protocol's
// keystreams and digests), not only that a SYN was answered.

const mib = 1 << 20

// agentVerdicts reads the nonzero verdict counters (packets) of the
// agent whose maps are pinned at pin.
func agentVerdicts(pin string) (map[string]uint64, error) {
	m, err := maps.OpenPinned(pin)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	snap, err := m.Read(true)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for v, st := range snap.Verdicts {
		if st.PacketsIn > 0 {
			out[v] = st.PacketsIn
		}
	}
	return out, nil
}

// logVerdicts logs the agents' nonzero verdict counters when t fails.
func logVerdicts(t *testing.T, w *harness.Multi) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for name, pin := range w.Pins {
			vs, err := agentVerdicts(pin)
			if err != nil {
				t.Logf("%s: %v", name, err)
			}
			for v, n := range vs {
				t.Logf("%s: verdict %s: %d packets", name, v, n)
			}
		}
	})
}

// clientCase is one client reaching one Service address.
type clientCase struct {
	name string
	ns   *lab.NS
	src  netip.Addr
	dst  netip.AddrPort
}

// inBothModes runs a test once per netfilter mode, with the agents'
// --netfilter-mode argument.
func inBothModes(t *testing.T, test func(t *testing.T, agentArgs []string)) {
	for _, mode := range []string{"pass", "bypass"} {
		t.Run(mode, func(t *testing.T) { test(t, []string{"--netfilter-mode=" + mode}) })
	}
}

func transfer(t *testing.T, ns *lab.NS, src netip.Addr, dst netip.AddrPort, spec lab.TransferSpec) lab.TransferResult {
	t.Helper()
	r, err := lab.Transfer(ns, netip.AddrPortFrom(src, 0), dst, spec)
	if err != nil {
		t.Fatalf("%s -> %s %+v: %v", src, dst, spec, err)
	}
	return r
}

// TestPrivRealTrafficBulk: 20 MiB down and 10 MiB up at once, from an
// external client through a NodePort whose only endpoint is on the other
// node (eTP=Cluster: masqueraded, GSO/GRO-sized packets both ways), and
// from a pod through a ClusterIP to the remote pod.
func TestPrivRealTrafficBulk(t *testing.T) { inBothModes(t, testRealTrafficBulk) }

func testRealTrafficBulk(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args)
	podB := netip.AddrPortFrom(harness.MultiPodB, 8080)
	for _, c := range []struct {
		name string
		ns   *lab.NS
		src  netip.Addr
		dst  netip.AddrPort
		peer netip.Addr // the source the backend must see
	}{
		{"external client, masqueraded NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080), harness.MultiNodeA},
		{"pod, ClusterIP, remote endpoint", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.30:80"), harness.MultiPodA},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, spec := range []lab.TransferSpec{
				{Download: 20 * mib},
				{Upload: 10 * mib},
				{Download: 20 * mib, Upload: 10 * mib},
				{Download: 1, Upload: 1},
			} {
				r := transfer(t, c.ns, c.src, c.dst, spec)
				if r.Server.Local != podB || r.Server.Peer.Addr() != c.peer {
					t.Fatalf("%+v: served by %s seeing %s, want %s seeing %s", spec, r.Server.Local, r.Server.Peer, podB, c.peer)
				}
				t.Logf("%+v: %v", spec, r.Duration)
			}
		})
	}
}

// TestPrivRealTrafficHalfClose: a client that shuts its write side while
// the server streams on for 14 s (past the 10 s the datapath once gave a
// closing flow) gets every chunk, through the NodePort and the ClusterIP;
// and a server that half-closes keeps receiving.
func TestPrivRealTrafficHalfClose(t *testing.T) { inBothModes(t, testRealTrafficHalfClose) }

func testRealTrafficHalfClose(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args)
	for _, c := range []clientCase{
		{"NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080)},
		{"ClusterIP", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.30:80")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, half := range []lab.HalfClose{lab.HalfCloseClient, lab.HalfCloseServer} {
				t.Run(half.String(), func(t *testing.T) {
					t.Parallel()
					r := transfer(t, c.ns, c.src, c.dst, lab.TransferSpec{HalfClose: half, Stream: 14 * time.Second, Interval: time.Second, ChunkSize: 64 << 10})
					if r.Chunks < 14 {
						t.Fatalf("%v half-close: %d chunks arrived, want 14", half, r.Chunks)
					}
				})
			}
		})
	}
}

// replaceManifest rewrites the lab's manifests in place (the file source
// picks the change up), failing when old is not there.
func replaceManifest(t *testing.T, w *harness.Multi, old, new string) {
	t.Helper()
	path := filepath.Join(w.Dir, "lab.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("manifest has no %q", old)
	}
	if err := os.WriteFile(path+".tmp", []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestPrivRealTrafficUDPEndpointChange: a UDP client that keeps its
// source port (a DNS resolver, RTP, QUIC) moves to the new endpoint within
// a sync of the EndpointSlice update, through the NodePort (masqueraded)
// and the ClusterIP, with 1400-byte datagrams flowing all along; as
// kube-proxy's conntrack reconciler does it.
func TestPrivRealTrafficUDPEndpointChange(t *testing.T) {
	inBothModes(t, testRealTrafficUDPEndpointChange)
}

func testRealTrafficUDPEndpointChange(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args)
	podA, podB := netip.AddrPortFrom(harness.MultiPodA, 8080), netip.AddrPortFrom(harness.MultiPodB, 8080)
	sessions := []*lab.UDPSession{}
	for _, c := range []struct {
		ns  *lab.NS
		src netip.AddrPort
		dst netip.AddrPort
	}{
		{w.Client, netip.AddrPortFrom(harness.MultiClient, 5353), netip.AddrPortFrom(harness.MultiNodeA, 30080)},
		{w.PodA, netip.AddrPortFrom(harness.MultiPodA, 5353), netip.MustParseAddrPort("172.30.0.30:80")},
	} {
		s, err := lab.StartUDPSession(c.ns, c.src, c.dst, lab.UDPSpec{Size: 1400, Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sessions = append(sessions, s)
	}
	start := time.Now()
	for _, s := range sessions {
		if _, err := s.Await(start, 5*time.Second, podB); err != nil {
			t.Fatalf("before the change: %v", err)
		}
	}
	changed := time.Now()
	replaceManifest(t, w, "- {addresses: [10.244.1.11], nodeName: node-b}\nports:\n- {name: tcp, port: 8080, protocol: TCP}\n- {name: udp, port: 8080, protocol: UDP}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: local,",
		"- {addresses: [10.244.0.11], nodeName: node-a}\nports:\n- {name: tcp, port: 8080, protocol: TCP}\n- {name: udp, port: 8080, protocol: UDP}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: local,")
	// The file source rescans every second and the agent syncs at once:
	// 3 s covers a sync on both nodes with room to spare.
	for _, s := range sessions {
		r, err := s.Await(changed, 3*time.Second, podA)
		if err != nil {
			t.Fatalf("after the EndpointSlice moved to %s: %v", podA, err)
		}
		t.Logf("%s: on the new endpoint %v after the change", s.Local, r.Received.Sub(changed))
	}
	// Node A deleted the two stale flows (and says so as kube-proxy does).
	if m := agentMetrics(t, w.A.NS); !strings.Contains(m, `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 2`) {
		t.Fatalf("node A's /metrics has no conntrack_reconciler_deleted_entries_total of 2:\n%s", grepLines(m, "conntrack_reconciler"))
	}
}

// agentMetrics fetches the agent's /metrics on kube-proxy's default
// address inside ns.
func agentMetrics(t *testing.T, ns *lab.NS) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	resp, err := client.Get("http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// hostNetManifests: a Service whose endpoint is node A's own address (a
// hostNetwork pod there, like the API server behind kubernetes.default),
// reached by ClusterIP and NodePort (eTP=Cluster).
const hostNetManifests = `apiVersion: v1
kind: Service
metadata: {name: hostnet, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.40
  clusterIPs: [172.30.0.40]
  ports:
  - {name: tcp, port: 443, targetPort: 8443, nodePort: 30443, protocol: TCP}
  - {name: udp, port: 443, targetPort: 8443, nodePort: 30443, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hostnet-1, namespace: lab, labels: {kubernetes.io/service-name: hostnet}}
addressType: IPv4
endpoints:
- {addresses: [192.168.60.2], nodeName: node-a}
ports:
- {name: tcp, port: 8443, protocol: TCP}
- {name: udp, port: 8443, protocol: UDP}
`

// TestPrivRealTrafficHostNetworkEndpoint: pods on the same node and on the
// other node, and an external client through the NodePort, reach a server
// listening on node A's own address, with replies from the frontend; the
// local paths are not masqueraded (kube-proxy never masquerades what is
// delivered locally).
func TestPrivRealTrafficHostNetworkEndpoint(t *testing.T) {
	inBothModes(t, testRealTrafficHostNetworkEndpoint)
}

func testRealTrafficHostNetworkEndpoint(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args)
	host := netip.AddrPortFrom(harness.MultiNodeA, 8443)
	if _, err := lab.StartBulk(w.A.NS, host); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.Dir, "hostnet.yaml"), []byte(hostNetManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddrPort("172.30.0.40:443")
	// Wait for both agents to program it.
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range []struct {
		ns  *lab.NS
		src netip.Addr
	}{{w.PodA, harness.MultiPodA}, {w.PodB, harness.MultiPodB}} {
		for lab.ProbeTCP(c.ns, c.src, vip, time.Second).Verdict != lab.OK {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the hostNetwork Service was never reachable", c.src)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, c := range []struct {
		name string
		ns   *lab.NS
		src  netip.Addr
		dst  netip.AddrPort
		peer netip.Addr
	}{
		{"pod on the node, ClusterIP", w.PodA, harness.MultiPodA, vip, harness.MultiPodA},
		{"pod on the other node, ClusterIP", w.PodB, harness.MultiPodB, vip, harness.MultiPodB},
		{"external client, NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30443), harness.MultiClient},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, spec := range []lab.TransferSpec{{Download: 20 * mib, Upload: 5 * mib}, {Download: 1}} {
				r := transfer(t, c.ns, c.src, c.dst, spec)
				if r.Server.Local != host || r.Server.Peer.Addr() != c.peer {
					t.Fatalf("served by %s seeing %s, want %s seeing %s", r.Server.Local, r.Server.Peer, host, c.peer)
				}
			}
			r, err := lab.UDPExchange(c.ns, netip.AddrPortFrom(c.src, 0), c.dst, 1200, 2*time.Second)
			if err != nil {
				t.Fatalf("UDP: %v", err)
			}
			if r.Server.Local != host {
				t.Fatalf("UDP served by %s, want %s", r.Server.Local, host)
			}
		})
	}
}

// TestPrivRealTrafficMultiHomed: node A's primary address (its Node's
// InternalIP, where the NodePort is) is not routable from node B; only
// the address of A's fabric interface is, as on a node with a public NIC
// for clients and a private one to the other nodes. Masquerade must use
// the egress interface's address, as MASQUERADE does, or node B's pod
// cannot answer.
func TestPrivRealTrafficMultiHomed(t *testing.T) { inBothModes(t, testRealTrafficMultiHomed) }

func testRealTrafficMultiHomed(t *testing.T, args []string) {
	fabricA := netip.MustParseAddr("192.168.61.2")
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		dev := w.A.IfaceNames(lab.RoleFabric)[0]
		if err := w.A.AddAddr(dev, netip.PrefixFrom(fabricA, 32)); err != nil {
			return err
		}
		if err := w.B.DelRoute(netip.PrefixFrom(harness.MultiNodeA, 32)); err != nil {
			return err
		}
		bdev := w.B.IfaceNames(lab.RoleFabric)[0]
		return w.B.AddRoute(netip.PrefixFrom(fabricA, 32), netip.Addr{}, bdev)
	})
	for _, spec := range []lab.TransferSpec{{Download: 20 * mib, Upload: 10 * mib}, {Download: 1}} {
		r := transfer(t, w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080), spec)
		if r.Server.Local != netip.AddrPortFrom(harness.MultiPodB, 8080) || r.Server.Peer.Addr() != fabricA {
			t.Fatalf("served by %s seeing %s, want the pod on node B seeing %s (the fabric interface's address)",
				r.Server.Local, r.Server.Peer, fabricA)
		}
	}
	r, err := lab.UDPExchange(w.Client, netip.AddrPortFrom(harness.MultiClient, 0), netip.AddrPortFrom(harness.MultiNodeA, 30080), 1200, 2*time.Second)
	if err != nil || r.Server.Peer.Addr() != fabricA {
		t.Fatalf("UDP: %+v, %v: want the pod on node B seeing %s", r, err, fabricA)
	}
}

// TestPrivRealTrafficPathMTU: the link between the nodes has a smaller MTU
// (1400) than the client's and the pods' (1500), as with an overlay. A
// client's full-sized DF packets (and GSO super-packets of that segment
// size) cannot cross it: node A answers with ICMP frag-needed quoting the
// client's own packet (to the frontend), so the client's socket learns the
// path MTU and a 10 MiB upload completes from a pod through the
// ClusterIP. Without the translated ICMP the upload stalls (a PMTU black
// hole). In both netfilter modes. The external client through node A's
// XDP interfaces moves the same data: XDP hands a frame too big for the
// fabric to tc untranslated, and tc answers frag-needed. Only the 6.12
// guest's XDP program sees the client's 1500-byte frames (~10 frag-needed
// per run; without that hand-off the bypass upload stalled there); on 6.1
// and 6.18 the client's segments reach it already under the fabric's MTU
// and the log shows no frag-needed on that path.
func TestPrivRealTrafficPathMTU(t *testing.T) { inBothModes(t, testRealTrafficPathMTU) }

func testRealTrafficPathMTU(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		for _, n := range []*lab.Node{w.A, w.B} {
			for _, dev := range n.IfaceNames(lab.RoleFabric) {
				l, err := n.Netlink().LinkByName(dev)
				if err != nil {
					return err
				}
				if err := n.Netlink().LinkSetMTU(l, 1400); err != nil {
					return err
				}
			}
		}
		return nil
	})
	logVerdicts(t, w)
	for _, c := range []clientCase{
		{"pod, ClusterIP", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.30:80")},
		{"pod, NodePort (masqueraded)", w.PodA, harness.MultiPodA, netip.AddrPortFrom(harness.MultiNodeA, 30080)},
		// Through node A's XDP fast path (its external interfaces).
		{"external client, NodePort (masqueraded, XDP)", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080)},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, _ := agentVerdicts(w.Pins["node-a"])
			transfer(t, c.ns, c.src, c.dst, lab.TransferSpec{Upload: 10 * mib, Download: 10 * mib})
			after, err := agentVerdicts(w.Pins["node-a"])
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{"reject_frag_needed", "pass_frag_needed", "forward_after_xdp"} {
				t.Logf("node A: %s: %d packets", v, after[v]-before[v])
			}
		})
	}
}

// TestPrivRealTrafficReplyPathMTU: the narrow link is on the client's side
// of node A: the client sits two routers further away (the lab's client,
// then a link of MTU 1400 to a second router, then the client's own 1500),
// and announces a full-sized MSS. The backend's full-sized replies cannot
// cross the narrow link: its router answers them with ICMP frag-needed to
// the frontend they came from, quoting the reply as it left node A. Node A
// translates the error back for the backend (the quote's frontend to the
// backend, the client to the masquerade address where the flow is
// masqueraded) and sends it there, so the backend's socket learns the path
// MTU and a 10 MiB download completes through the masqueraded NodePort
// (the backend on node B), the LB IP and the eTP=Local NodePort (the
// backend on node A, which already knows the path MTU to the client when
// the NodePort's turn comes, as the client does to node A's address).
// Without it the download stalls (a PMTU black hole on the reply path).
// In both netfilter modes: in netfilter mode netfilter applies its own
// masquerade to the error after xvs.
func TestPrivRealTrafficReplyPathMTU(t *testing.T) { inBothModes(t, testRealTrafficReplyPathMTU) }

func testRealTrafficReplyPathMTU(t *testing.T, args []string) {
	farAddr := netip.MustParseAddr("192.0.2.40") // inside the LB's source ranges
	var far *lab.NS
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		narrow, err := w.Lab.AddClientBehind(w.Client, "narrow", netip.MustParseAddr("192.0.2.41"), 1400)
		if err != nil {
			return err
		}
		far, err = w.Lab.AddClientBehind(narrow, "far", farAddr, 0)
		return err
	})
	logVerdicts(t, w)
	learned := map[[2]netip.Addr]bool{}
	for _, c := range []struct {
		name       string
		dst        netip.AddrPort
		serve, see netip.Addr
	}{
		{"masqueraded NodePort", netip.AddrPortFrom(harness.MultiNodeA, 30080), harness.MultiPodB, harness.MultiNodeA},
		{"LB IP", netip.AddrPortFrom(harness.MultiLBIP, 80), harness.MultiPodA, farAddr},
		{"eTP=Local NodePort", netip.AddrPortFrom(harness.MultiNodeA, 30081), harness.MultiPodA, farAddr},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, _ := agentVerdicts(w.Pins["node-a"])
			r := transfer(t, far, farAddr, c.dst, lab.TransferSpec{Download: 10 * mib, Upload: 1 * mib})
			if r.Server.Local != netip.AddrPortFrom(c.serve, 8080) || r.Server.Peer.Addr() != c.see {
				t.Fatalf("served by %s seeing %s, want %s seeing %s", r.Server.Local, r.Server.Peer, c.serve, c.see)
			}
			after, err := agentVerdicts(w.Pins["node-a"])
			if err != nil {
				t.Fatal(err)
			}
			n := after["forward_icmp_error"] - before["forward_icmp_error"]
			t.Logf("node A: forward_icmp_error: %d packets", n)
			// A backend remembers the path MTU to its peer, and the client
			// to the address it dialled (its SYN then announces the
			// smaller MSS, as the upload taught it): only a case new in
			// both must have asked for it.
			if n == 0 && !learned[[2]netip.Addr{c.serve, c.see}] && !learned[[2]netip.Addr{farAddr, c.dst.Addr()}] {
				t.Fatal("node A translated no ICMP error about a reply: the path never asked for a smaller MTU")
			}
			learned[[2]netip.Addr{c.serve, c.see}] = true
			learned[[2]netip.Addr{farAddr, c.dst.Addr()}] = true
		})
	}
}

// TestPrivRealTrafficVXLANFabric: the nodes' pod networks meet over a
// VXLAN overlay shaped like flannel's vxlan backend (lab.VXLAN: vxlan0, MTU
// 1450, static neighbour and forwarding entries, pod CIDRs routed via the
// peer's overlay address) instead of a plain fabric; see
// testRealTrafficOverlay.
func TestPrivRealTrafficVXLANFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) { testRealTrafficOverlay(t, args, (*lab.Lab).VXLAN) })
}

// TestPrivIPIPFabric: the same over an IPIP overlay shaped like Calico's
// IPIP mode (lab.IPIP: the NBMA fallback device tunl0, MTU 1480, pod CIDRs
// routed via the peer's node address on link), whose driver takes each
// packet's outer destination from the route attached to it. It needs the
// ipip module, which this host's kernel lacks: make test runs it in the
// 6.1 VM, as TestPrivIPVS*.
func TestPrivIPIPFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) { testRealTrafficOverlay(t, args, (*lab.Lab).IPIP) })
}

// TestPrivWireGuardFabric: the same over an encrypted WireGuard tunnel
// shaped like Calico's and Cilium's WireGuard modes (lab.WireGuard: wg0,
// MTU 1420, one peer per node whose allowed IPs are what the node routes
// to it): a device without a link-layer header whose driver picks the
// peer by the inner destination and drops what arrives from a source the
// peer may not use. It needs the wireguard module and wg(8), which this
// host lacks: make test runs it in the 6.1 VM.
func TestPrivWireGuardFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) { testRealTrafficOverlay(t, args, (*lab.Lab).WireGuard) })
}

// TestPrivVLANFabric: the same with the pod networks on an 802.1Q VLAN
// (lab.VLAN: vlan100 on each node's fabric veth, the peer's address
// resolved by ARP over it). The programs on the fabric veth see the
// VLAN's frames first, with the tag in the packet's metadata: they must
// leave them to the VLAN device's own program (verdict pass_vlan_tagged),
// or a reply translated and redirected there keeps its tag and the pod or
// client it reaches drops it as another VLAN's. It needs the 8021q module,
// which this host lacks: make test runs it in the 6.1 VM.
func TestPrivVLANFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) {
		w := testRealTrafficOverlay(t, args, (*lab.Lab).VLAN)
		vs, err := agentVerdicts(w.Pins["node-a"])
		if err != nil {
			t.Fatal(err)
		}
		if vs["pass_vlan_tagged"] == 0 {
			t.Fatalf("node A's programs never met a tagged packet (verdicts %v): the traffic did not cross the VLAN's lower device", vs)
		}
		t.Logf("node A: pass_vlan_tagged: %d packets", vs["pass_vlan_tagged"])
	})
}

// TestPrivRealTrafficFlannelFabric: the VXLAN overlay with flannel's own
// addressing (lab.FlannelVXLAN: vxlan0 holds 10.244.0.0/32 on node A,
// 10.244.1.0/32 on node B, global, and the routes to the peer's pod CIDR
// leave the source to the kernel), which makes each node multi-homed: a
// NodePort's traffic masqueraded over the overlay must leave from the
// overlay device's address, as MASQUERADE picks it, and pod B sees
// 10.244.0.0; its replies come back over the overlay.
func TestPrivRealTrafficFlannelFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) {
		testRealTrafficOverlayMasq(t, args, func(l *lab.Lab, a, b *lab.Node) (*lab.Overlay, error) {
			return l.FlannelVXLAN(a, b, netip.MustParseAddr("10.244.0.0"), netip.MustParseAddr("10.244.1.0"))
		}, netip.MustParseAddr("10.244.0.0"))
	})
}

// TestPrivGeneveFabric: the same over a Geneve tunnel (lab.Geneve:
// geneve0, VNI 1, MTU 1450, the peer's node address as its remote), the
// encapsulation of Cilium and OVN-Kubernetes. It needs the geneve module,
// which this host lacks: make test runs it in the 6.1 VM.
func TestPrivGeneveFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) { testRealTrafficOverlay(t, args, (*lab.Lab).Geneve) })
}

// TestPrivBondFabric: the same with the nodes joined by a bond of two links
// (lab.Bond: bond0, balance-xor over two veths, layer3+4 hash), as a
// node with bonded NICs: the programs meet each packet first on the link
// it arrived by and again on bond0, and redirect replies into the bond,
// which picks a link. The links together must have carried what bond0
// did. Which link a flow takes is the bond's hash of its ports: a run's
// few bulk flows may all hash to one link (CI's 6.1 run saw that), so the
// split is logged, not required. It needs the bonding module, which this
// host lacks: make test runs it in the 6.1 VM.
func TestPrivBondFabric(t *testing.T) {
	inBothModes(t, func(t *testing.T, args []string) {
		w := testRealTrafficOverlay(t, args, (*lab.Lab).Bond)
		brx, btx, err := (&lab.Overlay{Dev: "bond0"}).Stats(w.A)
		if err != nil {
			t.Fatal(err)
		}
		var rx, tx uint64
		for _, dev := range []string{"bond1", "bond2"} {
			r, x, err := (&lab.Overlay{Dev: dev}).Stats(w.A)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("node A %s: %d MiB in, %d MiB out", dev, r/mib, x/mib)
			rx, tx = rx+r, tx+x
		}
		if rx < brx || tx < btx {
			t.Fatalf("node A's links carried %d bytes in and %d out, its bond0 %d and %d: traffic left the bond by another way", rx, tx, brx, btx)
		}
	})
}

// testRealTrafficOverlay: through the overlay join builds between the two
// nodes: 20 MiB down and 10 MiB up from a pod through the ClusterIP to the
// remote pod and from an external client through the masqueraded
// NodePort, the other way from pod B to node A's pod, and UDP. The
// translated packets enter the overlay device (redirected by the program
// in bypass mode, routed by the stack in pass mode) and are encapsulated,
// and the pods' full-sized segments meet the overlay's smaller MTU.
func testRealTrafficOverlay(t *testing.T, args []string, join func(*lab.Lab, *lab.Node, *lab.Node) (*lab.Overlay, error)) *harness.Multi {
	return testRealTrafficOverlayMasq(t, args, join, harness.MultiNodeA)
}

// testRealTrafficOverlayMasq is testRealTrafficOverlay where pod B sees
// masqueraded traffic from node A come from masq.
func testRealTrafficOverlayMasq(t *testing.T, args []string, join func(*lab.Lab, *lab.Node, *lab.Node) (*lab.Overlay, error), masq netip.Addr) *harness.Multi {
	var ov *lab.Overlay
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		var err error
		if ov, err = join(w.Lab, w.A, w.B); err != nil {
			return err
		}
		if err := ov.Route(w.A, netip.MustParsePrefix("10.244.1.0/24")); err != nil {
			return err
		}
		return ov.Route(w.B, netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/24"))
	})
	logVerdicts(t, w)
	rx0, tx0, err := ov.Stats(w.A)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		ns          *lab.NS
		src         netip.Addr
		dst         netip.AddrPort
		serve, peer netip.Addr
	}{
		{"pod A, ClusterIP, remote pod", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.30:80"), harness.MultiPodB, harness.MultiPodA},
		{"external client, masqueraded NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30080), harness.MultiPodB, masq},
		// Endpoints on both nodes: until one transfer each way reaches
		// pod A across the overlay; pod B's own (hairpin) connections are
		// masqueraded to node B.
		{"pod B, ClusterIP, pod on node A", w.PodB, harness.MultiPodB, netip.MustParseAddrPort("172.30.0.31:80"), harness.MultiPodA, harness.MultiPodB},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, spec := range []lab.TransferSpec{{Download: 20 * mib, Upload: 10 * mib}, {Download: 1, Upload: 1}} {
				for try := 0; ; try++ {
					r := transfer(t, c.ns, c.src, c.dst, spec)
					if r.Server.Local == netip.AddrPortFrom(harness.MultiPodB, 8080) && c.serve == harness.MultiPodA && try < 16 {
						if r.Server.Peer.Addr() != harness.MultiNodeB {
							t.Fatalf("%+v: hairpin to %s seeing %s, want node B's address", spec, r.Server.Local, r.Server.Peer)
						}
						continue
					}
					if r.Server.Local != netip.AddrPortFrom(c.serve, 8080) || r.Server.Peer.Addr() != c.peer {
						t.Fatalf("%+v: served by %s seeing %s, want %s seeing %s", spec, r.Server.Local, r.Server.Peer, c.serve, c.peer)
					}
					break
				}
			}
			for try := 0; ; try++ {
				r, err := lab.UDPExchange(c.ns, netip.AddrPortFrom(c.src, 0), c.dst, 1200, 2*time.Second)
				if err == nil && r.Server.Local != netip.AddrPortFrom(c.serve, 8080) && try < 16 {
					continue
				}
				if err != nil || r.Server.Local != netip.AddrPortFrom(c.serve, 8080) {
					t.Fatalf("UDP: %+v, %v: want the reply of %s", r, err, c.serve)
				}
				break
			}
		})
	}
	rx, tx, err := ov.Stats(w.A)
	if err != nil {
		t.Fatal(err)
	}
	// In through node A's overlay device: pod A's download from pod B and pod
	// B's upload to pod A (30 MiB); the masqueraded NodePort's replies
	// go to node A's own address, which node B reaches over the
	// underlay, as on a flannel node. Out: the two uploads to pod B and
	// pod B's download from pod A (40 MiB).
	t.Logf("node A %s: %d MiB in, %d MiB out", ov.Dev, (rx-rx0)/mib, (tx-tx0)/mib)
	if rx-rx0 < 29*mib || tx-tx0 < 39*mib {
		t.Fatalf("node A's %s carried %d bytes in and %d out: the traffic did not take the overlay", ov.Dev, rx-rx0, tx-tx0)
	}
	return w
}

// TestPrivRealTrafficL3Device: an external client behind an L3 link (tun
// devices and a relay: no Ethernet header, as IPIP or WireGuard) moves
// real data through the masqueraded NodePort, the eTP=Local NodePort
// (replies leave by the tun device's egress) and the LB IP, and is
// refused (a TCP RST built on the L3 device) by the NodePort without
// endpoints; in both netfilter modes.
func TestPrivRealTrafficL3Device(t *testing.T) { inBothModes(t, testRealTrafficL3Device) }

func testRealTrafficL3Device(t *testing.T, args []string) {
	tunClient := netip.MustParseAddr("192.0.2.30")
	var client *lab.NS
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		var err error
		client, err = w.Lab.AddTunClient(w.A, "tunc", tunClient)
		return err
	})
	logVerdicts(t, w)
	for _, c := range []struct {
		dst        netip.AddrPort
		serve, see netip.Addr
	}{
		{netip.AddrPortFrom(harness.MultiNodeA, 30080), harness.MultiPodB, harness.MultiNodeA},
		{netip.AddrPortFrom(harness.MultiNodeA, 30081), harness.MultiPodA, tunClient},
		{netip.AddrPortFrom(harness.MultiLBIP, 80), harness.MultiPodA, tunClient},
	} {
		for _, spec := range []lab.TransferSpec{{Download: 8 * mib, Upload: 2 * mib}, {Download: 1, Upload: 1}} {
			r := transfer(t, client, tunClient, c.dst, spec)
			if r.Server.Local != netip.AddrPortFrom(c.serve, 8080) || r.Server.Peer.Addr() != c.see {
				t.Fatalf("%s %+v: served by %s seeing %s, want %s seeing %s", c.dst, spec, r.Server.Local, r.Server.Peer, c.serve, c.see)
			}
		}
	}
	expectVerdict(t, lab.ProbeTCP, client, tunClient, netip.AddrPortFrom(harness.MultiNodeA, 30082), lab.Refused)
	expectVerdict(t, lab.ProbeUDP, client, tunClient, netip.AddrPortFrom(harness.MultiNodeA, 30082), lab.Refused)
}

// icmpManifests: UDP Services whose endpoints have no socket on the target
// port, so each datagram gets an ICMP port unreachable from the pod.
const icmpManifests = `---
apiVersion: v1
kind: Service
metadata: {name: closed, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.40
  clusterIPs: [172.30.0.40]
  ports: [{name: udp, port: 80, targetPort: 9999, nodePort: 30083, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: closed-1, namespace: lab, labels: {kubernetes.io/service-name: closed}}
addressType: IPv4
endpoints: [{addresses: [10.244.1.11], nodeName: node-b}]
ports: [{name: udp, port: 9999, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: closed-local, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.41
  clusterIPs: [172.30.0.41]
  externalTrafficPolicy: Local
  ports: [{name: udp, port: 80, targetPort: 9999, nodePort: 30084, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: closed-local-1, namespace: lab, labels: {kubernetes.io/service-name: closed-local}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a}]
ports: [{name: udp, port: 9999, protocol: UDP}]
`

// TestPrivRealTrafficICMPErrors: a pod that does not listen on a Service's
// target port answers each datagram with ICMP port unreachable quoting the
// translated packet; the node translates the quote back, so the client's
// connected UDP socket gets ECONNREFUSED, as under kube-proxy: from a pod
// through the ClusterIP (the endpoint on the other node), from an external
// client through a masqueraded NodePort (netfilter undoes its masquerade
// of the quote, xvs its DNAT) and through an eTP=Local NodePort. In both
// netfilter modes: in bypass mode node A's tc ingress translates the error
// (the quote and, for the masqueraded flow, the destination), in pass mode
// its tc egress, after netfilter.
func TestPrivRealTrafficICMPErrors(t *testing.T) { inBothModes(t, testRealTrafficICMPErrors) }

func testRealTrafficICMPErrors(t *testing.T, args []string) {
	w := newMultiNodeWorldArgs(t, args, func(w *harness.Multi) error {
		f, err := os.OpenFile(filepath.Join(w.Dir, "lab.yaml"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.WriteString(icmpManifests)
		return err
	})
	logVerdicts(t, w)
	for _, c := range []clientCase{
		{"pod, ClusterIP, remote endpoint", w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.40:80")},
		{"external client, masqueraded NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30083)},
		{"external client, eTP=Local NodePort", w.Client, harness.MultiClient, netip.AddrPortFrom(harness.MultiNodeA, 30084)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if r := lab.ProbeUDP(c.ns, c.src, c.dst, 2*time.Second); r.Verdict != lab.Refused {
				t.Fatalf("UDP %s -> %s: %v, want refused (the pod's port unreachable, translated)", c.src, c.dst, r)
			}
		})
	}
	vs, err := agentVerdicts(w.Pins["node-a"])
	if err != nil {
		t.Fatal(err)
	}
	if vs["reply_icmp_error"] < 3 {
		t.Fatalf("node A translated %d ICMP errors, want at least 3", vs["reply_icmp_error"])
	}
}
