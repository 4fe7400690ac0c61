package reconcile

import (
	"hash/maphash"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
)

// fillFlows writes n TCP flows client -> VIP -> backend into the
// established conntrack table, both entries each, expiring at expires
// (monotonic ns), and returns their forward keys. Calls with different
// bases write different flows.
func fillFlows(t testing.TB, m *maps.Maps, base byte, n int, expires uint64) []xbpf.CtKey {
	t.Helper()
	vip := [16]byte{10, 96, 0, 1}
	backend := [16]byte{10, 244, 0, 11}
	var keys, rkeys []xbpf.CtKey
	var vals, rvals []xbpf.CtEntry
	for i := range n {
		client := [16]byte{198, 18, base, byte(i >> 16)}
		sport := uint16(i)
		k := xbpf.CtKey{Saddr: client, Daddr: vip, Sport: sport, Dport: maps.Htons(80), Proto: 6, Family: xbpf.FamilyIPv4}
		e := xbpf.CtEntry{Expires: expires, BackendId: 1, SvcId: 1, NatAddr: backend, NatPort: maps.Htons(8080), State: uint8(xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED)}
		rk := xbpf.CtKey{Saddr: backend, Daddr: client, Sport: maps.Htons(8080), Dport: sport, Proto: 6, Family: xbpf.FamilyIPv4}
		re := xbpf.CtEntry{Expires: expires, BackendId: 1, SvcId: 1, NatAddr: vip, NatPort: maps.Htons(80), SnatAddr: client, SnatPort: sport,
			Flags: uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY)}
		keys, vals = append(keys, k), append(vals, e)
		rkeys, rvals = append(rkeys, rk), append(rvals, re)
	}
	if err := maps.UpdateMany(m.Conntrack, keys, vals); err != nil {
		t.Fatal(err)
	}
	if err := maps.UpdateMany(m.Conntrack, rkeys, rvals); err != nil {
		t.Fatal(err)
	}
	return keys
}

// reapClock is the kernel's monotonic time now, and the grace a test
// reaps with. The clock starts at boot: a freshly booted VM may not yet be
// two graces old, and "expired two graces ago" would wrap around to the
// far future (a live flow), so the grace is shortened to fit the time
// since boot instead.
func reapClock(t testing.TB) (uint64, time.Duration) {
	t.Helper()
	now, err := maps.MonotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	grace := ReapGrace
	if now < uint64(4*grace) {
		grace = time.Duration(now / 4)
	}
	return now, grace
}

