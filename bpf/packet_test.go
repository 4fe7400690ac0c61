package bpf_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/google/gopacket/layers"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

var (
	vip      = netip.MustParseAddr("172.30.0.10")
	client   = netip.MustParseAddr("192.0.2.2")
	backend1 = netip.MustParseAddrPort("10.244.1.2:8080")
	backend2 = netip.MustParseAddrPort("10.244.2.3:8080")
)

func oneService(t *testing.T, proto model.Protocol, port uint16, backends ...netip.AddrPort) *env {
	e := newEnv(t, loader.DefaultConfig())
	e.sync(t, clusterIPService("web", vip, port, proto, backends...))
	return e
}

func isBackend(ap netip.AddrPort, backends ...netip.AddrPort) bool {
	for _, b := range backends {
		if ap == b {
			return true
		}
	}
	return false
}

// TestPrivPacketDNATAndReverseNAT: the first packet is rewritten to a
// backend with valid checksums and nothing else changed; the reply comes
// back with the VIP as its source.
func TestPrivPacketDNATAndReverseNAT(t *testing.T) {
	for _, proto := range []model.Protocol{model.TCP, model.UDP} {
		t.Run(proto.String(), func(t *testing.T) {
			e := oneService(t, proto, 80, backend1, backend2)
			in := packet(t, client, vip, l4{proto: proto, sport: 40000, dport: 80, syn: true, payload: []byte("hello")})
			ret, out := e.run(t, in)
			if ret != tcActOK {
				t.Fatalf("ret = %d, want TC_ACT_OK", ret)
			}
			d := decode(t, out)
			if !d.checksumsOK {
				t.Fatalf("forward packet: %s", d.checksumNote)
			}
			if !isBackend(d.dst, backend1, backend2) {
				t.Fatalf("dst = %s, want a backend", d.dst)
			}
			if d.src != netip.AddrPortFrom(client, 40000) {
				t.Fatalf("src = %s changed; ClusterIP traffic keeps the client address", d.src)
			}
			// Byte for byte: only daddr, dport and the checksums moved.
			want := packet(t, client, d.dst.Addr(), l4{proto: proto, sport: 40000, dport: d.dst.Port(), syn: true, payload: []byte("hello")})
			if !bytes.Equal(out, want) {
				t.Fatalf("forward packet differs from a freshly built one:\n got %x\nwant %x", out, want)
			}

			// Every later packet of the flow sticks to the same backend.
			for range 20 {
				_, out := e.run(t, packet(t, client, vip, l4{proto: proto, sport: 40000, dport: 80, ack: true}))
				if got := decode(t, out).dst; got != d.dst {
					t.Fatalf("flow moved from %s to %s", d.dst, got)
				}
			}

			reply := packet(t, d.dst.Addr(), client, l4{proto: proto, sport: d.dst.Port(), dport: 40000, syn: true, ack: true, payload: []byte("world")})
			ret, out = e.run(t, reply)
			if ret != tcActOK {
				t.Fatalf("reply ret = %d", ret)
			}
			r := decode(t, out)
			if !r.checksumsOK {
				t.Fatalf("reply: %s", r.checksumNote)
			}
			if r.src != netip.AddrPortFrom(vip, 80) || r.dst != netip.AddrPortFrom(client, 40000) {
				t.Fatalf("reply %s -> %s, want %s:80 -> client", r.src, r.dst, vip)
			}
			wantReply := packet(t, vip, client, l4{proto: proto, sport: 80, dport: 40000, syn: true, ack: true, payload: []byte("world")})
			if !bytes.Equal(out, wantReply) {
				t.Fatalf("reply differs:\n got %x\nwant %x", out, wantReply)
			}
		})
	}
}

