package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// TestPrivPacketConntrackPressure: with a conntrack table of 4096 entries,
// 200 established TCP flows survive 30,000 unreplied SYNs (a SYN flood, or
// a burst of connection attempts to a dead backend) and 10,000 one-shot UDP
// datagrams: unreplied flows live in a table of their own and evict only
// each other. With one table the flood evicted the established flows, whose
// next segment was then dropped as conntrack-INVALID.
func TestPrivPacketConntrackPressure(t *testing.T) {
	cfg := loader.DefaultConfig()
	cfg.ConntrackSize = 4096
	e := newEnv(t, cfg)
	e.sync(t, clusterIPService("web", vip, 80, model.TCP, backend1), clusterIPService("dns", vip, 53, model.UDP, backend1))
	const established, flood, datagrams = 200, 30000, 10000
	tcp := func(sport uint16, f func(*l4)) l4 {
		p := l4{proto: model.TCP, sport: sport, dport: 80}
		f(&p)
		return p
	}
	for i := range uint16(established) {
		port := 20000 + i
		e.run(t, packet(t, client, vip, tcp(port, func(p *l4) { p.syn = true })))
		e.run(t, packet(t, backend1.Addr(), client, l4{proto: model.TCP, sport: backend1.Port(), dport: port, syn: true, ack: true}))
		e.run(t, packet(t, client, vip, tcp(port, func(p *l4) { p.ack = true })))
	}
	for i := range flood {
		src := netip.AddrFrom4([4]byte{198, 51, 100, byte(1 + i/20000)})
		e.run(t, packet(t, src, vip, l4{proto: model.TCP, sport: uint16(1024 + i%20000), dport: 80, syn: true}))
	}
	for i := range datagrams {
		e.run(t, packet(t, client, vip, l4{proto: model.UDP, sport: uint16(30000 + i), dport: 53, payload: []byte("query")}))
	}
	// Every established flow is still known: its next segment is
	// translated, not dropped.
	for i := range uint16(established) {
		port := 20000 + i
		ret, out := e.run(t, packet(t, client, vip, tcp(port, func(p *l4) { p.ack, p.payload = true, []byte("still here") })))
		if ret != tcActOK && ret != tcActRedirect {
			t.Fatalf("flow %d: ret %d after the flood, want it forwarded", port, ret)
		}
		pk := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
		tl, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if tl == nil || uint16(tl.DstPort) != backend1.Port() {
			t.Fatalf("flow %d: not translated to the backend after the flood", port)
		}
		c, ok := ctEntry(t, e, netip.AddrPortFrom(client, port), netip.AddrPortFrom(vip, 80), model.TCP)
		if !ok || xbpf.CtState(c.State) != xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED {
			t.Fatalf("flow %d: conntrack %+v (found %v), want ESTABLISHED", port, c, ok)
		}
	}
	var k xbpf.CtKey
	var v xbpf.CtEntry
	n := 0
	it := e.m.Conntrack.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if n < 2*established {
		t.Fatalf("%d entries in the established table, want at least %d", n, 2*established)
	}
	u := 0
	it = e.m.CtUnreplied.Iterate()
	for it.Next(&k, &v) {
		u++
	}
	t.Logf("after the flood: %d entries in the established table, %d in the unreplied one (of %d)", n, u, e.m.CtUnreplied.MaxEntries())
}
