package reconcile

import (
	"testing"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// portsOf walks a range as the datapath's snat_port_at does.
func portsOf(r xbpf.PortRange) []uint16 {
	var out []uint16
	for i := range uint32(r.Span) {
		p := uint32(r.Min) + i
		if r.SkipLen != 0 && p >= uint32(r.SkipMin) {
			p += uint32(r.SkipLen)
		}
		out = append(out, uint16(p))
	}
	return out
}

// TestPortRange: every port the datapath can reach is inside lo-hi and
// outside the skip, each once, and none of lo-hi outside the skip is
// missed (all in-range ports when the skip would leave nothing).
func TestPortRange(t *testing.T) {
	for _, c := range []struct{ lo, hi, skipLo, skipHi uint16 }{
		{1024, 65535, 32768, 60999},  // bypass mode's masquerade range, Linux's ephemeral range
		{32768, 65535, 32768, 60999}, // netfilter mode's
		{1024, 65535, 0, 0},
		{1024, 65535, 1000, 2000},    // a skip from below the range
		{1024, 65535, 60000, 65535},  // a skip to its end
		{40000, 50000, 32768, 60999}, // a skip over all of it: none
		{1, 65535, 1, 1},
		{5000, 4000, 0, 0},
	} {
		r := xbpf.NewPortRange(c.lo, c.hi, c.skipLo, c.skipHi)
		skipAll := max(c.skipLo, c.lo) <= c.lo && min(c.skipHi, c.hi) >= c.hi
		want := map[uint16]bool{}
		for p := uint32(c.lo); c.lo <= c.hi && p <= uint32(c.hi); p++ {
			if skipAll || c.skipLo == 0 || p < uint32(c.skipLo) || p > uint32(c.skipHi) {
				want[uint16(p)] = true
			}
		}
		got := portsOf(r)
		seen := map[uint16]bool{}
		for _, p := range got {
			if !want[p] || seen[p] {
				t.Fatalf("%+v: %+v reaches %d (in the range outside the skip: %v, twice: %v)", c, r, p, want[p], seen[p])
			}
			seen[p] = true
		}
		if len(seen) != len(want) {
			t.Fatalf("%+v: %+v reaches %d ports, want %d", c, r, len(seen), len(want))
		}
	}
	clash := xbpf.PortRanges(32768, 65535, 32768, 60999)[xbpf.XvsXvsPortRangesXVS_PORTS_CLASH]
	if clash.Span != 65535-1024+1-(60999-32768+1) {
		t.Fatalf("clash range %+v: want 1024-65535 without 32768-60999", clash)
	}
}