// TestPrivPacketSpread: new flows are spread over every backend.
func TestPrivPacketSpread(t *testing.T) {
	e := oneService(t, model.TCP, 80, backend1, backend2)
	seen := map[netip.AddrPort]int{}
	for i := range 200 {
		_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: uint16(20000 + i), dport: 80, syn: true}))
		seen[decode(t, out).dst]++
	}
	if len(seen) != 2 || seen[backend1] < 50 || seen[backend2] < 50 {
		t.Fatalf("200 flows spread as %v", seen)
	}
}

// TestPrivPacketUntouched: traffic that is not for a Service, and packets we
// cannot parse, leave the program exactly as they came.
func TestPrivPacketUntouched(t *testing.T) {
	e := oneService(t, model.TCP, 80, backend1)
	other := netip.MustParseAddr("198.51.100.7")
	cases := map[string][]byte{
		"other address": packet(t, client, other, l4{proto: model.TCP, sport: 1, dport: 80, syn: true}),
		// A live ClusterIP on another port is REJECTed (nstest in
		// northsouth_test.go); an address no Service owns is not ours.
		"other port of a non-ClusterIP": packet(t, other, client, l4{proto: model.TCP, sport: 80, dport: 81, syn: true}),
	}
	full := packet(t, client, vip, l4{proto: model.TCP, sport: 3333, dport: 80, syn: true, payload: []byte("abc")})
	// BPF_PROG_TEST_RUN refuses IPv4 frames shorter than Ethernet + IPv4
	// headers (34 bytes), so truncation is probed from there on.
	for _, n := range []int{34, 38, 40, 53} {
		cases["truncated to "+itoa(n)] = full[:n]
	}
	badIHL := bytes.Clone(full)
	badIHL[14] = 0x44 // IHL 4 < 5
	cases["ihl below 5"] = badIHL
	longLen := bytes.Clone(full)
	longLen[16], longLen[17] = 0x05, 0xdc // tot_len 1500 > packet
	cases["tot_len beyond packet"] = longLen
	badDoff := bytes.Clone(full)
	badDoff[14+20+12] = 0x30 // TCP data offset 3 < 5
	cases["tcp doff below 5"] = badDoff

	for name, in := range cases {
		ret, out, err := e.objs.XvsTcIngress.Test(in)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if ret != tcActOK || !bytes.Equal(in, out) {
			t.Errorf("%s: ret %d, packet changed=%v", name, ret, !bytes.Equal(in, out))
		}
	}
}

func itoa(n int) string {
	return string(rune('0'+n/10)) + string(rune('0'+n%10))
}

// TestPrivPacketFragments: the first fragment carries the ports and is
// translated in full; later fragments follow it (address only).
func TestPrivPacketFragments(t *testing.T) {
	e := oneService(t, model.UDP, 53, backend1)
	first := packet(t, client, vip, l4{proto: model.UDP, sport: 5353, dport: 53, ipFlags: layers.IPv4MoreFragments, id: 77, payload: bytes.Repeat([]byte("a"), 64)})
	ret, out := e.run(t, first)
	d := decode(t, out)
	// gopacket does not decode L4 inside fragments: read the port here.
	dport := uint16(out[36])<<8 | uint16(out[37])
	if ret != tcActOK || d.dst.Addr() != backend1.Addr() || dport != backend1.Port() {
		t.Fatalf("first fragment: ret %d dst %s:%d", ret, d.dst.Addr(), dport)
	}
	if !d.checksumsOK {
		t.Fatal(d.checksumNote)
	}
	// A later fragment: offset 9 (72 bytes), same id, no UDP header.
	later := packet(t, client, vip, l4{proto: model.UDP, sport: 0, dport: 0, fragOffset: 9, id: 77})
	ret, out = e.run(t, later)
	ld := decode(t, out)
	if ret != tcActOK || ld.dst.Addr() != backend1.Addr() || !ld.checksumsOK {
		t.Fatalf("later fragment: ret %d dst %s checksums %v", ret, ld.dst.Addr(), ld.checksumsOK)
	}
	// Its payload (where the UDP header would be) is not touched.
	if !bytes.Equal(out[34:], later[34:]) {
		t.Fatal("later fragment payload was modified")
	}
	// A later fragment of a flow we never saw passes untouched.
	stray := packet(t, client, vip, l4{proto: model.UDP, fragOffset: 9, id: 78})
	if ret, out := e.run(t, stray); ret != tcActOK || !bytes.Equal(out, stray) {
		t.Fatal("unknown fragment was modified")
	}
}

