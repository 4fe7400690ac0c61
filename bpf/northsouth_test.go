package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

var (
	nodeIP  = netip.MustParseAddr("192.168.50.2")
	podNet  = netip.MustParsePrefix("10.244.0.0/16")
	svcNet  = netip.MustParsePrefix("172.30.0.0/16")
	lbIP    = netip.MustParseAddr("203.0.113.10")
	extIP   = netip.MustParseAddr("198.51.100.20")
	podCli  = netip.MustParseAddr("10.244.3.3")
	allowed = netip.MustParsePrefix("192.0.2.0/28")
)

// nsEnv programs a State with node settings, the way the agent does.
func (e *env) syncState(t *testing.T, masqAll bool, sps ...*model.ServicePort) {
	t.Helper()
	st := &model.State{
		Services:      map[model.ServicePortName]*model.ServicePort{},
		Node:          model.Node{Name: "node", Addresses: []netip.Addr{nodeIP}},
		PodCIDRs:      []netip.Prefix{podNet},
		ServiceCIDRs:  []netip.Prefix{svcNet},
		MasqueradeAll: masqAll,
	}
	for _, sp := range sps {
		st.Services[sp.Name] = sp
	}
	if err := e.dp.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
}

// webService has a ClusterIP, a NodePort on the node, an ExternalIP and an
// LB IP, all on port 80 (NodePort 30080), with one local and one remote
// backend.
func webService(local, remote netip.AddrPort) *model.ServicePort {
	sp := clusterIPService("web", vip, 80, model.TCP)
	sp.Frontends = append(sp.Frontends,
		model.Frontend{Kind: model.NodePort, Addr: nodeIP, Port: 30080, Proto: model.TCP},
		model.Frontend{Kind: model.ExternalIP, Addr: extIP, Port: 80, Proto: model.TCP},
		model.Frontend{Kind: model.LoadBalancer, Addr: lbIP, Port: 80, Proto: model.TCP},
	)
	sp.ClusterEndpoints = []model.Endpoint{
		{Addr: local.Addr(), Port: local.Port(), Local: true, Ready: true, Serving: true, Weight: 1},
		{Addr: remote.Addr(), Port: remote.Port(), Ready: true, Serving: true, Weight: 1},
	}
	sp.LocalEndpoints = sp.ClusterEndpoints[:1]
	sp.HasEndpoints = true
	return sp
}

func synTo(t *testing.T, e *env, src netip.Addr, dst netip.AddrPort) (uint32, decoded) {
	t.Helper()
	ret, out := e.run(t, packet(t, src, dst.Addr(), l4{proto: model.TCP, sport: 40000, dport: dst.Port(), syn: true}))
	if ret != tcActOK && ret != tcActRedirect {
		return ret, decoded{}
	}
	return ret, decode(t, out)
}

