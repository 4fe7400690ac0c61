package bpf_test

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// TestPrivExplainAgreesWithProgram: `xvs explain` answers with the
// datapath's own program run over copies of the pinned maps. Thousands of
// random packets (clients in and out of the cluster, every frontend kind,
// wrong ports, addresses no Service has, new and established flows, TCP
// and UDP) are explained and then sent through the real program on the
// real maps: the two agree on what happens (translate, drop, reject,
// pass) and, for a translation, on the backend, the source address and
// whether the client's port is kept. The schedulers are the deterministic
// ones (maglev and source hashing on the tuple, round robin, whose cursor
// the copies carry in step with the maps).
func TestPrivExplainAgreesWithProgram(t *testing.T) {
	e := newEnv(t, loader.DefaultConfig())
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	web := webService(local, netip.MustParseAddrPort("10.244.1.12:8080"))
	web.ExternalLocal = true
	web.SourceRanges = []netip.Prefix{allowed}
	web.Scheduler = "mh"
	rr := clusterIPService("rr", netip.MustParseAddr("172.30.0.20"), 53, model.UDP,
		netip.MustParseAddrPort("10.244.1.2:53"), netip.MustParseAddrPort("10.244.2.3:53"), netip.MustParseAddrPort("10.244.3.4:53"))
	rr.Scheduler = "rr"
	sh := clusterIPService("sh", netip.MustParseAddr("172.30.0.21"), 443, model.TCP,
		netip.MustParseAddrPort("10.244.1.2:8443"), netip.MustParseAddrPort("10.244.2.3:8443"))
	sh.Scheduler = "sh"
	empty := clusterIPService("empty", netip.MustParseAddr("172.30.0.22"), 80, model.TCP)
	e.syncState(t, false, web, rr, sh, empty)

	x, err := maps.NewExplainer(e.objs.Config().PinPath)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()

	type dst struct {
		to    netip.AddrPort
		proto model.Protocol
	}
	dsts := []dst{
		{netip.AddrPortFrom(vip, 80), model.TCP},
		{netip.AddrPortFrom(vip, 81), model.TCP}, // wrong port: reject
		{netip.AddrPortFrom(vip, 80), model.UDP}, // no UDP frontend: reject
		{netip.AddrPortFrom(nodeIP, 30080), model.TCP},
		{netip.AddrPortFrom(extIP, 80), model.TCP},
		{netip.AddrPortFrom(lbIP, 80), model.TCP},
		{netip.MustParseAddrPort("172.30.0.20:53"), model.UDP},
		{netip.MustParseAddrPort("172.30.0.21:443"), model.TCP},
		{netip.MustParseAddrPort("172.30.0.22:80"), model.TCP}, // no endpoints: reject
		{netip.MustParseAddrPort("172.30.9.9:80"), model.TCP},  // unallocated: drop
		{netip.MustParseAddrPort("198.51.100.99:80"), model.TCP},
	}
	clients := []netip.Addr{podCli, netip.MustParseAddr("10.244.7.8"), client, netip.MustParseAddr("192.0.2.5"),
		netip.MustParseAddr("192.0.2.200"), netip.MustParseAddr("203.0.113.77")}
	rng := rand.New(rand.NewPCG(1, 2))
	type flow struct {
		from netip.AddrPort
		d    dst
	}
	var open []flow
	seen := map[string]int{}
	for i := range 2000 {
		f := flow{netip.AddrPortFrom(clients[rng.IntN(len(clients))], uint16(20000+rng.IntN(40000))), dsts[rng.IntN(len(dsts))]}
		established := false
		if len(open) > 0 && rng.IntN(4) == 0 {
			f, established = open[rng.IntN(len(open))], true
		}
		p := model.ExplainPacket{From: f.from, To: f.d.to, Proto: f.d.proto, Established: established && f.d.proto == model.TCP}
		ex, err := x.Explain(p)
		if err != nil {
			t.Fatal(err)
		}
		in := packet(t, f.from.Addr(), f.d.to.Addr(), l4{proto: f.d.proto, sport: f.from.Port(), dport: f.d.to.Port(),
			syn: f.d.proto == model.TCP && !p.Established, ack: p.Established, payload: []byte("xvs-expl")})
		ret, out := e.run(t, in)
		got := "pass"
		switch {
		case ret == tcActShot:
			got = "drop"
		case ret == tcActRedirect:
			got = "reject"
		case !bytes.Equal(in, out):
			got = "translate"
		}
		if got != ex.Action {
			t.Fatalf("packet %d %+v: explain says %s (%s), the program did %s", i, p, ex.Action, ex.Verdict, got)
		}
		seen[ex.Action+" "+ex.Verdict]++
		if got != "translate" {
			continue
		}
		d := decode(t, out)
		if d.dst != ex.Backend || d.src.Addr() != ex.Source.Addr() {
			t.Fatalf("packet %d %+v: explain says %s -> %s (%+v), the program sent %s -> %s", i, p, ex.Source, ex.Backend, ex, d.src, d.dst)
		}
		if (ex.Masquerade == "") != (d.src == f.from) {
			t.Fatalf("packet %d %+v: explain says masquerade %q, the program sent it from %s", i, p, ex.Masquerade, d.src)
		}
		if !established {
			open = append(open, f)
		}
	}
	t.Logf("2000 packets, explain and the program agreed on every one: %v", seen)
	for _, want := range []string{"translate forward_new", "translate forward_established", "drop drop_source_range",
		"reject reject_wrong_port", "reject reject_no_endpoints", "drop drop_unallocated_service_ip", "pass pass"} {
		if seen[want] == 0 {
			t.Errorf("no packet was explained as %q: %v", want, seen)
		}
	}
}