func ctEntry(t *testing.T, e *env, src, dst netip.AddrPort, proto model.Protocol) (xbpf.CtEntry, bool) {
	var k xbpf.CtKey
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(k.Saddr[:], s4[:])
	copy(k.Daddr[:], d4[:])
	k.Sport, k.Dport = be16(src.Port()), be16(dst.Port())
	k.Proto, k.Family = uint8(proto), xbpf.FamilyIPv4
	var v xbpf.CtEntry
	// Established flows' table first, then the unreplied one.
	if err := e.objs.XvsConntrack.Lookup(&k, &v); err == nil {
		return v, true
	}
	err := e.objs.XvsCtUnreplied.Lookup(&k, &v)
	return v, err == nil
}

func be16(p uint16) uint16 { return p>>8 | p<<8 }

func monoNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// TestPrivPacketTCPStates: one state per flow, moved by packets of both
// directions through netfilter's states, each with its timeout; a
// half-closed flow lives for CLOSE_WAIT's hour while the server talks; a
// new SYN on a closed flow chooses again.
func TestPrivPacketTCPStates(t *testing.T) {
	e := oneService(t, model.TCP, 80, backend1)
	cl := netip.AddrPortFrom(client, 41000)
	fe := netip.AddrPortFrom(vip, 80)
	fwd := func(f l4) { e.run(t, packet(t, client, vip, f)) }
	rev := func(f l4) { e.run(t, packet(t, backend1.Addr(), client, f)) }
	c2s := l4{proto: model.TCP, sport: 41000, dport: 80}
	s2c := l4{proto: model.TCP, sport: 8080, dport: 41000}
	with := func(f l4, mod func(*l4)) l4 { mod(&f); return f }
	want := func(step string, state xbpf.CtState, timeout time.Duration) {
		t.Helper()
		c, ok := ctEntry(t, e, cl, fe, model.TCP)
		if !ok {
			t.Fatalf("%s: no flow", step)
		}
		if xbpf.CtState(c.State) != state {
			t.Fatalf("%s: state %v, want %v", step, xbpf.CtState(c.State), state)
		}
		left := time.Duration(c.Expires - monoNow(t))
		if left > timeout || left < timeout-5*time.Second {
			t.Fatalf("%s: expires in %v, want %v", step, left, timeout)
		}
	}

	fwd(with(c2s, func(f *l4) { f.syn = true }))
	want("SYN", xbpf.XvsXvsCtStateXVS_CT_SYN_SENT, 120*time.Second)
	rev(with(s2c, func(f *l4) { f.syn, f.ack = true, true }))
	want("SYN-ACK", xbpf.XvsXvsCtStateXVS_CT_SYN_RECV, 60*time.Second)
	fwd(with(c2s, func(f *l4) { f.ack = true }))
	want("ACK", xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED, 24*time.Hour)
	// The client half-closes; the server acknowledges and goes on.
	fwd(with(c2s, func(f *l4) { f.fin, f.ack = true, true }))
	want("client FIN", xbpf.XvsXvsCtStateXVS_CT_FIN_WAIT, 120*time.Second)
	rev(with(s2c, func(f *l4) { f.ack = true }))
	want("server ACK of the FIN", xbpf.XvsXvsCtStateXVS_CT_CLOSE_WAIT, time.Hour)
	for range 3 {
		rev(with(s2c, func(f *l4) { f.ack, f.payload = true, []byte("more data") }))
		fwd(with(c2s, func(f *l4) { f.ack = true }))
	}
	want("half-closed stream", xbpf.XvsXvsCtStateXVS_CT_CLOSE_WAIT, time.Hour)
	rev(with(s2c, func(f *l4) { f.fin, f.ack = true, true }))
	want("server FIN", xbpf.XvsXvsCtStateXVS_CT_LAST_ACK, 30*time.Second)
	fwd(with(c2s, func(f *l4) { f.ack = true }))
	want("last ACK", xbpf.XvsXvsCtStateXVS_CT_TIME_WAIT, 120*time.Second)
	// The reply entry carries no state of its own.
	if r, ok := ctEntry(t, e, backend1, cl, model.TCP); !ok || r.State != 0 || r.Expires != 0 {
		t.Fatalf("reply entry %+v (present %v): want one without state or expiry", r, ok)
	}
	// The client reuses its port: a new flow, chosen again.
	ret, out := e.run(t, packet(t, client, vip, with(c2s, func(f *l4) { f.syn = true })))
	if ret != tcActOK || decode(t, out).dst != backend1 {
		t.Fatalf("SYN on a TIME_WAIT flow: ret %d", ret)
	}
	want("port reuse", xbpf.XvsXvsCtStateXVS_CT_SYN_SENT, 120*time.Second)
	// A RST from the server closes the flow for both directions.
	rev(with(s2c, func(f *l4) { f.rst = true }))
	want("server RST", xbpf.XvsXvsCtStateXVS_CT_CLOSE, 10*time.Second)

	// A RST to the VIP without any flow: invalid, dropped.
	ret, _ = e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 42000, dport: 80, rst: true}))
	if ret != tcActShot {
		t.Fatalf("stray RST: ret %d, want TC_ACT_SHOT", ret)
	}
	// A RST inside a flow is forwarded (and closes it).
	e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 43000, dport: 80, syn: true}))
	ret, out = e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 43000, dport: 80, rst: true}))
	if ret != tcActOK || decode(t, out).dst != backend1 {
		t.Fatalf("in-flow RST: ret %d", ret)
	}
	c, _ := ctEntry(t, e, netip.AddrPortFrom(client, 43000), fe, model.TCP)
	if xbpf.CtState(c.State) != xbpf.XvsXvsCtStateXVS_CT_CLOSE {
		t.Fatalf("RST did not close the flow: %+v", c)
	}
}