// TestPrivWalkBatched: the batched walk sees every entry once, as the
// per-key iterator does, across many batches.
func TestPrivWalkBatched(t *testing.T) {
	objs, _ := loadForTest(t)
	defer objs.Close()
	m := maps.FromObjects(objs)
	n := 3*maps.BatchChunk + 17
	fillFlows(t, m, 0, n, 1<<62)
	count := func(w func(func(*xbpf.CtKey, *xbpf.CtEntry)) error) map[xbpf.CtKey]int {
		seen := map[xbpf.CtKey]int{}
		if err := w(func(k *xbpf.CtKey, _ *xbpf.CtEntry) { seen[*k]++ }); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	batched := count(func(fn func(*xbpf.CtKey, *xbpf.CtEntry)) error { return maps.Walk(m.Conntrack, fn) })
	single := count(func(fn func(*xbpf.CtKey, *xbpf.CtEntry)) error { return maps.WalkOneByOne(m.Conntrack, fn) })
	if len(batched) != 2*n || len(single) != 2*n {
		t.Fatalf("batched walk saw %d entries, the iterator %d, want %d", len(batched), len(single), 2*n)
	}
	for k, c := range batched {
		if c != 1 || single[k] != 1 {
			t.Fatalf("entry %v seen %d times batched, %d by the iterator", k, c, single[k])
		}
	}
}

// TestPrivReapLiveAndDead: a pass over live and expired flows deletes
// exactly the expired ones' two entries and the reply entries whose flow
// is gone, and keeps a masqueraded flow's reply entry.
func TestPrivReapLiveAndDead(t *testing.T) {
	m, dp, _ := datapathForTest(t)
	now, grace := reapClock(t)
	live := fillFlows(t, m, 1, 5000, now+uint64(time.Hour))
	dead := fillFlows(t, m, 2, 7000, now-uint64(2*grace))
	// Expired, but within the grace: left alone.
	graced := fillFlows(t, m, 3, 300, now-uint64(grace/2))
	// A live masqueraded flow: its reply entry goes to the node's
	// address, which only the forward entry knows.
	vip, backend, client, node := [16]byte{10, 96, 0, 2}, [16]byte{10, 244, 0, 12}, [16]byte{203, 0, 113, 7}, [16]byte{192, 168, 50, 2}
	mk := xbpf.CtKey{Saddr: client, Daddr: vip, Sport: maps.Htons(40000), Dport: maps.Htons(80), Proto: 6, Family: xbpf.FamilyIPv4}
	me := xbpf.CtEntry{Expires: now + uint64(time.Hour), NatAddr: backend, NatPort: maps.Htons(8080), SnatAddr: node, SnatPort: maps.Htons(1234),
		Flags: uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT)}
	mrk := xbpf.CtKey{Saddr: backend, Daddr: node, Sport: maps.Htons(8080), Dport: maps.Htons(1234), Proto: 6, Family: xbpf.FamilyIPv4}
	mre := xbpf.CtEntry{Expires: now + uint64(time.Hour), NatAddr: vip, NatPort: maps.Htons(80), SnatAddr: client, SnatPort: maps.Htons(40000),
		Flags: uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY)}
	// An orphaned reply entry: its flow is gone.
	ork := xbpf.CtKey{Saddr: backend, Daddr: client, Sport: maps.Htons(8080), Dport: maps.Htons(40001), Proto: 6, Family: xbpf.FamilyIPv4}
	ore := xbpf.CtEntry{Expires: now + uint64(time.Hour), NatAddr: vip, NatPort: maps.Htons(80), SnatAddr: client, SnatPort: maps.Htons(40001),
		Flags: uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY)}
	if err := maps.UpdateMany(m.Conntrack, []xbpf.CtKey{mk, mrk, ork}, []xbpf.CtEntry{me, mre, ore}); err != nil {
		t.Fatal(err)
	}
	n, err := dp.Reap(grace)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*len(dead)+1 {
		t.Fatalf("reaped %d entries, want %d (the dead flows' and the orphan)", n, 2*len(dead)+1)
	}
	left := map[xbpf.CtKey]bool{}
	if err := maps.Walk(m.Conntrack, func(k *xbpf.CtKey, _ *xbpf.CtEntry) { left[*k] = true }); err != nil {
		t.Fatal(err)
	}
	if len(left) != 2*(len(live)+len(graced))+2 {
		t.Fatalf("%d entries left, want %d", len(left), 2*(len(live)+len(graced))+2)
	}
	if !left[mk] || !left[mrk] || left[ork] {
		t.Fatalf("masqueraded flow kept %v, its reply %v; orphan kept %v", left[mk], left[mrk], left[ork])
	}
	for _, k := range append(live, graced...) {
		if !left[k] {
			t.Fatalf("live flow %v was reaped", k)
		}
	}

	// The fingerprints alone (no map lookups) keep the live flows' reply
	// entries, plain and masqueraded, and let the orphan go.
	prints := liveFlows{seed: maphash.MakeSeed()}
	if _, err := scanTable(m.Conntrack, now, grace, &prints); err != nil {
		t.Fatal(err)
	}
	slices.Sort(prints.prints)
	pk := live[0]
	prk := xbpf.CtKey{Saddr: [16]byte{10, 244, 0, 11}, Daddr: pk.Saddr, Sport: maps.Htons(8080), Dport: pk.Sport, Proto: 6, Family: xbpf.FamilyIPv4}
	pre := xbpf.CtEntry{NatAddr: pk.Daddr, NatPort: pk.Dport, SnatAddr: pk.Saddr, SnatPort: pk.Sport, Flags: uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY)}
	if !prints.mayLive(prk, pre) || !prints.mayLive(mrk, mre) || prints.mayLive(ork, ore) {
		t.Fatalf("fingerprints: plain flow %v, masqueraded %v, orphan %v; want true, true, false",
			prints.mayLive(prk, pre), prints.mayLive(mrk, mre), prints.mayLive(ork, ore))
	}
}

