package maps

import (
	"net/netip"
	"testing"
)

func TestEncodeAddr(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "::ffff:10.1.2.3", "2001:db8::1"} {
		a := netip.MustParseAddr(s)
		b, fam := encodeAddr(a)
		if got := decodeAddr(b, fam); got != a.Unmap() {
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
	if got := htons(80); got != 0x5000 {
		t.Fatalf("htons(80) = %#x", got)
	}
	if ntohs(htons(8080)) != 8080 {
		t.Fatal("ntohs(htons(x)) != x")
	}
}

func TestIDAlloc(t *testing.T) {
	a := newIDAlloc[string](4) // IDs 1..3
	id1, fresh, _ := a.get("a")
	if !fresh || id1 != 1 {
		t.Fatalf("first id %d fresh %v", id1, fresh)
	}
	if again, fresh, _ := a.get("a"); again != id1 || fresh {
		t.Fatal("an ID must stay with its key")
	}
	a.get("b")
	a.get("c")
	if _, _, err := a.get("d"); err == nil {
		t.Fatal("exhaustion must be an error")
	}
	a.release("b")
	if id, fresh, err := a.get("d"); err != nil || !fresh || id != 2 {
		t.Fatalf("released ID not reused: %d %v %v", id, fresh, err)
	}
	r := newIDAlloc[string](100)
	r.restore("x", 42)
	if id, fresh, _ := r.get("x"); id != 42 || fresh {
		t.Fatal("restored ID not kept")
	}
	if id, _, _ := r.get("y"); id != 43 {
		t.Fatalf("allocation after restore gave %d, want 43", id)
	}
}