// TestPrivPacketReplyEntryClash: frontends that pick the same pod for one
// client port would need the same reply entry; each later flow gets
// another source port of the client (as netfilter resolves the clash)
// instead of overwriting the first one's way back. Those ports come from
// the clash range (1024-65535, the node's ephemeral range out), not the
// masquerade range, here a single port, which the first remap would have
// used up.
func TestPrivPacketReplyEntryClash(t *testing.T) {
	e := newEnvMaps(t, loader.DefaultConfig(), reconcile.Config{SNATPortMin: 61000, SNATPortMax: 61000})
	ephLo, ephHi, err := reconcile.EphemeralPorts()
	if err != nil {
		t.Fatal(err)
	}
	vips := []netip.Addr{vip, netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("172.30.0.12")}
	var sps []*model.ServicePort
	for i, v := range vips {
		sps = append(sps, clusterIPService(fmt.Sprintf("s%d", i), v, 80, model.UDP, backend1))
	}
	e.sync(t, sps...)
	q := l4{proto: model.UDP, sport: 5000, dport: 80, payload: []byte("q")}
	var srcs []netip.AddrPort
	for i, v := range vips {
		_, out := e.run(t, packet(t, client, v, q))
		d := decode(t, out)
		if i == 0 && d.src != netip.AddrPortFrom(client, 5000) {
			t.Fatalf("first flow from %s, want the client's own port", d.src)
		}
		if i > 0 {
			p := d.src.Port()
			if d.src.Addr() != client || p < 1024 || p == 61000 || (p >= ephLo && p <= ephHi) || slices.Contains(srcs, d.src) {
				t.Fatalf("flow %d from %s: want another port of the client, 1024-65535 outside %d-%d, not %v", i, d.src, ephLo, ephHi, srcs)
			}
		}
		srcs = append(srcs, d.src)
	}
	for i, to := range srcs {
		_, out := e.run(t, packet(t, backend1.Addr(), client, l4{proto: model.UDP, sport: 8080, dport: to.Port(), payload: []byte("a")}))
		d := decode(t, out)
		if d.src != netip.AddrPortFrom(vips[i], 80) || d.dst != netip.AddrPortFrom(client, 5000) || !d.checksumsOK {
			t.Fatalf("reply to %s: %s -> %s, want %s -> client:5000", to, d.src, d.dst, vips[i])
		}
	}
}

