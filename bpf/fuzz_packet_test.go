package bpf_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// The packet fuzzer: random and mutated packets through the tc and XDP
// programs (BPF_PROG_TEST_RUN) over a populated State, each outcome
// checked against what the State allows:
//
//   - a verdict the hook knows;
//   - traffic that concerns no frontend, no service range and no flow
//     (foreign destinations, from sources that are no backend) passes
//     untouched;
//   - a packet the programs rewrote has valid IP and L4 checksums when
//     the input had them, the same payload, and either a new destination
//     that is a backend of the frontend it was sent to (from its own source
//     or, masqueraded, from a node address), or a new source that is a
//     frontend the original source is a backend of (reverse NAT);
//   - a malformed input (truncated headers, bad lengths) is never
//     rewritten;
//   - an answer the program makes itself (a REJECT) goes back to the
//     sender, with valid checksums.
//
// The inputs: TCP with every flag combination, UDP, ICMP echo and errors
// quoting flows, other protocols, IPv4 options, fragments, IPv6, from
// pods, outside clients and backends, to frontends, node and service
// addresses, backends and strangers, on the ports in use and random ones,
// reusing a few client ports so that flows, replies and closes meet;
// then truncated, or with a random byte changed. XVS_PACKET_FUZZ sets the
// count per program (default 20,000; make fuzz-packets runs 10^6) and
// XVS_PACKET_FUZZ_SEED the seed.
func TestPrivPacketFuzz(t *testing.T) {
	n := 20000
	if s := os.Getenv("XVS_PACKET_FUZZ"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatalf("XVS_PACKET_FUZZ=%q: %v", s, err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("XVS_PACKET_FUZZ_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d packets per program, seed %d (XVS_PACKET_FUZZ_SEED to replay)", n, seed)

	w := newFuzzWorld()
	setup := func() *env {
		e := newEnv(t, loader.DefaultConfig())
		e.syncState(t, false, w.services...)
		return e
	}
	te, xe := setup(), setup()
	xdp, err := xe.objs.XDPProgram()
	switch {
	case errors.Is(err, loader.ErrXDPUnsupported):
		t.Logf("tc only: %v (the XDP program is fuzzed on kernels that run it)", err)
		xdp = nil
	case err != nil:
		t.Fatal(err)
	}
	g := &packetGen{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	var tcStats, xdpStats fuzzStats
	refused := 0
	for i := range n {
		in, note := g.next()
		ret, out, err := te.objs.XvsTcIngress.Test(in)
		if err != nil {
			// The kernel refuses to build an skb of some cut frames
			// (EINVAL): no program sees them.
			if _, ok := parseFuzz(in); !ok && errors.Is(err, unix.EINVAL) {
				refused++
				continue
			}
			t.Fatalf("packet %d (%s): tc test run: %v\n%x", i, note, err, in)
		}
		w.onForward = g.translated
		msg := w.check("tc", ret, in, out, &tcStats)
		if msg == "" {
			msg = w.checkDecision(ret, in, out, &tcStats)
		}
		w.onForward = nil
		if msg != "" {
			t.Fatalf("packet %d (%s): tc: %s\n in %x\nout %x", i, note, msg, in, out)
		}
		if xdp == nil {
			continue
		}
		xret, xout, err := xdp.Test(in)
		if err != nil {
			t.Fatalf("packet %d (%s): XDP test run: %v", i, note, err)
		}
		xout = xout[len(xout)-len(in):] // after XDP's metadata
		if msg := w.check("xdp", xret, in, xout, &xdpStats); msg != "" {
			t.Fatalf("packet %d (%s): XDP: %s\n in %x\nout %x", i, note, msg, in, xout)
		}
	}
	t.Logf("%d cut frames the kernel refused to run", refused)
	t.Logf("tc:  %s", tcStats)
	t.Logf("XDP: %s", xdpStats)
	if tcStats.forward == 0 || tcStats.reverse == 0 || tcStats.masq == 0 || tcStats.reject == 0 || tcStats.drop == 0 || tcStats.malformed == 0 || tcStats.decided == 0 {
		t.Errorf("the generator did not reach every outcome: %s", tcStats)
	}
}

type fuzzStats struct {
	untouched, forward, masq, reverse, reject, drop, malformed, corrupt int
	malformedTranslated                                                 int
	// decided: packets the reference decision judged (checkDecision).
	decided int
	// ICMP and ICMPv6 errors whose quote was translated back.
	icmpErrors int
}

func (s fuzzStats) String() string {
	return fmt.Sprintf("%d passed untouched, %d translated to a backend (%d of them masqueraded), %d reverse-translated (%d of them ICMP errors), %d answered (REJECT), %d dropped; %d malformed inputs, %d inputs with a bad checksum; %d judged by the reference decision",
		s.untouched, s.forward, s.masq, s.reverse, s.icmpErrors, s.reject, s.drop, s.malformed, s.corrupt, s.decided)
}

type fkey struct {
	proto layers.IPProtocol
	addr  netip.AddrPort
}

// fuzzWorld is the State the programs serve, and what it allows.
type fuzzWorld struct {
	services  []*model.ServicePort
	backends  map[fkey][]netip.AddrPort // frontend -> its backends
	frontOf   map[fkey][]netip.AddrPort // backend -> the frontends it serves
	addrs     []netip.Addr              // every address the State names
	ports     []uint16
	ours      []netip.Prefix // ranges the datapath owns (service CIDR, pods)
	clients   []netip.Addr
	node      netip.Addr
	backendIP map[netip.Addr]bool
	frontIP   map[netip.Addr]bool
	// flowClients: the sources of the flows translated so far (a
	// corrupted byte makes new ones).
	flowClients map[netip.Addr]bool
	// onForward hears of each forward translation (the generator's
	// replies).
	onForward func(proto layers.IPProtocol, out fuzzPacket)
}

func newFuzzWorld() *fuzzWorld {
	local, remote := netip.MustParseAddrPort("10.244.0.11:8080"), netip.MustParseAddrPort("10.244.1.12:8080")
	web := webService(local, remote)
	web.SourceRanges = []netip.Prefix{allowed}
	dnsA, dnsB := netip.MustParseAddrPort("10.244.0.21:5353"), netip.MustParseAddrPort("10.244.1.22:5353")
	dns := clusterIPService("dns", netip.MustParseAddr("172.30.0.11"), 53, model.UDP, dnsA, dnsB)
	empty := clusterIPService("empty", netip.MustParseAddr("172.30.0.12"), 80, model.TCP)
	be6 := netip.MustParseAddrPort("[fd00:10:2::1]:8080")
	v6 := clusterIPService("web6", netip.MustParseAddr("fd00:30::10"), 80, model.TCP, be6)
	w := &fuzzWorld{
		services: []*model.ServicePort{web, dns, empty, v6},
		backends: map[fkey][]netip.AddrPort{}, frontOf: map[fkey][]netip.AddrPort{},
		ports:     []uint16{80, 53, 30080, 8080, 5353, 443},
		ours:      []netip.Prefix{svcNet, podNet},
		clients:   []netip.Addr{podCli, client, netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("198.51.100.99"), netip.MustParseAddr("fd00:10:1::100")},
		node:      nodeIP,
		backendIP: map[netip.Addr]bool{},
		frontIP:   map[netip.Addr]bool{},
	}
	for _, sp := range w.services {
		for _, f := range sp.Frontends {
			k := fkey{ipProto(f.Proto), netip.AddrPortFrom(f.Addr, f.Port)}
			for _, e := range sp.ClusterEndpoints {
				w.backends[k] = append(w.backends[k], e.AddrPort())
				bk := fkey{ipProto(f.Proto), e.AddrPort()}
				w.frontOf[bk] = append(w.frontOf[bk], k.addr)
				w.backendIP[e.Addr] = true
				w.addrs = append(w.addrs, e.Addr)
			}
			w.addrs = append(w.addrs, f.Addr)
			w.frontIP[f.Addr] = true
		}
	}
	w.addrs = append(w.addrs, w.clients...)
	return w
}

func ipProto(p model.Protocol) layers.IPProtocol {
	switch p {
	case model.UDP:
		return layers.IPProtocolUDP
	case model.SCTP:
		return layers.IPProtocolSCTP
	}
	return layers.IPProtocolTCP
}

// concerns says whether the State has anything to do with a packet from
// src to dst: a frontend or backend address, a node address, a range the
// datapath owns.
func (w *fuzzWorld) concerns(src, dst netip.Addr) bool {
	if dst == w.node || w.backendIP[src] || w.backendIP[dst] || w.frontIP[dst] {
		return true
	}
	for _, p := range w.ours {
		if p.Contains(dst) || p.Contains(src) {
			return true
		}
	}
	return false
}

// isClient: a is one of the world's clients, or the source of a flow
// translated so far.
func (w *fuzzWorld) isClient(a netip.Addr) bool {
	return slices.Contains(w.clients, a) || w.flowClients[a]
}

// addrsOK judges a translation by its addresses alone, for what has no
// ports: an ICMP message (whose quoted packet is translated too, so its
// payload changes) or a later fragment. A new destination is a backend
// address behind the frontend address it was sent to, or, sent to the
// node (a masqueraded flow), a client; a new source is a frontend address
// the sender is a backend of, or the node's.
func (w *fuzzWorld) addrsOK(in, out fuzzPacket) bool {
	if out.dst.Addr() != in.dst.Addr() {
		ok := in.dst.Addr() == w.node && w.isClient(out.dst.Addr())
		for k, bes := range w.backends {
			if k.addr.Addr() == in.dst.Addr() && slices.ContainsFunc(bes, func(b netip.AddrPort) bool { return b.Addr() == out.dst.Addr() }) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	if out.src.Addr() != in.src.Addr() {
		ok := out.src.Addr() == w.node
		for k, fronts := range w.frontOf {
			if k.addr.Addr() == in.src.Addr() && slices.ContainsFunc(fronts, func(f netip.AddrPort) bool { return f.Addr() == out.src.Addr() }) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// quoteOf reads the packet an ICMP or ICMPv6 error quotes (its payload
// after the 8-byte ICMP header): protocol, source and destination.
func quoteOf(payload []byte) (proto layers.IPProtocol, src, dst netip.AddrPort, ok bool) {
	var sa, da netip.Addr
	var l4 []byte
	switch {
	case len(payload) >= 28 && payload[0]>>4 == 4 && payload[0]&0xf >= 5 && len(payload) >= int(payload[0]&0xf)*4+8:
		proto = layers.IPProtocol(payload[9])
		sa, da = netip.AddrFrom4([4]byte(payload[12:16])), netip.AddrFrom4([4]byte(payload[16:20]))
		hl := int(payload[0]&0xf) * 4
		l4 = payload[hl : hl+8]
	case len(payload) >= 48 && payload[0]>>4 == 6:
		sa, da = netip.AddrFrom16([16]byte(payload[8:24])), netip.AddrFrom16([16]byte(payload[24:40]))
		var off int
		var ok bool
		if proto, off, ok = quote6L4(payload); !ok {
			return 0, src, dst, false
		}
		l4 = payload[off : off+8]
	default:
		return 0, src, dst, false
	}
	src = netip.AddrPortFrom(sa, binary.BigEndian.Uint16(l4))
	dst = netip.AddrPortFrom(da, binary.BigEndian.Uint16(l4[2:]))
	return proto, src, dst, true
}

// quote6L4 is where the L4 header of the IPv6 packet quoted in payload
// starts, past up to four extension headers, as the datapath reads a
// quote; not ok for a later fragment, an unknown header, or fewer than 8
// bytes of L4 header.
func quote6L4(payload []byte) (layers.IPProtocol, int, bool) {
	proto, off := layers.IPProtocol(payload[6]), 40
	for range 4 {
		if proto == layers.IPProtocolTCP || proto == layers.IPProtocolUDP || len(payload) < off+8 {
			break
		}
		switch proto {
		case layers.IPProtocolIPv6HopByHop, layers.IPProtocolIPv6Routing, layers.IPProtocolIPv6Destination:
			proto, off = layers.IPProtocol(payload[off]), off+(int(payload[off+1])+1)*8
		case layers.IPProtocolIPv6Fragment:
			if binary.BigEndian.Uint16(payload[off+2:])&0xfff8 != 0 {
				return 0, 0, false
			}
			proto, off = layers.IPProtocol(payload[off]), off+8
		default:
			return 0, 0, false
		}
	}
	return proto, off, (proto == layers.IPProtocolTCP || proto == layers.IPProtocolUDP) && len(payload) >= off+8
}

// quoteOK judges a translated ICMP error by its quote. About a request:
// the packet it quoted went to a backend, and now goes to a frontend of
// that backend (whose protocol it keeps), from a client or the node.
// About a reply: it came from a frontend, and now comes from a backend of
// that frontend, to the same client or to the node (the masquerade
// address). Nothing past the quoted headers changes.
func (w *fuzzWorld) quoteOK(din, dout fuzzPacket) string {
	pin, sin, din_, ok1 := quoteOf(din.payload)
	pout, sout, dout_, ok2 := quoteOf(dout.payload)
	if !ok1 || !ok2 {
		if !bytes.Equal(din.payload, dout.payload) {
			return "an ICMP message without a quote of ours changed its payload"
		}
		return ""
	}
	if pin != pout {
		return fmt.Sprintf("the quote's protocol changed from %d to %d", pin, pout)
	}
	if sin == sout && din_ == dout_ {
		return ""
	}
	switch {
	case slices.Contains(w.backends[fkey{pout, dout_}], din_):
		// About a request: client -> backend became client -> frontend.
		if sout != sin && sin.Addr() != w.node && !w.isClient(sout.Addr()) {
			return fmt.Sprintf("the quote's source %s became %s", sin, sout)
		}
	case slices.Contains(w.backends[fkey{pin, sin}], sout):
		// About a reply: frontend -> client became backend -> client (or
		// the masquerade address).
		if dout_ != din_ && dout_.Addr() != w.node {
			return fmt.Sprintf("the quote's destination %s became %s", din_, dout_)
		}
	default:
		return fmt.Sprintf("the quote %s -> %s was translated to %s -> %s: neither a backend's frontend nor a frontend's backend", sin, din_, sout, dout_)
	}
	n := int(din.payload[0]&0xf)*4 + 8
	if sin.Addr().Is6() {
		// Extension headers stay as they were.
		_, off, _ := quote6L4(din.payload)
		if n = off + 8; !bytes.Equal(din.payload[40:off], dout.payload[40:off]) {
			return "the quoted IPv6 packet's extension headers changed"
		}
	} else {
		// The quoted header's options stay, and its checksum is updated
		// for the new addresses: right if it was right (a wrong one,
		// as netfilter's update leaves it, stays wrong).
		if !bytes.Equal(din.payload[20:n-8], dout.payload[20:n-8]) {
			return "the quoted IPv4 header's options changed"
		}
		if (ipChecksum(din.payload[:n-8]) == 0) != (ipChecksum(dout.payload[:n-8]) == 0) {
			return "the quoted IPv4 header's checksum was not updated with its addresses"
		}
	}
	if !bytes.Equal(din.payload[n:], dout.payload[n:]) {
		return "the ICMP error's payload past the quoted headers changed"
	}
	return ""
}

// withOptions inserts IPv4 options (NOPs, then end of list; 4 bytes a
// word, words of them) after the quoted IPv4 header q (quoted's), and
// sets its length fields and checksum.
func withOptions(q []byte, words int) []byte {
	opts := make([]byte, 4*words)
	for i := range opts[:len(opts)-1] {
		opts[i] = 1 // NOP
	}
	out := append(append(slices.Clone(q[:20]), opts...), q[20:]...)
	out[0] = 0x40 | byte(5+words)
	binary.BigEndian.PutUint16(out[2:], binary.BigEndian.Uint16(q[2:])+uint16(4*words))
	out[10], out[11] = 0, 0
	binary.BigEndian.PutUint16(out[10:], ipChecksum(out[:20+4*words]))
	return out
}

// withExt6 puts extension headers between the quoted IPv6 header q
// (quoted's) and its L4 header: destination options (a PadN), behind the
// header of a first fragment when frag; and sets the length and next
// header fields.
func withExt6(q []byte, frag bool) []byte {
	ext := []byte{q[6], 0, 1, 4, 0, 0, 0, 0} // next header, length 0, PadN of 4
	first := byte(60)                        // destination options
	if frag {
		// Offset 0, more fragments: the first of a datagram.
		ext = append([]byte{60, 0, 0, 1, 0xfe, 0xed, 0xfa, 0xce}, ext...)
		first = 44
	}
	out := append(append(slices.Clone(q[:40]), ext...), q[40:]...)
	out[6] = first
	binary.BigEndian.PutUint16(out[4:], binary.BigEndian.Uint16(q[4:])+uint16(len(ext)))
	return out
}

// decision is the reference decision for a packet whose fate the State
// alone decides, whatever flows came before: the first packet of a
// connection (a TCP segment with SYN only, or a UDP datagram), whole,
// unfragmented, with valid checksums and ports, to an address of the
// service ranges or a ClusterIP, from a source that is no backend (a
// backend's packet may be a reply to a flow whose client sent from a
// ClusterIP's address). To a frontend with endpoints it is
// translated (a flow of that tuple already open goes on to its backend,
// which is a translation too); to a frontend without any, or to a port a
// live ClusterIP does not serve, it is refused (REJECT); to an address of
// the service range no Service has, dropped (SEMANTICS 3.2, 3.12, 3.14).
// "" is no reference: anything else depends on flows, policies or the
// node. For tc only: XDP leaves ClusterIP traffic to tc.
func (w *fuzzWorld) decision(din fuzzPacket) string {
	if !din.sumsOK || din.firstFrag || din.laterFrag || !din.portsOK || din.src.Port() == 0 || din.dst.Port() == 0 || w.backendIP[din.src.Addr()] ||
		!(din.proto == layers.IPProtocolTCP && din.synOnly || din.proto == layers.IPProtocolUDP) {
		return ""
	}
	k := fkey{din.proto, din.dst}
	clusterIP := false
	for _, sp := range w.services {
		for _, f := range sp.Frontends {
			if f.Kind != model.ClusterIP || f.Addr != din.dst.Addr() {
				continue
			}
			clusterIP = true
			if ipProto(f.Proto) == din.proto && f.Port == din.dst.Port() {
				if len(w.backends[k]) > 0 {
					return "translate"
				}
				return "reject"
			}
		}
	}
	switch {
	case clusterIP:
		return "reject"
	case svcNet.Contains(din.dst.Addr()) && !w.frontIP[din.dst.Addr()]:
		return "drop"
	}
	return ""
}

// checkDecision compares a tc outcome with the reference decision.
func (w *fuzzWorld) checkDecision(ret uint32, in, out []byte, s *fuzzStats) string {
	din, ok := parseFuzz(in)
	if !ok {
		return ""
	}
	want := w.decision(din)
	if want == "" {
		return ""
	}
	s.decided++
	got := "translate"
	switch dout, ok := parseFuzz(out); {
	case ret == tcActShot:
		got = "drop"
	case bytes.Equal(in, out):
		got = "pass untouched"
	case ok && dout.dst.Addr() == din.src.Addr() && dout.src.Addr() == din.dst.Addr():
		got = "reject"
	}
	if got != want {
		return fmt.Sprintf("%s %s -> %s: %s, the reference decision is %s", din.proto, din.src, din.dst, got, want)
	}
	return ""
}

// check judges one outcome; "" is fine.
func (w *fuzzWorld) check(hook string, ret uint32, in, out []byte, s *fuzzStats) string {
	din, inOK := parseFuzz(in)
	if !inOK {
		s.malformed++
	} else if !din.sumsOK {
		s.corrupt++
	}
	var pass, drop, redirect bool
	if hook == "tc" {
		pass, drop, redirect = ret == tcActOK, ret == tcActShot, ret == tcActRedirect
	} else {
		pass, drop, redirect = ret == xdpPass, ret == xdpDrop, ret == 3 /* XDP_TX */ || ret == 4 /* XDP_REDIRECT */
	}
	if !pass && !drop && !redirect {
		return fmt.Sprintf("verdict %d", ret)
	}
	changed := !bytes.Equal(in, out)
	if drop {
		s.drop++
		if inOK && !w.concerns(din.src.Addr(), din.dst.Addr()) {
			return "dropped a packet that concerns no frontend, backend or owned range"
		}
		return ""
	}
	if !changed {
		s.untouched++
		return ""
	}
	dout, ok := parseFuzz(out)
	if !ok && inOK {
		return "the output does not parse"
	}
	// An answer of the program's own (a REJECT): back to the sender, from
	// the address it wrote to, with valid checksums. A malformed input
	// may get one too (its headers name a frontend's closed port).
	isICMP := func(p layers.IPProtocol) bool { return p == layers.IPProtocolICMPv4 || p == layers.IPProtocolICMPv6 }
	if ok && dout.dst.Addr() == din.src.Addr() && dout.src.Addr() == din.dst.Addr() &&
		(isICMP(dout.proto) && !isICMP(din.proto) || dout.rst && dout.src.Port() == din.dst.Port() && dout.dst.Port() == din.src.Port()) {
		if !dout.sumsOK {
			return "the answer's checksums are wrong: " + dout.sumNote
		}
		s.reject++
		return ""
	}
	if !inOK {
		return "rewrote a malformed packet"
	}
	if !w.concerns(din.src.Addr(), din.dst.Addr()) {
		// An ICMP error from a router on the way concerns the flow it
		// quotes.
		_, qs, qd, ok := quoteOf(din.payload)
		if !isICMP(din.proto) || !ok || !w.concerns(qs.Addr(), qd.Addr()) {
			return "rewrote a packet that concerns no frontend, backend or owned range"
		}
	}
	if din.sumsOK && !dout.sumsOK {
		return "the output's checksums are wrong: " + dout.sumNote
	}
	if isICMP(din.proto) || din.laterFrag {
		if !w.addrsOK(din, dout) {
			return fmt.Sprintf("%s -> %s translated to %s -> %s", din.src.Addr(), din.dst.Addr(), dout.src.Addr(), dout.dst.Addr())
		}
		if din.laterFrag && !bytes.Equal(din.payload, dout.payload) {
			return "a later fragment's payload changed"
		}
		if isICMP(din.proto) && !din.laterFrag {
			if msg := w.quoteOK(din, dout); msg != "" {
				return msg
			}
			s.icmpErrors++
		}
		s.reverse++
		return ""
	}
	if !bytes.Equal(din.payload, dout.payload) {
		return "the payload changed"
	}
	return w.checkAddrs(din, dout, s)
}

// checkAddrs judges a translation by its addresses and ports: forward to a
// backend of the frontend the packet was sent to (masqueraded from a node
// address), or reverse from a frontend the source is a backend of.
func (w *fuzzWorld) checkAddrs(din, dout fuzzPacket, s *fuzzStats) string {
	switch {
	case w.isReverseOf(din, dout):
		// A reply, from the frontend its sender is a backend of; to the
		// client (new address and port when the flow was masqueraded).
		s.reverse++
	case dout.dst != din.dst:
		bes := w.backends[fkey{din.proto, din.dst}]
		if !slices.Contains(bes, dout.dst) {
			return fmt.Sprintf("%s sent to %s, which is not a backend of it (%v)", din.dst, dout.dst, bes)
		}
		if dout.src != din.src {
			if dout.src.Addr() != w.node {
				return fmt.Sprintf("source %s rewritten to %s, not a node address", din.src, dout.src)
			}
			s.masq++
		}
		s.forward++
		if w.flowClients == nil {
			w.flowClients = map[netip.Addr]bool{}
		}
		w.flowClients[din.src.Addr()] = true
		if w.onForward != nil {
			w.onForward(din.proto, dout)
		}
	case dout.src != din.src:
		return fmt.Sprintf("source %s rewritten to %s, which is no frontend %s serves", din.src, dout.src, din.src)
	default:
		return "rewritten, but neither address nor port changed"
	}
	return ""
}

// isReverseOf: out's source is a frontend in's source serves.
func (w *fuzzWorld) isReverseOf(in, out fuzzPacket) bool {
	return slices.Contains(w.frontOf[fkey{in.proto, in.src}], out.src)
}

// fuzzPacket is what check reads of a packet.
type fuzzPacket struct {
	src, dst netip.AddrPort
	proto    layers.IPProtocol
	rst      bool
	// synOnly: a TCP segment with SYN and none of ACK, RST and FIN (the
	// first of a connection).
	synOnly bool
	payload []byte
	sumsOK  bool
	sumNote string
	// firstFrag: the first fragment of a datagram, whose L4 checksum
	// cannot be checked from it alone.
	firstFrag bool
	// portsOK: the TCP or UDP ports could be read, even if the rest of
	// the header is malformed.
	portsOK bool
	// laterFrag: a fragment after the first, without an L4 header (the
	// datapath translates it as its datagram's first fragment was).
	laterFrag bool
}

// parseFuzz parses an Ethernet frame with IPv4 or IPv6 and its L4 header,
// checking every checksum; false when the headers are malformed or cut.
func parseFuzz(b []byte) (fuzzPacket, bool) {
	var p fuzzPacket
	if len(b) < 14 {
		return p, false
	}
	var src, dst netip.Addr
	var l4 []byte
	var pseudo func(proto byte, l []byte) uint32
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		ip := b[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return p, false
		}
		ihl := int(ip[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if ihl < 20 || tot < ihl || tot > len(ip) {
			return p, false
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		p.proto = layers.IPProtocol(ip[9])
		switch frag := binary.BigEndian.Uint16(ip[6:]); {
		case frag&0x1fff != 0:
			// A later fragment: no L4 header, only its IP header to judge.
			p.sumsOK, p.payload = ipChecksum(ip[:ihl]) == 0, ip[ihl:tot]
			p.src, p.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
			p.laterFrag = true
			return p, true
		case frag&0x2000 != 0:
			p.firstFrag = true // its L4 checksum covers the whole datagram
		}
		l4 = ip[ihl:tot]
		p.sumsOK = ipChecksum(ip[:ihl]) == 0
		if !p.sumsOK {
			p.sumNote = "IPv4 header"
		}
		pseudo = func(proto byte, l []byte) uint32 {
			return sum16(ip[12:20], 0) + uint32(proto) + uint32(len(l))
		}
	case 0x86dd:
		ip := b[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return p, false
		}
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if 40+plen > len(ip) {
			return p, false
		}
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		p.proto = layers.IPProtocol(ip[6])
		if p.proto != layers.IPProtocolTCP && p.proto != layers.IPProtocolUDP && p.proto != layers.IPProtocolICMPv6 {
			// Extension headers, SCTP: not judged here, but an answer
			// to it (a REJECT) is judged by its addresses.
			p.src, p.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
			return p, false
		}
		l4 = ip[40 : 40+plen]
		p.sumsOK = true
		pseudo = func(proto byte, l []byte) uint32 {
			return sum16(ip[8:40], 0) + uint32(proto) + uint32(len(l))
		}
	default:
		return p, false
	}
	p.src, p.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0) // the ports once read
	if (p.proto == layers.IPProtocolTCP || p.proto == layers.IPProtocolUDP) && len(l4) >= 4 {
		// The ports, before the rest of the header is judged.
		p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4))
		p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
		p.portsOK = true
	}
	var sport, dport uint16
	switch p.proto {
	case layers.IPProtocolTCP:
		if len(l4) < 20 || int(l4[12]>>4)*4 < 20 || int(l4[12]>>4)*4 > len(l4) {
			return p, false
		}
		sport, dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
		p.rst = l4[13]&0x04 != 0
		p.synOnly = l4[13]&0x17 == 0x02 // SYN, without FIN, RST and ACK
		p.payload = l4[int(l4[12]>>4)*4:]
		if !p.firstFrag && fold(sum16(l4, pseudo(byte(p.proto), l4))) != 0 && p.sumsOK {
			p.sumsOK, p.sumNote = false, "TCP"
		}
	case layers.IPProtocolUDP:
		// Linux takes a UDP length below the IP payload's (and trims);
		// netfilter and the stack refuse one below 8 or past it.
		if len(l4) < 8 {
			return p, false
		}
		if ulen := int(binary.BigEndian.Uint16(l4[4:])); ulen < 8 || !p.firstFrag && ulen > len(l4) {
			return p, false
		} else if !p.firstFrag {
			l4 = l4[:ulen]
		}
		sport, dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
		p.payload = l4[8:]
		if !p.firstFrag && (l4[6] != 0 || l4[7] != 0) && fold(sum16(l4, pseudo(byte(p.proto), l4))) != 0 && p.sumsOK {
			p.sumsOK, p.sumNote = false, "UDP"
		}
	case layers.IPProtocolICMPv4:
		if len(l4) < 8 {
			return p, false
		}
		p.payload = l4[8:]
		if !p.firstFrag && ipChecksum(l4) != 0 && p.sumsOK {
			p.sumsOK, p.sumNote = false, "ICMP"
		}
	case layers.IPProtocolICMPv6:
		if len(l4) < 8 {
			return p, false
		}
		p.payload = l4[8:]
		if fold(sum16(l4, pseudo(byte(p.proto), l4))) != 0 && p.sumsOK {
			p.sumsOK, p.sumNote = false, "ICMPv6"
		}
	default:
		p.payload = l4
	}
	p.src, p.dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	return p, true
}

// packetGen makes the fuzzer's packets.
type packetGen struct {
	w   *fuzzWorld
	rng *rand.Rand
	// flows are the reverse of translations tc made (backend -> client
	// or masquerade address), for replies; the last 64.
	flows []flowTmpl
}

type flowTmpl struct {
	proto    layers.IPProtocol
	src, dst netip.AddrPort
}

// translated records a forward translation for replies.
func (g *packetGen) translated(proto layers.IPProtocol, out fuzzPacket) {
	if len(g.flows) == 64 {
		g.flows = g.flows[1:]
	}
	g.flows = append(g.flows, flowTmpl{proto, out.dst, out.src})
}

func (g *packetGen) pick(n int) int { return g.rng.IntN(n) }

func (g *packetGen) addr(v6 bool) netip.Addr {
	if v6 {
		switch g.pick(4) {
		case 0:
			return netip.MustParseAddr("fd00:30::10")
		case 1:
			return netip.MustParseAddr("fd00:10:2::1")
		case 2:
			return netip.MustParseAddr("fd00:10:1::100")
		}
		var a [16]byte
		for i := range a {
			a[i] = byte(g.rng.Uint32())
		}
		return netip.AddrFrom16(a)
	}
	switch g.pick(6) {
	case 0:
		return netip.AddrFrom4([4]byte{byte(g.rng.Uint32()), byte(g.rng.Uint32()), byte(g.rng.Uint32()), byte(g.rng.Uint32())})
	case 1:
		return netip.AddrFrom4([4]byte{172, 30, 0, byte(g.pick(20))}) // the service range
	}
	for {
		if a := g.w.addrs[g.pick(len(g.w.addrs))]; a.Is4() {
			return a
		}
	}
}

func (g *packetGen) port() uint16 {
	switch g.pick(3) {
	case 0:
		return uint16(40000 + g.pick(8)) // client ports that meet again
	case 1:
		return g.w.ports[g.pick(len(g.w.ports))]
	}
	return uint16(g.rng.Uint32())
}

// next is one packet and a note on how it was made.
func (g *packetGen) next() ([]byte, string) {
	v6 := g.pick(8) == 0
	src, dst := g.addr(v6), g.addr(v6)
	sport, dport := g.port(), g.port()
	var note string
	var forceProto layers.IPProtocol
	switch g.pick(4) {
	case 0: // to a frontend, from a client port that meets again
		fks := slices.SortedFunc(maps.Keys(g.w.backends), func(a, b fkey) int { return a.addr.Compare(b.addr) })
		k := fks[g.pick(len(fks))]
		v6 = k.addr.Addr().Is6()
		dst, dport, forceProto = k.addr.Addr(), k.addr.Port(), k.proto
		src = g.w.clients[g.pick(len(g.w.clients))]
		for src.Is6() != v6 {
			src = g.w.clients[g.pick(len(g.w.clients))]
		}
		sport = uint16(40000 + g.pick(8))
		note = "to a frontend: "
	case 1: // a reply to a flow a translation made
		if len(g.flows) > 0 {
			f := g.flows[g.pick(len(g.flows))]
			v6 = f.src.Addr().Is6()
			src, sport, dst, dport, forceProto = f.src.Addr(), f.src.Port(), f.dst.Addr(), f.dst.Port(), f.proto
			note = "a reply: "
		}
	}
	var ipl gopacket.SerializableLayer
	var netl gopacket.NetworkLayer
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nodeMAC}
	var proto layers.IPProtocol
	switch r := g.pick(10); {
	case forceProto != 0 && r < 8:
		proto = forceProto
	case r < 5:
		proto = layers.IPProtocolTCP
	case r < 8:
		proto = layers.IPProtocolUDP
	case r == 8:
		proto = layers.IPProtocolICMPv4
		if v6 {
			proto = layers.IPProtocolICMPv6
		}
	default:
		proto = layers.IPProtocol(47) // GRE: no L4 the datapath knows
	}
	// What an ICMP error quotes: the flow's protocol for a reply (an
	// error about the flow), else either.
	quoteProto := forceProto
	if quoteProto != layers.IPProtocolTCP && quoteProto != layers.IPProtocolUDP {
		quoteProto = []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP}[g.pick(2)]
	}
	if v6 {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ipl, netl = ip, ip
	} else {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: uint8(1 + g.pick(64)), Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Id: uint16(g.rng.Uint32())}
		if g.pick(10) == 0 {
			ip.Options = []layers.IPv4Option{{OptionType: 148, OptionLength: 4, OptionData: []byte{0, 0}}}
			note += "options "
		}
		if g.pick(20) == 0 {
			ip.Flags = layers.IPv4MoreFragments
			note += "first-fragment "
		} else if g.pick(40) == 0 {
			ip.FragOffset = uint16(1 + g.pick(100))
			note += "later-fragment "
		}
		ipl, netl = ip, ip
	}
	payload := make([]byte, []int{0, 0, 1, 16, 100, 512, 1400}[g.pick(7)])
	for i := range payload {
		payload[i] = byte(g.rng.Uint32())
	}
	ls := []gopacket.SerializableLayer{eth, ipl}
	switch proto {
	case layers.IPProtocolTCP:
		f := g.pick(64)
		tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: g.rng.Uint32(), Ack: g.rng.Uint32(), Window: 65535,
			SYN: f&1 != 0, ACK: f&2 != 0, FIN: f&4 != 0, RST: f&8 != 0, PSH: f&16 != 0, URG: f&32 != 0}
		if g.pick(2) == 0 { // the usual shapes, more often
			tcp.SYN, tcp.ACK, tcp.FIN, tcp.RST = []bool{true, false, false, false}[g.pick(4)], g.pick(2) == 0, g.pick(6) == 0, g.pick(10) == 0
		}
		tcp.SetNetworkLayerForChecksum(netl)
		ls = append(ls, tcp, gopacket.Payload(payload))
		note += fmt.Sprintf("TCP %s:%d -> %s:%d flags %x", src, sport, dst, dport, f)
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		udp.SetNetworkLayerForChecksum(netl)
		ls = append(ls, udp, gopacket.Payload(payload))
		note += fmt.Sprintf("UDP %s:%d -> %s:%d", src, sport, dst, dport)
	case layers.IPProtocolICMPv4:
		// An echo, or an error quoting a flow between the addresses in
		// play (the datapath translates those that quote its flows).
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: uint16(g.rng.Uint32())}
		if g.pick(2) == 0 {
			icmp.TypeCode = layers.CreateICMPv4TypeCode(3, uint8(g.pick(5)))
			payload = quoted(dst, src, quoteProto, dport, sport)
			if g.pick(4) == 0 { // a quoted header with options
				payload = withOptions(payload, 1+g.pick(10))
				note += "quote-options "
			}
		}
		ls = append(ls, icmp, gopacket.Payload(payload))
		note += fmt.Sprintf("ICMP %s -> %s %s", src, dst, icmp.TypeCode)
	case layers.IPProtocolICMPv6:
		// An echo, or an error (destination unreachable, packet too
		// big, time exceeded, parameter problem) quoting a flow.
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(128, 0)}
		if g.pick(2) == 0 {
			icmp.TypeCode = layers.CreateICMPv6TypeCode(uint8(1+g.pick(4)), 0)
			// The 4 bytes after type, code and checksum (unused, or the
			// MTU or pointer) start the payload gopacket writes.
			q := quoted(dst, src, quoteProto, dport, sport)
			if g.pick(3) == 0 {
				q = withExt6(q, g.pick(2) == 0)
				note += "quote with extension headers "
			}
			payload = append([]byte{0, 0, 5, 0}, q...)
		}
		icmp.SetNetworkLayerForChecksum(netl)
		ls = append(ls, icmp, gopacket.Payload(payload))
		note += fmt.Sprintf("ICMPv6 %s -> %s", src, dst)
	default:
		ls = append(ls, gopacket.Payload(payload))
		note += fmt.Sprintf("proto %d %s -> %s", proto, src, dst)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(err)
	}
	b := slices.Clone(buf.Bytes())
	switch g.pick(20) {
	case 0:
		b = b[:14+g.pick(len(b)-13)]
		note += " truncated"
	case 1:
		i := 14 + g.pick(len(b)-14)
		b[i] ^= byte(1 + g.pick(255))
		note += fmt.Sprintf(" byte %d changed", i)
	}
	return b, note
}

// quoted is the start of a packet from src to dst, as an ICMP error
// quotes it: the IPv4 or IPv6 header and the first 8 bytes of TCP or UDP.
func quoted(src, dst netip.Addr, proto layers.IPProtocol, sport, dport uint16) []byte {
	var ip interface {
		gopacket.SerializableLayer
		gopacket.NetworkLayer
	}
	n := 20 + 8
	if src.Is6() {
		ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		n = 40 + 8
	} else {
		ip = &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	}
	var l gopacket.SerializableLayer
	if proto == layers.IPProtocolTCP {
		tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: true, Seq: 1, Window: 65535}
		tcp.SetNetworkLayerForChecksum(ip)
		l = tcp
	} else {
		udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		udp.SetNetworkLayerForChecksum(ip)
		l = udp
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, l); err != nil {
		panic(err)
	}
	return slices.Clone(buf.Bytes()[:n])
}
