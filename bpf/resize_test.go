package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// TestPrivPacketConntrackMidResize: while the conntrack tables are resized
// (the old ones in the old slots, new empty ones in use, nothing copied
// yet), every open flow keeps its backend both ways, its entries are
// copied into the new tables on first use and stay in the old ones, and
// new flows go to the new tables only.
func TestPrivPacketConntrackMidResize(t *testing.T) {
	e := oneService(t, model.TCP, 80, backend1, backend2)
	const flows = 40
	chosen := map[uint16]netip.AddrPort{}
	for i := range flows {
		sport := uint16(42000 + i)
		_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: sport, dport: 80, syn: true}))
		be := decode(t, out).dst
		chosen[sport] = be
		e.run(t, packet(t, be.Addr(), client, l4{proto: model.TCP, sport: be.Port(), dport: sport, syn: true, ack: true}))
		e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: sport, dport: 80, ack: true}))
	}
	// Half the flows reply-less (unreplied table): SYNs only.
	for i := range flows / 2 {
		sport := uint16(43000 + i)
		_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: sport, dport: 80, syn: true}))
		chosen[sport] = decode(t, out).dst
	}
	spread := map[netip.AddrPort]bool{}
	for _, be := range chosen {
		spread[be] = true
	}
	if len(spread) != 2 {
		t.Fatalf("%d flows reached %v: the test needs both backends to tell a flow that moved", len(chosen), spread)
	}

	oldEst, oldUnr := e.objs.XvsConntrack, e.objs.XvsCtUnreplied
	spec, err := xbpf.LoadXvs()
	if err != nil {
		t.Fatal(err)
	}
	// As the loader makes them: with the entry's BTF, which Linux 6.1
	// requires of every map in the slots alike.
	newTable := func(size uint32) *ebpf.Map {
		ms := spec.Maps[xbpf.XvsMapXvsConntrack].Copy()
		ms.MaxEntries, ms.Pinning = size, ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	newEst, newUnr := newTable(2*oldEst.MaxEntries()), newTable(2*oldUnr.MaxEntries())
	slots := e.objs.XvsCtTables
	for _, s := range []struct {
		slot uint32
		m    *ebpf.Map
	}{
		{uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_ESTABLISHED + xbpf.XvsXvsCtSlotXVS_CT_OLD), oldEst},
		{uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_UNREPLIED + xbpf.XvsXvsCtSlotXVS_CT_OLD), oldUnr},
		{uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_ESTABLISHED), newEst},
		{uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_UNREPLIED), newUnr},
	} {
		if err := slots.Update(s.slot, s.m, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	count := func(m *ebpf.Map) int {
		n := 0
		var k xbpf.CtKey
		var v xbpf.CtEntry
		for it := m.Iterate(); it.Next(&k, &v); {
			n++
		}
		return n
	}
	oldEst0, oldUnr0 := count(oldEst), count(oldUnr)
	if oldEst0 != 2*flows || oldUnr0 != flows {
		t.Fatalf("before: %d established and %d unreplied entries, want %d and %d", oldEst0, oldUnr0, 2*flows, flows)
	}

	for sport, be := range chosen {
		ret, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: sport, dport: 80, syn: sport >= 43000, ack: sport < 43000, payload: []byte("data")}))
		if ret != tcActOK {
			t.Fatalf("flow from port %d mid-resize: ret %d", sport, ret)
		}
		if got := decode(t, out).dst; got != be {
			t.Fatalf("flow from port %d moved from %s to %s mid-resize", sport, be, got)
		}
		ret, out = e.run(t, packet(t, be.Addr(), client, l4{proto: model.TCP, sport: be.Port(), dport: sport, ack: true, syn: sport >= 43000}))
		r := decode(t, out)
		if ret != tcActOK || r.src != netip.AddrPortFrom(vip, 80) || !r.checksumsOK {
			t.Fatalf("reply to port %d mid-resize: ret %d, %s -> %s (%s)", sport, ret, r.src, r.dst, r.checksumNote)
		}
	}
	// Every flow now has both entries in the new established table (the
	// unreplied ones were promoted by their first reply). The old
	// established table is as it was; the promoted flows left the old
	// unreplied table (a promotion deletes there, in both generations).
	if n := count(newEst); n != 2*len(chosen) {
		t.Fatalf("new established table: %d entries, want %d (two per flow)", n, 2*len(chosen))
	}
	if n, u := count(oldEst), count(oldUnr); n != oldEst0 || u != 0 || count(newUnr) != 0 {
		t.Fatalf("old tables: %d established and %d unreplied entries, want %d and 0; new unreplied %d, want 0", n, u, oldEst0, count(newUnr))
	}
	// A new flow starts in the new tables only.
	_, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 44000, dport: 80, syn: true}))
	if !isBackend(decode(t, out).dst, backend1, backend2) {
		t.Fatal("a new flow mid-resize was not balanced")
	}
	if n := count(newUnr); n != 2 {
		t.Fatalf("new unreplied table: %d entries, want the new flow's 2", n)
	}
	if n, u := count(oldEst), count(oldUnr); n != oldEst0 || u != 0 {
		t.Fatalf("a new flow wrote to the old tables: %d established and %d unreplied entries", n, u)
	}
}