// TestPrivPacketReject: a Service without endpoints answers a TCP SYN with
// a RST and a UDP datagram with ICMP port unreachable, from the VIP, back
// out of the interface it came in on.
func TestPrivPacketReject(t *testing.T) {
	e := newEnv(t, loader.DefaultConfig())
	e.sync(t, clusterIPService("empty-tcp", vip, 80, model.TCP), clusterIPService("empty-udp", vip, 53, model.UDP))

	ret, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 40000, dport: 80, syn: true}))
	if ret != tcActRedirect {
		t.Fatalf("TCP reject: ret %d, want TC_ACT_REDIRECT", ret)
	}
	d := decode(t, out)
	if d.tcp == nil || !d.tcp.RST || !d.tcp.ACK || d.tcp.Ack != 1001 {
		t.Fatalf("not a RST|ACK acknowledging the SYN: %+v", d.tcp)
	}
	if d.src != netip.AddrPortFrom(vip, 80) || d.dst != netip.AddrPortFrom(client, 40000) || !d.checksumsOK {
		t.Fatalf("RST %s -> %s checksums %v %s", d.src, d.dst, d.checksumsOK, d.checksumNote)
	}
	if !bytes.Equal(out[0:6], clientMAC) {
		t.Fatalf("RST goes to %x, want the client's MAC", out[0:6])
	}

	in := packet(t, client, vip, l4{proto: model.UDP, sport: 5353, dport: 53, payload: bytes.Repeat([]byte("q"), 40)})
	ret, out = e.run(t, in)
	if ret != tcActRedirect {
		t.Fatalf("UDP reject: ret %d", ret)
	}
	d = decode(t, out)
	if d.icmp == nil || d.icmp.TypeCode != layers.CreateICMPv4TypeCode(3, 3) {
		t.Fatalf("not ICMP port unreachable: %+v", d.icmp)
	}
	if d.src.Addr() != vip || d.dst.Addr() != client || !d.checksumsOK {
		t.Fatalf("ICMP %s -> %s checksums %v %s", d.src, d.dst, d.checksumsOK, d.checksumNote)
	}
	// It quotes the offending IP header and the first 8 bytes after it.
	if quote := out[14+20+8:]; !bytes.Equal(quote, in[14:14+28]) {
		t.Fatalf("quote %x, want %x", quote, in[14:14+28])
	}
}

// TestPrivPacketEndpointRemoved: removing a backend leaves its established
// flow in place (as conntrack does) while new flows avoid it.
func TestPrivPacketEndpointRemoved(t *testing.T) {
	e := newEnv(t, loader.DefaultConfig())
	e.sync(t, clusterIPService("web", vip, 80, model.TCP, backend1))
	e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 45000, dport: 80, syn: true}))
	e.sync(t, clusterIPService("web", vip, 80, model.TCP, backend2))
	_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 45000, dport: 80, ack: true}))
	if got := decode(t, out).dst; got != backend1 {
		t.Fatalf("established flow moved to %s", got)
	}
	for i := range 20 {
		_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: uint16(46000 + i), dport: 80, syn: true}))
		if got := decode(t, out).dst; got != backend2 {
			t.Fatalf("new flow went to removed backend %s", got)
		}
	}
}
