package bpf_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// packet6 builds an Ethernet/IPv6 packet, with a fragment header when
// frag is set (offset in 8-byte units, more fragments), carrying TCP or UDP
// with valid checksums.
func packet6(t testing.TB, src, dst netip.Addr, p l4, frag *fragHdr) []byte {
	t.Helper()
	proto := layers.IPProtocolTCP
	if p.proto == model.UDP {
		proto = layers.IPProtocolUDP
	}
	if frag == nil {
		return packet6Behind(t, src, dst, p, proto, nil)
	}
	fh := []byte{byte(proto), 0, byte(frag.offset >> 5), byte(frag.offset<<3) | boolByte(frag.more), 0, 0, 0, byte(frag.id)}
	return packet6Behind(t, src, dst, p, layers.IPProtocolIPv6Fragment, fh)
}

// packet6Behind is packet6 with the L4 header behind hand-built extension
// headers (hdrs; first: the protocol number of the first of them, or of the
// L4 header when there are none; the last naming TCP or UDP).
func packet6Behind(t testing.TB, src, dst netip.Addr, p l4, first layers.IPProtocol, hdrs []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nodeMAC, EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), NextHeader: layers.IPProtocolTCP}
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	var l4l gopacket.SerializableLayer
	if p.proto == model.UDP {
		ip.NextHeader = layers.IPProtocolUDP
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		udp.SetNetworkLayerForChecksum(ip)
		l4l = udp
	} else {
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), SYN: p.syn, ACK: p.ack, Seq: 1000, Window: 65535}
		tcp.SetNetworkLayerForChecksum(ip)
		l4l = tcp
	}
	// The L4 header and payload with their checksum over the pseudo
	// header, then behind the extension headers.
	seg := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(seg, opts, l4l, gopacket.Payload(p.payload)); err != nil {
		t.Fatal(err)
	}
	ip.NextHeader = first
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, gopacket.Payload(append(slices.Clone(hdrs), seg.Bytes()...))); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// fragHdr is an IPv6 Fragment header: offset in 8-byte units.
type fragHdr struct {
	offset uint16
	more   bool
	id     uint8
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func ipv6Of(t testing.TB, b []byte) (src, dst netip.AddrPort) {
	t.Helper()
	pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	ip, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	if !ok {
		t.Fatalf("not IPv6: %v", pkt)
	}
	s, _ := netip.AddrFromSlice(ip.SrcIP)
	d, _ := netip.AddrFromSlice(ip.DstIP)
	var sp, dp uint16
	if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
		sp, dp = uint16(tcp.SrcPort), uint16(tcp.DstPort)
	}
	if udp, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		sp, dp = uint16(udp.SrcPort), uint16(udp.DstPort)
	}
	return netip.AddrPortFrom(s, sp), netip.AddrPortFrom(d, dp)
}

// TestPrivPacketIPv6: TCP and UDP to an IPv6 ClusterIP are DNATed, also
// behind a fragment header (the first fragment of a datagram).
func TestPrivPacketIPv6(t *testing.T) {
	vip6 := netip.MustParseAddr("fd00:30::10")
	cl6 := netip.MustParseAddr("fd00:10:1::100")
	be6 := netip.MustParseAddrPort("[fd00:10:2::1]:8080")
	e := newEnv(t, loader.DefaultConfig())
	e.sync(t, clusterIPService("tcp6", vip6, 80, model.TCP, be6), clusterIPService("udp6", vip6, 53, model.UDP, be6))

	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"TCP SYN", packet6(t, cl6, vip6, l4{proto: model.TCP, sport: 40000, dport: 80, syn: true}, nil)},
		{"UDP", packet6(t, cl6, vip6, l4{proto: model.UDP, sport: 40001, dport: 53, payload: []byte("query")}, nil)},
		// Hop-by-hop options (a PadN), then destination options (a
		// PadN), then TCP: the parser walks both.
		{"TCP behind hop-by-hop and destination options", packet6Behind(t, cl6, vip6, l4{proto: model.TCP, sport: 40003, dport: 80, syn: true},
			layers.IPProtocolIPv6HopByHop, []byte{60, 0, 1, 4, 0, 0, 0, 0, 6, 0, 1, 4, 0, 0, 0, 0})},
		{"UDP first fragment", packet6(t, cl6, vip6, l4{proto: model.UDP, sport: 40002, dport: 53, payload: make([]byte, 64)},
			&fragHdr{more: true, id: 7})},
	} {
		ret, out := e.run(t, c.pkt)
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("%s: ret %d", c.name, ret)
		}
		if _, dst := ipv6Of(t, out); dst.Addr() != be6.Addr() {
			snap, _ := e.m.Read(true)
			var seen []string
			for v, st := range snap.Verdicts {
				if st.PacketsIn > 0 {
					seen = append(seen, fmt.Sprintf("%s=%d", v, st.PacketsIn))
				}
			}
			t.Fatalf("%s: sent to %s, want %s (verdicts so far: %v)", c.name, dst, be6, seen)
		}
	}
}
