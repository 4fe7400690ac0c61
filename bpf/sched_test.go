package bpf_test

import (
	"github.com/cilium/ebpf"
	xbpf "github.com/xvs-lb/xvs/bpf"
	"net/netip"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// schedBackends are four backends of one Service.
var schedBackends = []netip.AddrPort{
	netip.MustParseAddrPort("10.244.1.2:8080"),
	netip.MustParseAddrPort("10.244.1.3:8080"),
	netip.MustParseAddrPort("10.244.1.4:8080"),
	netip.MustParseAddrPort("10.244.1.5:8080"),
}

// schedService programs one Service with the given scheduler; weights, if
// any, go to the backends in order.
func schedService(t *testing.T, sched string, weights ...uint16) (*env, *model.ServicePort) {
	t.Helper()
	e := newEnv(t, loader.DefaultConfig())
	sp := clusterIPService("web", vip, 80, model.TCP, schedBackends...)
	sp.Scheduler = sched
	for i, w := range weights {
		sp.ClusterEndpoints[i].Weight = w
	}
	e.sync(t, sp)
	return e, sp
}

// newConn sends the SYN of a new connection and returns the backend that
// the program chose.
func newConn(t *testing.T, e *env, src netip.Addr, sport uint16) netip.AddrPort {
	t.Helper()
	ret, out := e.run(t, packet(t, src, vip, l4{proto: model.TCP, sport: sport, dport: 80, syn: true}))
	if ret != tcActOK {
		t.Fatalf("SYN from %s:%d: ret %d", src, sport, ret)
	}
	return decode(t, out).dst
}

func clientN(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}) }

// TestPrivSchedRoundRobin: rr walks the slots in order, one connection
// each; wrr interleaves by weight as IPVS does.
func TestPrivSchedRoundRobin(t *testing.T) {
	e, _ := schedService(t, "rr")
	first := newConn(t, e, client, 1000)
	seen := []netip.AddrPort{first}
	for i := 1; i < 8; i++ {
		seen = append(seen, newConn(t, e, client, uint16(1000+i)))
	}
	for i := range 4 {
		if seen[i] != seen[i+4] {
			t.Fatalf("rr is not periodic over 4 backends: %v", seen)
		}
		for j := range i {
			if seen[i] == seen[j] {
				t.Fatalf("rr repeated a backend within one round: %v", seen)
			}
		}
	}

	e, _ = schedService(t, "wrr", 3, 1, 1, 1)
	count := map[netip.AddrPort]int{}
	for i := range 60 {
		count[newConn(t, e, client, uint16(2000+i))]++
	}
	// One cycle is 6 connections: 3 to the first backend, 1 each to the
	// others; 60 connections are exactly 10 cycles.
	if count[schedBackends[0]] != 30 || count[schedBackends[1]] != 10 || count[schedBackends[2]] != 10 || count[schedBackends[3]] != 10 {
		t.Fatalf("wrr 3:1:1:1 over 60 connections gave %v", count)
	}
}

// TestPrivSchedHashing: sh and mh keep a client on one backend and spread
// clients; dh keeps a destination on one backend.
func TestPrivSchedHashing(t *testing.T) {
	for _, sched := range []string{"sh", "mh"} {
		t.Run(sched, func(t *testing.T) {
			e, _ := schedService(t, sched)
			spread := map[netip.AddrPort]bool{}
			for c := range 64 {
				src := clientN(c)
				b := newConn(t, e, src, 1000)
				for p := range 5 {
					if got := newConn(t, e, src, uint16(2000+p)); got != b {
						t.Fatalf("client %s moved from %s to %s", src, b, got)
					}
				}
				spread[b] = true
			}
			if len(spread) != 4 {
				t.Fatalf("64 clients reached %d of 4 backends", len(spread))
			}
		})
	}
	e, _ := schedService(t, "dh")
	b := newConn(t, e, clientN(0), 1000)
	for c := 1; c < 20; c++ {
		if got := newConn(t, e, clientN(c), 1000); got != b {
			t.Fatalf("dh: destination moved from %s to %s", b, got)
		}
	}
}