// TestPrivPacketMasquerade: where kube-proxy masquerades (SEMANTICS 3.13),
// the packet leaves from the node's address and a port of the masquerade
// range, and the reply goes back to the client from the frontend.
func TestPrivPacketMasquerade(t *testing.T) {
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	remote := netip.MustParseAddrPort("10.244.1.12:8080")
	e := newEnv(t, loader.DefaultConfig())
	sp := webService(local, remote)
	e.syncState(t, false, sp)

	cases := []struct {
		name string
		src  netip.Addr
		dst  netip.AddrPort
		snat bool
	}{
		{"external to NodePort (eTP=Cluster)", client, netip.AddrPortFrom(nodeIP, 30080), true},
		{"external to ExternalIP", client, netip.AddrPortFrom(extIP, 80), true},
		{"pod to NodePort (eTP=Cluster)", podCli, netip.AddrPortFrom(nodeIP, 30080), true},
		{"off-cluster source to ClusterIP", client, netip.AddrPortFrom(vip, 80), true},
		{"pod to ClusterIP keeps its address", podCli, netip.AddrPortFrom(vip, 80), false},
	}
	for i, c := range cases {
		src := c.src
		sport := uint16(41000 + i)
		ephLo, ephHi, err := reconcile.EphemeralPorts()
		if err != nil {
			t.Fatal(err)
		}
		ret, out := e.run(t, packet(t, src, c.dst.Addr(), l4{proto: model.TCP, sport: sport, dport: c.dst.Port(), syn: true}))
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("%s: ret %d", c.name, ret)
		}
		d := decode(t, out)
		if !d.checksumsOK {
			t.Fatalf("%s: %s", c.name, d.checksumNote)
		}
		if d.dst != local && d.dst != remote {
			t.Fatalf("%s: DNAT to %s", c.name, d.dst)
		}
		if got := d.src.Addr() == nodeIP; got != c.snat {
			t.Fatalf("%s: source %s, masquerade %v, want %v", c.name, d.src, got, c.snat)
		}
		if c.snat && (d.src.Port() < reconcile.DefaultSNATPortMin || d.src.Port() >= ephLo && d.src.Port() <= ephHi) {
			t.Fatalf("%s: masquerade port %d outside %d-%d or inside the ephemeral range %d-%d",
				c.name, d.src.Port(), reconcile.DefaultSNATPortMin, reconcile.DefaultSNATPortMax, ephLo, ephHi)
		}
		// The reply, as the backend sends it, comes back to the client
		// from the frontend.
		ret, back := e.run(t, packet(t, d.dst.Addr(), d.src.Addr(), l4{proto: model.TCP, sport: d.dst.Port(), dport: d.src.Port(), syn: true, ack: true}))
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("%s: reply ret %d", c.name, ret)
		}
		r := decode(t, back)
		if r.src != c.dst || r.dst != netip.AddrPortFrom(src, sport) || !r.checksumsOK {
			t.Fatalf("%s: reply %s -> %s (checksums ok %v), want %s -> %s:%d", c.name, r.src, r.dst, r.checksumsOK, c.dst, src, sport)
		}
	}

	// Hairpin: a pod reaching itself through the ClusterIP is masqueraded.
	solo := clusterIPService("solo", netip.MustParseAddr("172.30.0.20"), 80, model.TCP, netip.AddrPortFrom(podCli, 8080))
	e.syncState(t, false, sp, solo)
	_, d := synTo(t, e, podCli, netip.MustParseAddrPort("172.30.0.20:80"))
	if d.dst.Addr() != podCli || d.src.Addr() != nodeIP {
		t.Fatalf("hairpin: %s -> %s, want the node as source", d.src, d.dst)
	}

	// masqueradeAll: even pod to ClusterIP.
	e.syncState(t, true, sp)
	_, d = synTo(t, e, netip.MustParseAddr("10.244.3.4"), netip.AddrPortFrom(vip, 80))
	if d.src.Addr() != nodeIP {
		t.Fatalf("masqueradeAll: source %s", d.src)
	}
}

// TestPrivPacketLocalPolicy: eTP=Local sends external clients to local
// endpoints with their own address, short-circuits pods to every endpoint,
// and drops when no local endpoint exists but others do.
func TestPrivPacketLocalPolicy(t *testing.T) {
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	remote := netip.MustParseAddrPort("10.244.1.12:8080")
	e := newEnv(t, loader.DefaultConfig())
	sp := webService(local, remote)
	sp.ExternalLocal = true
	e.syncState(t, false, sp)
	np := netip.AddrPortFrom(nodeIP, 30080)
	for i := range 20 {
		ret, out := e.run(t, packet(t, client, nodeIP, l4{proto: model.TCP, sport: uint16(42000 + i), dport: 30080, syn: true}))
		d := decode(t, out)
		if (ret != tcActOK && ret != tcActRedirect) || d.dst != local || d.src.Addr() != client {
			t.Fatalf("eTP=Local external: ret %d, %s -> %s", ret, d.src, d.dst)
		}
	}
	seen := map[netip.AddrPort]bool{}
	for i := range 40 {
		_, out := e.run(t, packet(t, podCli, nodeIP, l4{proto: model.TCP, sport: uint16(43000 + i), dport: 30080, syn: true}))
		d := decode(t, out)
		if d.src.Addr() != podCli {
			t.Fatalf("short-circuited pod was masqueraded: %s", d.src)
		}
		seen[d.dst] = true
	}
	if !seen[remote] || !seen[local] {
		t.Fatalf("pod traffic to an eTP=Local NodePort reached %v, want every endpoint", seen)
	}

	sp2 := webService(local, remote)
	sp2.ExternalLocal = true
	sp2.LocalEndpoints = nil
	e.syncState(t, false, sp2)
	if ret, _ := synTo(t, e, client, np); ret != tcActShot {
		t.Fatalf("eTP=Local without local endpoints: ret %d, want drop", ret)
	}
	checkVerdict(t, e, xbpf.XvsXvsVerdictXVS_V_DROP_NO_LOCAL)
}

