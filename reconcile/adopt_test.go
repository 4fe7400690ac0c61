package reconcile

import (
	"net/netip"
	"testing"
	"time"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// TestAdopt: connections kube-proxy translated become xvs flows on their
// backend, as flow_new would have written them; what xvs cannot carry on
// (not its frontend, a backend gone, the node's own address, a
// masqueraded UDP flow) is skipped and counted, and nothing of its own is
// overwritten.
func TestAdopt(t *testing.T) {
	ap := netip.MustParseAddrPort
	web := svcPort("web", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080", "10.244.2.3:8080", "192.168.50.2:8080")
	dns := svcPort("dns", []model.Frontend{{Kind: model.ClusterIP, Addr: netip.MustParseAddr("172.30.0.10"), Port: 53, Proto: model.UDP}}, "10.244.2.3:8080")
	dns.Name.Protocol = model.UDP
	flow := func(client, frontend, backend, replyTo string) AdoptedFlow {
		return AdoptedFlow{Proto: model.TCP, Client: ap(client), Frontend: ap(frontend), Backend: ap(backend), ReplyTo: ap(replyTo), Remaining: time.Hour}
	}
	plain := flow("10.244.3.4:40000", "172.30.0.10:80", "10.244.1.2:8080", "10.244.3.4:40000")
	masqKept := flow("192.0.2.10:40001", "172.30.0.10:80", "10.244.2.3:8080", "192.168.50.2:40001")
	masqMoved := flow("192.0.2.10:40002", "172.30.0.10:80", "10.244.2.3:8080", "192.168.50.2:51000")
	foreign := flow("10.244.3.4:40003", "10.96.0.1:443", "192.0.2.9:6443", "10.244.3.4:40003")
	gone := flow("10.244.3.4:40004", "172.30.0.10:80", "10.244.9.9:8080", "10.244.3.4:40004")
	host := flow("10.244.3.4:40005", "172.30.0.10:80", "192.168.50.2:8080", "10.244.3.4:40005")
	masqUDP := flow("192.0.2.10:5353", "172.30.0.10:53", "10.244.2.3:8080", "192.168.50.2:5353")
	masqUDP.Proto = model.UDP
	flows := []AdoptedFlow{plain, masqKept, masqMoved, foreign, gone, host, masqUDP}

	for _, tc := range []struct {
		name    string
		cfg     Config
		adopted []AdoptedFlow
		skipped map[string]int
		flags   uint16 // of the plain flow's entries, beyond REPLY
	}{
		{"netfilter", Config{NetfilterMark: 0x4000}, []AdoptedFlow{plain, masqKept, masqMoved},
			map[string]int{AdoptMasqueraded: 1, AdoptNotServed: 1, AdoptNoBackend: 1, AdoptHostBackend: 1},
			adoptedFlags},
		{"bypass", Config{}, []AdoptedFlow{plain, masqKept, masqMoved},
			map[string]int{AdoptMasqueraded: 1, AdoptNotServed: 1, AdoptNoBackend: 1, AdoptHostBackend: 1},
			adoptedFlags},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, s := memDatapath(t, tc.cfg)
			if err := memSync(t, d, web, dns); err != nil {
				t.Fatal(err)
			}
			res, err := d.Adopt(flows)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Adopted) != len(tc.adopted) || len(res.Skipped) != len(tc.skipped) {
				t.Fatalf("adopted %v, skipped %v; want %v and %v", res.Adopted, res.Skipped, tc.adopted, tc.skipped)
			}
			for i := range tc.adopted {
				if res.Adopted[i] != tc.adopted[i] {
					t.Errorf("adopted[%d] = %v, want %v", i, res.Adopted[i], tc.adopted[i])
				}
			}
			for why, n := range tc.skipped {
				if res.Skipped[why] != n {
					t.Errorf("skipped %s: %d, want %d (%v)", why, res.Skipped[why], n, res.Skipped)
				}
			}
			ct := s.conntrack[0].(*memMap[xbpf.CtKey, xbpf.CtEntry])
			if len(ct.m) != 2*len(tc.adopted) {
				t.Fatalf("conntrack holds %d entries, want %d", len(ct.m), 2*len(tc.adopted))
			}
			// The plain flow, entry by entry.
			svcID, _ := d.svcIDs.lookup(maps.FrontendKey{Addr: netip.MustParseAddr("172.30.0.10"), Port: 80, Proto: model.TCP})
			plainBE, _ := d.backends.get(maps.NewBackendKey(netip.MustParseAddr("10.244.1.2"), 8080, model.TCP))
			beID := plainBE.id
			now, _ := maps.MonotonicNow()
			fk, _, rk, _ := adoptedEntries(plain, svcID, beID, now)
			fe, ok := ct.m[fk]
			if !ok || fe.BackendId != beID || fe.SvcId != svcID || maps.DecodeAddr(fe.NatAddr, fk.Family) != plain.Backend.Addr() ||
				maps.Ntohs(fe.NatPort) != 8080 || fe.Flags != tc.flags || xbpf.CtState(fe.State) != xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED ||
				fe.Expires < now+uint64(59*time.Minute) || fe.Expires > now+uint64(61*time.Minute) {
				t.Errorf("forward entry %+v (present %v)", fe, ok)
			}
			re, ok := ct.m[rk]
			if !ok || re.Flags != tc.flags|uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) || maps.DecodeAddr(re.NatAddr, rk.Family) != plain.Frontend.Addr() ||
				maps.Ntohs(re.NatPort) != 80 || maps.DecodeAddr(re.SnatAddr, rk.Family) != plain.Client.Addr() || maps.Ntohs(re.SnatPort) != 40000 {
				t.Errorf("reply entry %+v (present %v)", re, ok)
			}
			// A masqueraded connection keeps its masquerade address and
			// port; its reply entry is keyed by them.
			masqBE, _ := d.backends.get(maps.NewBackendKey(netip.MustParseAddr("10.244.2.3"), 8080, model.TCP))
			mbe := masqBE.id
			mfk, _, mrk, _ := adoptedEntries(masqMoved, svcID, mbe, now)
			snat := tc.flags | uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT)
			if me, ok := ct.m[mfk]; !ok || me.Flags != snat || maps.DecodeAddr(me.SnatAddr, mfk.Family) != masqMoved.ReplyTo.Addr() || maps.Ntohs(me.SnatPort) != 51000 {
				t.Errorf("masqueraded forward entry %+v (present %v)", me, ok)
			}
			if maps.DecodeAddr(mrk.Daddr, mrk.Family) != masqMoved.ReplyTo.Addr() || maps.Ntohs(mrk.Dport) != 51000 {
				t.Errorf("masqueraded reply key %+v, want to %s", mrk, masqMoved.ReplyTo)
			}
			if re, ok := ct.m[mrk]; !ok || re.Flags != snat|uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) || maps.DecodeAddr(re.SnatAddr, mrk.Family) != masqMoved.Client.Addr() || maps.Ntohs(re.SnatPort) != 40002 {
				t.Errorf("masqueraded reply entry %+v (present %v)", re, ok)
			}
			// Adopting again overwrites nothing.
			ct.m[fk] = xbpf.CtEntry{BackendId: 99}
			again, err := d.Adopt([]AdoptedFlow{plain})
			if err != nil || len(again.Adopted) != 0 || again.Skipped[AdoptAlreadyExists] != 1 || ct.m[fk].BackendId != 99 {
				t.Errorf("second adoption: %+v %v, entry %+v", again, err, ct.m[fk])
			}
		})
	}
}