// TestPrivSchedMaglevDisruption: removing one of N backends under mh moves
// only the clients of that backend (about 1/N of them).
func TestPrivSchedMaglevDisruption(t *testing.T) {
	e, sp := schedService(t, "mh")
	const clients = 400
	before := make([]netip.AddrPort, clients)
	for c := range clients {
		before[c] = newConn(t, e, netip.AddrFrom4([4]byte{198, 51, 100 + byte(c/250), byte(c % 250)}), 1000)
	}
	removed := sp.ClusterEndpoints[1].AddrPort()
	smaller := clusterIPService("web", vip, 80, model.TCP, schedBackends[0], schedBackends[2], schedBackends[3])
	smaller.Scheduler = "mh"
	e.sync(t, smaller)
	moved, ofRemoved := 0, 0
	for c := range clients {
		after := newConn(t, e, netip.AddrFrom4([4]byte{198, 51, 100 + byte(c/250), byte(c % 250)}), 2000)
		if after != before[c] {
			moved++
			if before[c] == removed {
				ofRemoved++
			}
		}
	}
	t.Logf("removing 1 of 4 backends moved %d of %d clients (%d of them had the removed backend)", moved, clients, ofRemoved)
	if moved != ofRemoved {
		t.Fatalf("%d clients of surviving backends moved", moved-ofRemoved)
	}
	if frac := float64(moved) / clients; frac < 0.15 || frac > 0.35 {
		t.Fatalf("moved %.2f of the clients, want about 1/4", frac)
	}
}

// TestPrivSchedLeastConn: lc sends a new connection to the backend holding
// the fewest; a closed connection gives its place back.
func TestPrivSchedLeastConn(t *testing.T) {
	e, _ := schedService(t, "lc")
	held := map[netip.AddrPort]int{}
	// Eight connections over four backends: two each.
	for i := range 8 {
		held[newConn(t, e, client, uint16(1000+i))]++
	}
	for _, b := range schedBackends {
		if held[b] != 2 {
			t.Fatalf("lc spread 8 connections as %v, want 2 each", held)
		}
	}
	// Close one connection of some backend: the next goes there.
	var closedOn netip.AddrPort
	for i := range 8 {
		b := newConnBackendOf(t, e, uint16(1000+i))
		if b != (netip.AddrPort{}) {
			closedOn = b
			e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: uint16(1000 + i), dport: 80, fin: true, ack: true}))
			break
		}
	}
	if got := newConn(t, e, client, 3000); got != closedOn {
		t.Fatalf("after a close on %s, lc chose %s", closedOn, got)
	}

	// Closed connections still count as inactive (IPVS's TIME_WAIT
	// accounting), so short sequential connections spread too.
	e, _ = schedService(t, "lc")
	seen := map[netip.AddrPort]bool{}
	for i := range 4 {
		b := newConn(t, e, client, uint16(5000+i))
		e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: uint16(5000 + i), dport: 80, fin: true, ack: true}))
		seen[b] = true
	}
	if len(seen) != 4 {
		t.Fatalf("4 sequential closed connections under lc reached %d backends, want 4", len(seen))
	}
}

// newConnBackendOf re-sends an established flow's ACK and reports the
// backend it goes to.
func newConnBackendOf(t *testing.T, e *env, sport uint16) netip.AddrPort {
	ret, out := e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: sport, dport: 80, ack: true}))
	if ret != tcActOK {
		return netip.AddrPort{}
	}
	return decode(t, out).dst
}