func checkVerdict(t *testing.T, e *env, v xbpf.Verdict) {
	t.Helper()
	snap, err := e.m.Read(true)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Verdicts[mapsVerdictName(v)].PacketsIn == 0 {
		t.Fatalf("verdict %v never counted: %v", v, snap.Verdicts)
	}
}

// TestPrivPacketFiltering: source ranges on LB IPs, wrong port on a
// ClusterIP, unallocated service addresses, conntrack-invalid segments.
func TestPrivPacketFiltering(t *testing.T) {
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	remote := netip.MustParseAddrPort("10.244.1.12:8080")
	e := newEnv(t, loader.DefaultConfig())
	sp := webService(local, remote)
	sp.SourceRanges = []netip.Prefix{allowed}
	e.syncState(t, false, sp)

	lb := netip.AddrPortFrom(lbIP, 80)
	if ret, d := synTo(t, e, netip.MustParseAddr("192.0.2.5"), lb); ret == tcActShot || d.dst.Port() != 8080 {
		t.Fatalf("allowed source to LB IP: ret %d", ret)
	}
	if ret, _ := synTo(t, e, netip.MustParseAddr("192.0.2.200"), lb); ret != tcActShot {
		t.Fatalf("source outside the ranges: ret %d, want drop", ret)
	}
	checkVerdict(t, e, xbpf.XvsXvsVerdictXVS_V_DROP_SOURCE_RANGE)
	// Source ranges filter only the LB IP: NodePort from outside works.
	if ret, _ := synTo(t, e, netip.MustParseAddr("192.0.2.200"), netip.AddrPortFrom(nodeIP, 30080)); ret == tcActShot {
		t.Fatal("source ranges applied to the NodePort")
	}

	// Wrong port on a live ClusterIP: TCP RST; UDP: ICMP port unreachable.
	ret, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 1234, dport: 81, syn: true}))
	if ret != tcActRedirect || decode(t, out).tcp == nil || !decode(t, out).tcp.RST {
		t.Fatalf("wrong TCP port on a ClusterIP: ret %d, want a RST", ret)
	}
	ret, out = e.run(t, packet(t, client, vip, l4{proto: model.UDP, sport: 1234, dport: 80}))
	if d := decode(t, out); ret != tcActRedirect || d.icmp == nil || d.icmp.TypeCode != layers.CreateICMPv4TypeCode(3, 3) {
		t.Fatalf("wrong protocol on a ClusterIP: ret %d, want ICMP port unreachable", ret)
	}
	checkVerdict(t, e, xbpf.XvsXvsVerdictXVS_V_REJECT_WRONG_PORT)

	// An unallocated address in the service CIDR is dropped; outside it,
	// not ours.
	if ret, _ := e.run(t, packet(t, client, netip.MustParseAddr("172.30.9.9"), l4{proto: model.TCP, sport: 1, dport: 80, syn: true})); ret != tcActShot {
		t.Fatalf("unallocated service IP: ret %d, want drop", ret)
	}
	checkVerdict(t, e, xbpf.XvsXvsVerdictXVS_V_DROP_UNALLOCATED)

	// A mid-stream segment of no known flow is conntrack-INVALID.
	if ret, _ := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 5555, dport: 80, ack: true})); ret != tcActShot {
		t.Fatalf("ACK without a flow: ret %d, want drop", ret)
	}
}

func mapsVerdictName(v xbpf.Verdict) string { return maps.VerdictName(v) }

// TestPrivPacketSCTP: SCTP is balanced like UDP; only the address changes
// (the CRC32c does not cover it), so the SCTP bytes leave untouched.
func TestPrivPacketSCTP(t *testing.T) {
	e := newEnv(t, loader.DefaultConfig())
	sp := clusterIPService("sctp", vip, 9999, model.SCTP, netip.MustParseAddrPort("10.244.0.11:9999"))
	e.syncState(t, false, sp)
	// Ethernet, IPv4 (proto 132), SCTP common header and an INIT chunk.
	sctp := []byte{0x9c, 0x40, 0x27, 0x0f, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef,
		1, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0x10, 0, 0, 1, 0, 1, 0, 0, 0, 1}
	pkt := packet(t, podCli, vip, l4{proto: model.UDP, sport: 40000, dport: 9999, payload: make([]byte, len(sctp)-8)})
	copy(pkt[14+20:], sctp)
	pkt[14+9] = 132
	pkt[14+10], pkt[14+11] = 0, 0
	c := ipChecksum(pkt[14:34])
	pkt[14+10], pkt[14+11] = byte(c>>8), byte(c)
	ret, out := e.run(t, pkt)
	if ret != tcActOK && ret != tcActRedirect {
		t.Fatalf("SCTP to a ClusterIP: ret %d", ret)
	}
	if dst := netip.AddrFrom4([4]byte(out[30:34])); dst != netip.MustParseAddr("10.244.0.11") {
		t.Fatalf("SCTP DNAT to %s", dst)
	}
	if string(out[34:]) != string(sctp) {
		t.Fatal("the SCTP header or chunk changed")
	}
	if ipChecksum(out[14:34]) != 0 {
		t.Fatal("IPv4 header checksum broken")
	}
}