// TestAdoptAtNextSync: the first sync writes the adopted flows before the
// heads that make the Service visible, so no packet of theirs meets the
// Service without its flow.
func TestAdoptAtNextSync(t *testing.T) {
	ap := netip.MustParseAddrPort
	d, s := memDatapath(t, Config{NetfilterMark: 0x4000})
	web := svcPort("web", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080")
	f := AdoptedFlow{Proto: model.TCP, Client: ap("10.244.3.4:40000"), Frontend: ap("172.30.0.10:80"),
		Backend: ap("10.244.1.2:8080"), ReplyTo: ap("10.244.3.4:40000"), Remaining: time.Hour}
	d.AdoptAtNextSync([]AdoptedFlow{f})
	if res, _ := d.Adopted(); res != nil {
		t.Fatalf("adopted before the sync: %+v", res)
	}
	if err := memSync(t, d, web); err != nil {
		t.Fatal(err)
	}
	res, err := d.Adopted()
	if err != nil || res == nil || len(res.Adopted) != 1 {
		t.Fatalf("after the sync: %+v %v", res, err)
	}
	adopt, head := s.log.index("add", "conntrack", ""), s.log.index("put", "services", "head")
	if adopt < 0 || head < 0 || adopt > head {
		t.Fatalf("conntrack entries added at %d, the head written at %d: %v", adopt, head, s.log.ops)
	}
	// Only once.
	s.log.ops = nil
	if err := memSync(t, d, web); err != nil {
		t.Fatal(err)
	}
	if s.log.index("add", "conntrack", "") >= 0 {
		t.Errorf("a second sync adopted again: %v", s.log.ops)
	}
}
