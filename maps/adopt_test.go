package maps

import (
	"net/netip"
	"testing"
	"time"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// TestAdopt: connections kube-proxy translated become xvs flows on their
// backend, as flow_new would have written them; what xvs cannot carry on
// (not its frontend, a backend gone, the node's own address, a
// masqueraded flow) is skipped and counted, and nothing of its own is
// overwritten.
func TestAdopt(t *testing.T) {
	ap := netip.MustParseAddrPort
	web := svcPort("web", []model.Frontend{clusterIP("172.30.0.10", 80)}, "10.244.1.2:8080", "10.244.2.3:8080", "192.168.50.2:8080")
	flow := func(client, frontend, backend, replyTo string) AdoptedFlow {
		return AdoptedFlow{Proto: model.TCP, Client: ap(client), Frontend: ap(frontend), Backend: ap(backend), ReplyTo: ap(replyTo), Remaining: time.Hour}
	}
	plain := flow("10.244.3.4:40000", "172.30.0.10:80", "10.244.1.2:8080", "10.244.3.4:40000")
	masqKept := flow("192.0.2.10:40001", "172.30.0.10:80", "10.244.2.3:8080", "192.168.50.2:40001")
	masqMoved := flow("192.0.2.10:40002", "172.30.0.10:80", "10.244.2.3:8080", "192.168.50.2:51000")
	foreign := flow("10.244.3.4:40003", "10.96.0.1:443", "192.0.2.9:6443", "10.244.3.4:40003")
	gone := flow("10.244.3.4:40004", "172.30.0.10:80", "10.244.9.9:8080", "10.244.3.4:40004")
	host := flow("10.244.3.4:40005", "172.30.0.10:80", "192.168.50.2:8080", "10.244.3.4:40005")
	flows := []AdoptedFlow{plain, masqKept, masqMoved, foreign, gone, host}

	for _, tc := range []struct {
		name    string
		cfg     Config
		adopted []AdoptedFlow
		skipped map[string]int
		flags   uint16 // of the plain flow's entries, beyond REPLY
	}{
		{"netfilter", Config{NetfilterMark: 0x4000}, []AdoptedFlow{plain},
			map[string]int{AdoptMasqueraded: 2, AdoptNotServed: 1, AdoptNoBackend: 1, AdoptHostBackend: 1},
			adoptedFlags},
		{"bypass", Config{}, []AdoptedFlow{plain},
			map[string]int{AdoptMasqueraded: 2, AdoptNotServed: 1, AdoptNoBackend: 1, AdoptHostBackend: 1},
			adoptedFlags},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, s := memDatapath(t, tc.cfg)
			if err := memSync(t, d, web); err != nil {
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
			svcID, _ := d.svcIDs.lookup(frontendKey{addr: netip.MustParseAddr("172.30.0.10"), port: 80, proto: model.TCP})
			beID := d.backends[newBackendKey(netip.MustParseAddr("10.244.1.2"), 8080, model.TCP)].id
			now, _ := monotonicNow()
			fk, _, rk, _ := adoptedEntries(plain, svcID, beID, tc.flags, now)
			fe, ok := ct.m[fk]
			if !ok || fe.BackendId != beID || fe.SvcId != svcID || decodeAddr(fe.NatAddr, fk.Family) != plain.Backend.Addr() ||
				ntohs(fe.NatPort) != 8080 || fe.Flags != tc.flags || xbpf.CtState(fe.State) != xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED ||
				fe.Expires < now+uint64(59*time.Minute) || fe.Expires > now+uint64(61*time.Minute) {
				t.Errorf("forward entry %+v (present %v)", fe, ok)
			}
			re, ok := ct.m[rk]
			if !ok || re.Flags != tc.flags|uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) || decodeAddr(re.NatAddr, rk.Family) != plain.Frontend.Addr() ||
				ntohs(re.NatPort) != 80 || decodeAddr(re.SnatAddr, rk.Family) != plain.Client.Addr() || ntohs(re.SnatPort) != 40000 {
				t.Errorf("reply entry %+v (present %v)", re, ok)
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
