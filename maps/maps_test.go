package maps

import (
	"net/netip"
	"testing"
)

func TestEncodeAddr(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "::ffff:10.1.2.3", "2001:db8::1"} {
		a := netip.MustParseAddr(s)
		b, fam := EncodeAddr(a)
		if got := DecodeAddr(b, fam); got != a.Unmap() {
			t.Errorf("%s: round trip gave %s", s, got)
		}
		if a.Unmap().Is4() && (fam != 4 || b[4] != 0 || b[15] != 0) {
			t.Errorf("%s: IPv4 must use the first four bytes only: %v fam %d", s, b, fam)
		}
	}
}

func TestPortByteOrder(t *testing.T) {
	// 80 = 0x0050 travels as bytes 00 50: read as a little-endian u16
	// that is 0x5000.
	if got := Htons(80); got != 0x5000 {
		t.Fatalf("htons(80) = %#x", got)
	}
	if Ntohs(Htons(8080)) != 8080 {
		t.Fatal("ntohs(htons(x)) != x")
	}
}