// TestPrivSchedAffinity: ClientIP affinity keeps a client on its backend
// whatever the scheduler says, ends after the timeout, and lets go when the
// backend leaves the Service.
func TestPrivSchedAffinity(t *testing.T) {
	e := newEnv(t, loader.DefaultConfig())
	sp := clusterIPService("web", vip, 80, model.TCP, schedBackends...)
	sp.Scheduler = "rr" // would move every connection without affinity
	sp.Affinity = model.Affinity{ClientIP: true, TimeoutSeconds: 1}
	e.sync(t, sp)
	b := newConn(t, e, client, 1000)
	for i := 1; i < 10; i++ {
		if got := newConn(t, e, client, uint16(1000+i)); got != b {
			t.Fatalf("connection %d went to %s, not the sticky %s", i, got, b)
		}
	}
	other := newConn(t, e, clientN(5), 1000)
	t.Logf("client %s sticks to %s, client %s to %s", client, b, clientN(5), other)

	// The timeout runs from the last connection: after it, rr moves on.
	time.Sleep(1100 * time.Millisecond)
	moved := false
	for i := range 4 {
		if newConn(t, e, client, uint16(2000+i)) != b {
			moved = true
		}
	}
	if !moved {
		t.Fatal("affinity outlived its 1s timeout")
	}

	// The sticky backend leaves the Service: the client is released.
	sticky := newConn(t, e, client, 3000)
	var rest []netip.AddrPort
	for _, x := range schedBackends {
		if x != sticky {
			rest = append(rest, x)
		}
	}
	smaller := clusterIPService("web", vip, 80, model.TCP, rest...)
	smaller.Scheduler, smaller.Affinity = "rr", sp.Affinity
	e.sync(t, smaller)
	if got := newConn(t, e, client, 3001); got == sticky {
		t.Fatalf("client still sent to removed backend %s", sticky)
	}
}

// TestPrivReaper: a flow that expires without closing still counted for
// the least-connection schedulers; the agent's reaper deletes its entries
// and hands its connection back.
func TestPrivReaper(t *testing.T) {
	e, _ := schedService(t, "lc")
	b := newConn(t, e, client, 1000)
	var k xbpf.CtKey
	var v xbpf.CtEntry
	type entry struct {
		table *ebpf.Map
		key   xbpf.CtKey
	}
	var keys []entry
	for _, table := range e.m.ConntrackTables() {
		it := table.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, entry{table, k})
		}
	}
	if len(keys) != 2 {
		t.Fatalf("%d conntrack entries, want 2", len(keys))
	}
	// Age both entries past their expiry.
	for _, c := range keys {
		if err := c.table.Lookup(&c.key, &v); err != nil {
			t.Fatal(err)
		}
		v.Expires = 1
		if err := c.table.Update(&c.key, &v, 0); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.dp.Reap(0)
	if err != nil || n != 2 {
		t.Fatalf("reaped %d entries (%v), want 2", n, err)
	}
	// b holds nothing again, like the others: lc takes the first slot of
	// the tie, b's (had the connection still counted, b would be last).
	if got := newConn(t, e, client, 3000); got != b {
		t.Fatalf("after the reap, lc chose %s, want %s", got, b)
	}
}

// TestPrivFullSyncRepairs: a map entry removed behind the agent's back
// stays gone through ordinary syncs (they only touch what changed) and is
// restored by a forced full sync.
func TestPrivFullSyncRepairs(t *testing.T) {
	e, sp := schedService(t, "random")
	st := &model.State{Services: map[model.ServicePortName]*model.ServicePort{sp.Name: sp}}
	if err := e.dp.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	var k xbpf.SvcKey
	var v xbpf.SvcValue
	var head xbpf.SvcKey
	it := e.m.Services.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 {
			head = k
		}
	}
	if err := e.m.Services.Delete(&head); err != nil {
		t.Fatal(err)
	}
	if err := e.dp.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Services.Lookup(&head, &v); err == nil {
		t.Fatal("an ordinary sync rewrote an unchanged Service")
	}
	e.dp.ForceFullSync()
	if err := e.dp.Sync(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Services.Lookup(&head, &v); err != nil || v.Count != 4 {
		t.Fatalf("full sync did not restore the service head: %v %+v", err, v)
	}
}