// BenchmarkPrivReap: one reaper pass over a table of 100k live flows (200k
// entries), the agent's steady state on a busy node: what the pass costs
// per entry.
func BenchmarkPrivReap(b *testing.B) {
	m, dp, _ := datapathForTest(b)
	now, err := maps.MonotonicNow()
	if err != nil {
		b.Fatal(err)
	}
	const flows = 100000
	fillFlows(b, m, 1, flows, now+uint64(time.Hour))
	b.ResetTimer()
	for range b.N {
		if n, err := dp.Reap(ReapGrace); err != nil || n != 0 {
			b.Fatalf("reaped %d: %v", n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(2*flows), "ns/entry")
}

// TestPrivReapTakesWhatItChecked: the datapath begins a new flow on an
// expired flow's tuple at the worst moment, after the pass read the old
// flow and just before it deletes it. The new flow stays, and the old
// flow's least-connection count, which the datapath released when it
// replaced the flow, is not released again: the backend is still counted
// as holding the new connection. A reaper that looks the entry up and then
// deletes it by key deletes the new flow and releases the count twice.
func TestPrivReapTakesWhatItChecked(t *testing.T) {
	m, dp, _ := datapathForTest(t)
	now, grace := reapClock(t)
	held := uint32(xbpf.XvsXvsCtFlagsXVS_CT_F_HELD)
	dead := fillFlows(t, m, 4, 2, now-uint64(2*grace))
	for _, k := range dead {
		var e xbpf.CtEntry
		if err := m.Conntrack.Lookup(&k, &e); err != nil {
			t.Fatal(err)
		}
		e.Flags |= uint16(held)
		if err := m.Conntrack.Update(&k, &e, 0); err != nil {
			t.Fatal(err)
		}
	}
	backend := uint32(1)
	// The datapath counted both flows when it opened them.
	if err := m.BackendHeld.Update(&backend, &xbpf.Conns{Active: 2}, 0); err != nil {
		t.Fatal(err)
	}
	reused := dead[0]
	var fresh xbpf.CtEntry
	beforeTake = func(ct *ebpf.Map, k xbpf.CtKey) {
		if k != reused {
			return
		}
		// flow_retire: the old flow's count is released and the new
		// flow's taken (held stays at 2), and the entry is rewritten.
		if err := ct.Lookup(&k, &fresh); err != nil {
			t.Error(err)
			return
		}
		fresh.Expires = now + uint64(time.Hour)
		fresh.State = uint8(xbpf.XvsXvsCtStateXVS_CT_SYN_RECV)
		if err := ct.Update(&k, &fresh, 0); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { beforeTake = nil })
	n, err := dp.Reap(grace)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("reaped %d entries, want 2 (the untouched dead flow's)", n)
	}
	var got xbpf.CtEntry
	if err := m.Conntrack.Lookup(&reused, &got); err != nil || got != fresh {
		t.Errorf("the new flow on the reused tuple: %+v, %v; want %+v", got, err, fresh)
	}
	var reaped xbpf.Conns
	if err := m.BackendReaped.Lookup(&backend, &reaped); err != nil {
		t.Fatal(err)
	}
	if reaped != (xbpf.Conns{Active: 1}) {
		t.Errorf("reaped counts %+v, want one active connection (the untouched flow's): the backend holds %d connection(s) by the schedulers' count, want 1",
			reaped, 2-int(reaped.Active))
	}
}
