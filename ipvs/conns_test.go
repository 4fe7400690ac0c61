package ipvs

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/model"
)

// TestParseConns: /proc/net/ip_vs_conn as the kernel prints it
// (ip_vs_conn_seq_show), IPv4 in hex and IPv6 in %pI6, templates too.
func TestParseConns(t *testing.T) {
	const proc = `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP C0000214 A01E AC1E000A 0050 0AF4000B 1F90 ESTABLISHED    899
UDP C0000214 D431 AC1E000A 0035 0AF4000C 1F90 UDP            299
TCP 2001:0db8:0000:0000:0000:0000:0000:0002 A01F fd00:0096:0000:0000:0000:0000:0000:000a 0050 fd00:0244:0000:0000:0000:0000:0000:000b 1F90 TIME_WAIT       59
IP  C0000214 0000 00000001 0000 0AF4000B 0000 NONE           300
TCP C0000215 0000 AC1E000A 0050 0AF4000C 1F90 NONE           10799
`
	got, err := ParseConns(strings.NewReader(proc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Conn{
		{model.TCP, netip.MustParseAddrPort("192.0.2.20:40990"), netip.MustParseAddrPort("172.30.0.10:80"), netip.MustParseAddrPort("10.244.0.11:8080"), "ESTABLISHED", 899 * time.Second},
		{model.UDP, netip.MustParseAddrPort("192.0.2.20:54321"), netip.MustParseAddrPort("172.30.0.10:53"), netip.MustParseAddrPort("10.244.0.12:8080"), "UDP", 299 * time.Second},
		{model.TCP, netip.MustParseAddrPort("[2001:db8::2]:40991"), netip.MustParseAddrPort("[fd00:96::a]:80"), netip.MustParseAddrPort("[fd00:244::b]:8080"), "TIME_WAIT", 59 * time.Second},
		// A persistence template (ClientIP affinity): client port 0. The
		// firewall-mark template before it (another tool's) is left out.
		{model.TCP, netip.MustParseAddrPort("192.0.2.21:0"), netip.MustParseAddrPort("172.30.0.10:80"), netip.MustParseAddrPort("10.244.0.12:8080"), "NONE", 10799 * time.Second},
	}
	if len(got) != len(want) {
		t.Fatalf("%d connections, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i+2, got[i], want[i])
		}
	}
	if _, err := ParseConns(strings.NewReader("header\nTCP C0000214 zz\n")); err == nil {
		t.Error("a short line parsed")
	}
}
