package bpf_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// XDP actions, from linux/bpf.h.
const (
	xdpDrop = 1
	xdpPass = 2
	// XVS_XDP_MAGIC, lib/xdp.h.
	xdpMagic = 0x58565344
)

// packetWithOptions is packet with a 4-byte IPv4 option (IHL 6), which
// moves the L4 header.
func packetWithOptions(t testing.TB, src, dst netip.Addr, p l4) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nodeMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{
		Version: 4, TTL: 64, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Protocol: layers.IPProtocolTCP,
		// Router alert (RFC 2113): type 148, length 4, value 0.
		Options: []layers.IPv4Option{{OptionType: 148, OptionLength: 4, OptionData: []byte{0, 0}}},
	}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), SYN: p.syn, Seq: 1000, Ack: 2000, Window: 65535}
	tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, tcp, gopacket.Payload(p.payload)); err != nil {
		t.Fatal(err)
	}
	if b := buf.Bytes(); b[14]&0x0f != 6 {
		t.Fatalf("IHL %d, want 6", b[14]&0x0f)
	}
	return buf.Bytes()
}

// TestPrivXDPSameDecision: the XDP program and the tc program parse with
// one parser and decide with one function, so the same packets, sent to
// two datapaths programmed alike (one through XDP, one through tc), come
// out the same: translated byte for byte alike (masqueraded ones to the
// same addresses, each with its own masquerade port), dropped alike,
// passed alike. What XDP leaves to tc (IPv6, fragments) passes XDP
// untouched.
func TestPrivXDPSameDecision(t *testing.T) {
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	sp := webService(local, netip.MustParseAddrPort("10.244.1.12:8080"))
	sp.ClusterEndpoints = sp.ClusterEndpoints[:1] // one backend: the choice is the same in both
	sp.SourceRanges = []netip.Prefix{allowed}
	setup := func() *env {
		e := newEnv(t, loader.DefaultConfig())
		e.syncState(t, false, sp)
		return e
	}
	xe, te := setup(), setup()
	xdp, err := xe.objs.XDPProgram()
	if err != nil {
		skipOrFatalXDP(t, err)
	}

	type step struct {
		name string
		pkt  []byte
		// What both programs do: translate (masq: to a new source port
		// of their own), drop, or pass untouched.
		want string
		masq bool
	}
	steps := []step{
		// From a pod: not masqueraded (the node detects pods by CIDR).
		{"ClusterIP SYN", packet(t, podCli, vip, l4{proto: model.TCP, sport: 40000, dport: 80, syn: true, payload: []byte("hello")}), "nat", false},
		{"ClusterIP ACK of that flow", packet(t, podCli, vip, l4{proto: model.TCP, sport: 40000, dport: 80, ack: true, payload: bytes.Repeat([]byte("x"), 1000)}), "nat", false},
		{"reply of that flow", packet(t, local.Addr(), podCli, l4{proto: model.TCP, sport: 8080, dport: 40000, syn: true, ack: true}), "nat", false},
		{"ClusterIP SYN with IP options", packetWithOptions(t, podCli, vip, l4{sport: 40001, dport: 80, syn: true, payload: []byte("opt")}), "nat", false},
		{"UDP to the ClusterIP's port (no UDP frontend)", packet(t, client, vip, l4{proto: model.UDP, sport: 40002, dport: 80}), "pass-or-reject", false},
		{"NodePort SYN, masqueraded", packet(t, client, nodeIP, l4{proto: model.TCP, sport: 40003, dport: 30080, syn: true}), "nat", true},
		{"LB IP from outside the source ranges", packet(t, netip.MustParseAddr("192.0.2.200"), lbIP, l4{proto: model.TCP, sport: 40004, dport: 80, syn: true}), "drop", false},
		{"ACK of no flow", packet(t, client, vip, l4{proto: model.TCP, sport: 40005, dport: 80, ack: true}), "drop", false},
		{"not a frontend", packet(t, client, netip.MustParseAddr("198.51.100.7"), l4{proto: model.TCP, sport: 40006, dport: 80, syn: true}), "pass", false},
	}
	for _, s := range steps {
		xret, xout, err := xdp.Test(s.pkt)
		if err != nil {
			t.Fatalf("%s: XDP test run: %v", s.name, err)
		}
		// The output starts at the frame's metadata (the mark XDP leaves
		// for tc on a translated packet).
		meta := xout[:len(xout)-len(s.pkt)]
		xout = xout[len(meta):]
		marked := len(meta) >= 4 && binary.NativeEndian.Uint32(meta) == xdpMagic
		tret, tout := te.run(t, s.pkt)
		if marked != (s.want == "nat") {
			t.Fatalf("%s: XDP metadata %x: marked %v", s.name, meta, marked)
		}
		switch s.want {
		case "nat":
			if xret != xdpPass || tret != tcActOK {
				t.Fatalf("%s: XDP %d, tc %d, want both to pass on a translated packet", s.name, xret, tret)
			}
			xd, td := decode(t, xout), decode(t, tout)
			if !xd.checksumsOK || !td.checksumsOK {
				t.Fatalf("%s: checksums: XDP %q, tc %q", s.name, xd.checksumNote, td.checksumNote)
			}
			if bytes.Equal(xout, s.pkt) {
				t.Fatalf("%s: XDP left the packet untranslated", s.name)
			}
			if !s.masq {
				if !bytes.Equal(xout, tout) {
					t.Fatalf("%s: XDP and tc differ:\n xdp %x\n  tc %x", s.name, xout, tout)
				}
				continue
			}
			if xd.src.Addr() != td.src.Addr() || xd.dst != td.dst || xd.src.Addr() != nodeIP || xd.dst != local {
				t.Fatalf("%s: XDP %s -> %s, tc %s -> %s, want both %s:* -> %s", s.name, xd.src, xd.dst, td.src, td.dst, nodeIP, local)
			}
		case "drop":
			if xret != xdpDrop || tret != tcActShot {
				t.Fatalf("%s: XDP %d, tc %d, want both to drop", s.name, xret, tret)
			}
		case "pass":
			if xret != xdpPass || !bytes.Equal(xout, s.pkt) || tret != tcActOK || !bytes.Equal(tout, s.pkt) {
				t.Fatalf("%s: XDP %d (changed %v), tc %d (changed %v), want both to pass it untouched",
					s.name, xret, !bytes.Equal(xout, s.pkt), tret, !bytes.Equal(tout, s.pkt))
			}
		case "pass-or-reject":
			// A REJECT is answered by tc: XDP hands the packet on.
			if xret != xdpPass || !bytes.Equal(xout, s.pkt) || tret != tcActRedirect {
				t.Fatalf("%s: XDP %d (changed %v), tc %d, want XDP to pass it untouched and tc to answer",
					s.name, xret, !bytes.Equal(xout, s.pkt), tret)
			}
		}
	}

	// What XDP leaves to tc passes XDP untouched, with nothing recorded.
	frag := packet(t, client, vip, l4{proto: model.UDP, sport: 5353, dport: 80, ipFlags: layers.IPv4MoreFragments, id: 9, payload: bytes.Repeat([]byte("f"), 64)})
	v6 := packet6(t, netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("2001:db8:1::10"), l4{proto: model.TCP, sport: 1, dport: 80, syn: true}, nil)
	for name, in := range map[string][]byte{"first fragment": frag, "IPv6": v6} {
		ret, out, err := xdp.Test(in)
		if err != nil {
			t.Fatal(err)
		}
		out = out[len(out)-len(in):]
		if ret != xdpPass || !bytes.Equal(in, out) {
			t.Errorf("%s: XDP %d, changed %v; want it passed untouched to tc", name, ret, !bytes.Equal(in, out))
		}
	}
}

// skipOrFatalXDP ends a test that needs the XDP program: skipped, saying
// why, on a kernel that cannot run it (loader.ErrXDPUnsupported; the 6.12
// VM of make test runs these tests), failed on any other error.
func skipOrFatalXDP(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, loader.ErrXDPUnsupported) {
		t.Skipf("SKIP (kernel): %v", err)
	}
	t.Fatal(err)
}
