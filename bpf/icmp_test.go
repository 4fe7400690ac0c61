package bpf_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// icmpError builds an ICMP (IPv4) or ICMPv6 error from src to dst quoting
// the packet q went as: destination unreachable, fragmentation needed (MTU
// 1400) for IPv4, packet too big for IPv6.
func icmpError(t *testing.T, src, dst netip.Addr, quote []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nodeMAC}
	var ls []gopacket.SerializableLayer
	if src.Is6() {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)}
		icmp.SetNetworkLayerForChecksum(ip)
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(append([]byte{0, 0, 0x05, 0x78}, quote...))}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded), Seq: 1400}
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(quote)}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPrivPacketICMPErrors: an ICMP or ICMPv6 error about a translated
// flow, sent by its backend or by a router on the way and quoting the
// translated packet, reaches the client (masqueraded or not) quoting the
// packet the client sent, from the frontend when the backend sent it, with
// valid checksums; so the client's socket learns the path MTU or the
// refusal. An error about a reply, from the client or a router on its side,
// reaches the backend the same way. An error quoting no flow of ours, or
// sent to another address than the quoted packet's source, passes
// untouched.
func TestPrivPacketICMPErrors(t *testing.T) {
	vip6 := netip.MustParseAddr("fd00:30::10")
	cl6 := netip.MustParseAddr("fd00:10:1::100")
	be6 := netip.MustParseAddrPort("[fd00:10:2::1]:8080")
	router4 := netip.MustParseAddr("192.0.2.254")
	router6 := netip.MustParseAddr("2001:db8:ff::fe")
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	remote := netip.MustParseAddrPort("10.244.1.12:8080")

	e := newEnv(t, loader.DefaultConfig())
	e.syncState(t, false, webService(local, remote),
		clusterIPService("udp6", vip6, 53, model.UDP, be6), clusterIPService("tcp6", vip6, 80, model.TCP, be6))

	cases := []struct {
		name     string
		proto    model.Protocol
		src      netip.Addr
		front    netip.AddrPort
		router   netip.Addr // the error's sender when not the backend
		masq     bool
		fromNode bool
		opts     int // words of IPv4 options in the quoted header; IPv6: 1 destination options, 2 and a fragment header
	}{
		{"pod to ClusterIP, error from the backend", model.TCP, podCli, netip.AddrPortFrom(vip, 80), netip.Addr{}, false, false, 0},
		{"pod to ClusterIP, error from a router", model.TCP, podCli, netip.AddrPortFrom(vip, 80), router4, false, false, 0},
		{"external to NodePort (masqueraded), error from the backend", model.TCP, client, netip.AddrPortFrom(nodeIP, 30080), netip.Addr{}, true, false, 0},
		{"external to NodePort (masqueraded), error from a router", model.TCP, client, netip.AddrPortFrom(nodeIP, 30080), router4, true, false, 0},
		{"IPv6 UDP to ClusterIP, error from the backend", model.UDP, cl6, netip.AddrPortFrom(vip6, 53), netip.Addr{}, false, false, 0},
		{"IPv6 TCP to ClusterIP, error from a router", model.TCP, cl6, netip.AddrPortFrom(vip6, 80), router6, false, false, 0},
		{"pod to ClusterIP, error from a router quoting IPv4 options", model.TCP, podCli, netip.AddrPortFrom(vip, 80), router4, false, false, 2},
		{"external to NodePort (masqueraded), error from the backend quoting 40 bytes of options", model.TCP, client, netip.AddrPortFrom(nodeIP, 30080), netip.Addr{}, true, false, 10},
		{"IPv6 TCP to ClusterIP, error from a router quoting destination options", model.TCP, cl6, netip.AddrPortFrom(vip6, 80), router6, false, false, 1},
		{"IPv6 UDP to ClusterIP, error from the backend quoting a first fragment", model.UDP, cl6, netip.AddrPortFrom(vip6, 53), netip.Addr{}, false, false, 2},
	}
	for i, c := range cases {
		sport := uint16(42000 + i)
		// quote is what the error quotes, with the case's options; the
		// translated quote must keep them, under a valid checksum.
		var sent []byte // the last quote built
		quote := func(q []byte) []byte {
			switch {
			case c.opts > 0 && c.src.Is6():
				sent = withExt6(q, c.opts > 1)
				return sent
			case c.opts > 0:
				return withOptions(q, c.opts)
			}
			return q
		}
		quoteIntact := func(what string, payload []byte) {
			if c.opts == 0 {
				return
			}
			if c.src.Is6() {
				end := 40 + 8*c.opts
				if payload[6] != sent[6] || !bytes.Equal(payload[40:end], sent[40:end]) {
					t.Fatalf("%s, %s: the quote's extension headers changed: % x", c.name, what, payload[:end])
				}
				return
			}
			hl := int(payload[0]&0xf) * 4
			if hl != 20+4*c.opts || ipChecksum(payload[:hl]) != 0 {
				t.Fatalf("%s, %s: the quoted header (%d bytes) lost its options or its checksum: % x", c.name, what, hl, payload[:hl])
			}
		}
		var pkt []byte
		if c.src.Is6() {
			pkt = packet6(t, c.src, c.front.Addr(), l4{proto: c.proto, sport: sport, dport: c.front.Port(), syn: true, payload: []byte("q")}, nil)
		} else {
			pkt = packet(t, c.src, c.front.Addr(), l4{proto: c.proto, sport: sport, dport: c.front.Port(), syn: true})
		}
		ret, out := e.run(t, pkt)
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("%s: ret %d", c.name, ret)
		}
		d, ok := parseFuzz(out)
		if !ok || d.dst == c.front {
			t.Fatalf("%s: not translated: %+v", c.name, d)
		}
		if masq := d.src.Addr() == nodeIP; masq != c.masq {
			t.Fatalf("%s: translated from %s, masquerade %v, want %v", c.name, d.src, masq, c.masq)
		}
		proto := layers.IPProtocolTCP
		if c.proto == model.UDP {
			proto = layers.IPProtocolUDP
		}
		sender := c.router
		if !sender.IsValid() {
			sender = d.dst.Addr()
		}
		ret, out = e.run(t, icmpError(t, sender, d.src.Addr(), quote(quoted(d.src.Addr(), d.dst.Addr(), proto, d.src.Port(), d.dst.Port()))))
		if ret != tcActOK {
			t.Fatalf("%s: the error's ret %d", c.name, ret)
		}
		got, ok := parseFuzz(out)
		if !ok || !got.sumsOK {
			t.Fatalf("%s: the translated error does not parse or its checksums are wrong (%s): % x", c.name, got.sumNote, out)
		}
		wantSrc := sender
		if !c.router.IsValid() {
			wantSrc = c.front.Addr()
		}
		if got.src.Addr() != wantSrc || got.dst.Addr() != c.src {
			t.Fatalf("%s: error %s -> %s, want %s -> %s", c.name, got.src.Addr(), got.dst.Addr(), wantSrc, c.src)
		}
		qp, qs, qd, ok := quoteOf(got.payload)
		if !ok || qp != proto || qs != netip.AddrPortFrom(c.src, sport) || qd != c.front {
			t.Fatalf("%s: the error quotes %v %s -> %s (ok %v), want %v %s:%d -> %s", c.name, qp, qs, qd, ok, proto, c.src, sport, c.front)
		}
		quoteIntact("about a request", got.payload)

		// An error about a reply (frontend -> client), from the client
		// or a router on its side, reaches the backend quoting the reply
		// as the backend sent it, from the masquerade address when the
		// flow is masqueraded.
		sender = c.router
		if !sender.IsValid() {
			sender = c.src
		}
		client := netip.AddrPortFrom(c.src, sport)
		ret, out = e.run(t, icmpError(t, sender, c.front.Addr(), quote(quoted(c.front.Addr(), c.src, proto, c.front.Port(), sport))))
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("%s, about a reply: ret %d", c.name, ret)
		}
		got, ok = parseFuzz(out)
		if !ok || !got.sumsOK {
			t.Fatalf("%s, about a reply: the translated error does not parse or its checksums are wrong (%s): % x", c.name, got.sumNote, out)
		}
		wantSrc = sender
		if c.masq {
			wantSrc = nodeIP
		}
		if got.src.Addr() != wantSrc || got.dst.Addr() != d.dst.Addr() {
			t.Fatalf("%s, about a reply: error %s -> %s, want %s -> %s", c.name, got.src.Addr(), got.dst.Addr(), wantSrc, d.dst.Addr())
		}
		qp, qs, qd, ok = quoteOf(got.payload)
		if !ok || qp != proto || qs != d.dst || qd != d.src || (!c.masq && qd != client) {
			t.Fatalf("%s, about a reply: the error quotes %v %s -> %s (ok %v), want %v %s -> %s", c.name, qp, qs, qd, ok, proto, d.dst, d.src)
		}
		quoteIntact("about a reply", got.payload)
	}

	// An error quoting a flow xvs does not have is not touched.
	for _, a := range [][2]netip.Addr{{remote.Addr(), podCli}, {be6.Addr(), cl6}} {
		in := icmpError(t, a[0], a[1], quoted(a[1], a[0], layers.IPProtocolTCP, 9, 8080))
		ret, out := e.run(t, in)
		if ret != tcActOK || string(out) != string(in) {
			t.Fatalf("an error about no flow (%s -> %s): ret %d, changed %v", a[0], a[1], ret, string(out) != string(in))
		}
	}
	// One about the first case's flow, but not sent to the quoted
	// packet's source (netfilter takes it for invalid).
	in := icmpError(t, client, vip, quoted(nodeIP, client, layers.IPProtocolTCP, 30080, 42002))
	if ret, out := e.run(t, in); ret != tcActOK || string(out) != string(in) {
		t.Fatalf("an error to another address than its quote's source: ret %d, changed %v", ret, string(out) != string(in))
	}
}
