package conformance

import (
	"net/netip"
	"testing"
)

// TestICMPWatchMatches: only a destination unreachable quoting our own
// INIT (addresses, SCTP, ports) counts as a REJECT.
func TestICMPWatchMatches(t *testing.T) {
	src, dst := netip.MustParseAddrPort("10.0.1.1:40000"), netip.MustParseAddrPort("172.30.0.1:9999")
	w4 := &icmpWatch{src: src, dst: dst}
	quoted4 := func(proto byte, s, d netip.AddrPort) []byte {
		q := make([]byte, 20+8)
		q[0], q[9] = 0x45, proto
		copy(q[12:16], s.Addr().AsSlice())
		copy(q[16:20], d.Addr().AsSlice())
		q[20], q[21], q[22], q[23] = byte(s.Port()>>8), byte(s.Port()), byte(d.Port()>>8), byte(d.Port())
		return q
	}
	msg4 := func(typ byte, q []byte) []byte {
		b := make([]byte, 20+8, 20+8+len(q))
		b[0], b[20] = 0x45, typ
		return append(b, q...)
	}
	for name, c := range map[string]struct {
		b    []byte
		want bool
	}{
		"ours":            {msg4(3, quoted4(132, src, dst)), true},
		"echo reply":      {msg4(0, quoted4(132, src, dst)), false},
		"TCP":             {msg4(3, quoted4(6, src, dst)), false},
		"other port":      {msg4(3, quoted4(132, netip.AddrPortFrom(src.Addr(), 40001), dst)), false},
		"other dest":      {msg4(3, quoted4(132, src, netip.MustParseAddrPort("172.30.0.2:9999"))), false},
		"truncated quote": {msg4(3, quoted4(132, src, dst)[:22]), false},
		"short":           {[]byte{0x45, 0}, false},
	} {
		if got := w4.matches(c.b); got != c.want {
			t.Errorf("IPv4 %s: %v, want %v", name, got, c.want)
		}
	}

	src6, dst6 := netip.MustParseAddrPort("[fd00::1]:40000"), netip.MustParseAddrPort("[fd00:30::1]:9999")
	w6 := &icmpWatch{v6: true, src: src6, dst: dst6}
	msg6 := func(typ, next byte) []byte {
		b := make([]byte, 8+40+4)
		b[0] = typ
		q := b[8:]
		q[6] = next
		copy(q[8:24], src6.Addr().AsSlice())
		copy(q[24:40], dst6.Addr().AsSlice())
		q[40], q[41], q[42], q[43] = byte(src6.Port()>>8), byte(src6.Port()), byte(dst6.Port()>>8), byte(dst6.Port())
		return b
	}
	if !w6.matches(msg6(1, 132)) || w6.matches(msg6(2, 132)) || w6.matches(msg6(1, 17)) {
		t.Error("IPv6: want only destination unreachable quoting SCTP to match")
	}
}