// TestPrivPacketMasqueradeClosedPort: with one masquerade port, a
// connection that has closed (TIME_WAIT) hands its port to the next
// connection's SYN, as netfilter's NAT does, instead of holding it for the
// 120 s of TIME_WAIT; a live connection keeps its port, and a segment that
// is not a SYN takes nothing.
func TestPrivPacketMasqueradeClosedPort(t *testing.T) {
	be := netip.MustParseAddrPort("10.244.1.12:8080")
	e := newEnvMaps(t, loader.DefaultConfig(), reconcile.Config{SNATPortMin: 61000, SNATPortMax: 61000})
	sp := clusterIPService("web", vip, 80, model.TCP)
	sp.Frontends = append(sp.Frontends, model.Frontend{Kind: model.NodePort, Addr: nodeIP, Port: 30080, Proto: model.TCP})
	sp.ClusterEndpoints = []model.Endpoint{{Addr: be.Addr(), Port: be.Port(), Ready: true, Serving: true, Weight: 1}}
	sp.LocalEndpoints = sp.ClusterEndpoints
	sp.HasEndpoints = true
	e.syncState(t, false, sp)
	np := netip.AddrPortFrom(nodeIP, 30080)
	masq := netip.AddrPortFrom(nodeIP, 61000)

	// in sends a client segment of the connection from sport and returns
	// where it went (invalid if it was not forwarded).
	in := func(sport uint16, f l4) netip.AddrPort {
		t.Helper()
		f.proto, f.sport, f.dport = model.TCP, sport, np.Port()
		ret, out := e.run(t, packet(t, client, np.Addr(), f))
		if ret != tcActOK && ret != tcActRedirect {
			return netip.AddrPort{}
		}
		d := decode(t, out)
		if d.dst != be {
			t.Fatalf("segment from %d went to %s", sport, d.dst)
		}
		return d.src
	}
	// back sends the backend's segment to the masquerade port and returns
	// where it went.
	back := func(f l4) netip.AddrPort {
		t.Helper()
		f.proto, f.sport, f.dport = model.TCP, be.Port(), masq.Port()
		_, out := e.run(t, packet(t, be.Addr(), masq.Addr(), f))
		return decode(t, out).dst
	}
	open := func(sport uint16) {
		t.Helper()
		if src := in(sport, l4{syn: true}); src != masq {
			t.Fatalf("SYN from %d left from %s, want %s", sport, src, masq)
		}
		if to := back(l4{syn: true, ack: true}); to != netip.AddrPortFrom(client, sport) {
			t.Fatalf("SYN-ACK went to %s, want the client's port %d", to, sport)
		}
		in(sport, l4{ack: true})
	}

	open(40000)
	// Live: a second connection finds no port.
	if src := in(40001, l4{syn: true}); src.IsValid() {
		t.Fatalf("a SYN took the live connection's port: left from %s", src)
	}
	// The client closes first; the backend's FIN is acknowledged.
	in(40000, l4{fin: true, ack: true})
	back(l4{fin: true, ack: true})
	in(40000, l4{ack: true})
	// A non-SYN segment of no flow takes nothing; a SYN takes the port.
	if src := in(40002, l4{ack: true}); src == masq {
		t.Fatal("a bare ACK took the closed connection's port")
	}
	open(40003)
	// The old connection's late segment no longer reaches the client's
	// old port through the new mapping... the new flow owns the way back.
	if to := back(l4{ack: true}); to != netip.AddrPortFrom(client, 40003) {
		t.Fatalf("the backend's segment went to %s, want the new connection's client port", to)
	}
}
