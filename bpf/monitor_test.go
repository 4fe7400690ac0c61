package bpf_test

import (
	"errors"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// TestPrivMonitorEvents: a dropped or refused packet writes one event with
// the packet as it arrived, from tc and from XDP, only while a monitor has
// the events on; a packet served writes none; past the burst, the rate
// limit suppresses events and counts them.
func TestPrivMonitorEvents(t *testing.T) {
	local := netip.MustParseAddrPort("10.244.0.11:8080")
	sp := webService(local, netip.MustParseAddrPort("10.244.1.12:8080"))
	sp.SourceRanges = []netip.Prefix{allowed}
	e := newEnv(t, loader.DefaultConfig())
	e.syncState(t, false, sp)
	xdp, err := e.objs.XDPProgram()
	if err != nil {
		skipOrFatalXDP(t, err)
	}
	unallocated := packet(t, client, netip.MustParseAddr("172.30.9.9"), l4{proto: model.TCP, sport: 1111, dport: 80, syn: true})
	outsideRanges := packet(t, netip.MustParseAddr("192.0.2.200"), lbIP, l4{proto: model.TCP, sport: 2222, dport: 80, syn: true})
	served := packet(t, client, vip, l4{proto: model.TCP, sport: 3333, dport: 80, syn: true})

	// No monitor: nothing written, nothing counted.
	if ret, _ := e.run(t, unallocated); ret != tcActShot {
		t.Fatalf("unallocated service IP: ret %d, want drop", ret)
	}
	m, err := maps.OpenMonitor(e.pinPath, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	next := func() (model.MonitorEvent, bool) {
		t.Helper()
		ev, err := m.Read(time.Now().Add(200 * time.Millisecond))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return model.MonitorEvent{}, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return ev, true
	}
	if ev, ok := next(); ok {
		t.Fatalf("an event from before the monitor: %+v", ev)
	}
	if c, err := m.Counts(); err != nil || c != (model.MonitorCounts{}) {
		t.Fatalf("counts before the monitor: %+v %v", c, err)
	}

	// One at a time (the burst is 3): tc drop, XDP drop, served.
	if ret, _ := e.run(t, unallocated); ret != tcActShot {
		t.Fatalf("unallocated service IP: ret %d, want drop", ret)
	}
	ev, ok := next()
	want := model.MonitorEvent{Type: "drop", Reason: "drop_unallocated_service_ip", Protocol: "TCP", Hook: "tc", TCPFlags: "SYN",
		Source: netip.AddrPortFrom(client, 1111), Destination: netip.MustParseAddrPort("172.30.9.9:80"), Length: uint32(len(unallocated))}
	if !ok || !sameEvent(ev, want) || time.Since(ev.Time) > time.Minute {
		t.Fatalf("tc drop: event %+v %v, want %+v", ev, ok, want)
	}
	if ret, _, err := xdp.Test(outsideRanges); err != nil || ret != 1 /* XDP_DROP */ {
		t.Fatalf("XDP, LB IP from outside the source ranges: ret %d %v, want drop", ret, err)
	}
	ev, ok = next()
	want = model.MonitorEvent{Type: "drop", Reason: "drop_source_range", Protocol: "TCP", Hook: "xdp", TCPFlags: "SYN",
		Source: netip.MustParseAddrPort("192.0.2.200:2222"), Destination: netip.AddrPortFrom(lbIP, 80), Length: uint32(len(outsideRanges))}
	if !ok || !sameEvent(ev, want) {
		t.Fatalf("XDP drop: event %+v %v, want %+v", ev, ok, want)
	}
	if ret, _ := e.run(t, served); ret == tcActShot {
		t.Fatal("SYN to the ClusterIP dropped")
	}
	if ev, ok := next(); ok {
		t.Fatalf("an event for a packet served: %+v", ev)
	}

	// A flood at a rate of 1 a second: at most the burst per CPU gets
	// through, the rest is counted.
	const flood = 50
	for range flood {
		e.run(t, unallocated)
	}
	got := 0
	for {
		if _, ok := next(); !ok {
			break
		}
		got++
	}
	c, err := m.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if got > 3*runtime.NumCPU() || c.Suppressed+uint64(got) < flood || c.Lost != 0 {
		t.Errorf("flood of %d: %d events, counts %+v; want at most %d events, the rest suppressed", flood, got, c, 3*runtime.NumCPU())
	}
	t.Logf("flood of %d: %d events, %+v", flood, got, c)
}

// sameEvent compares what the program wrote (not the time, or the
// device, which the test runs have none of).
func sameEvent(a, b model.MonitorEvent) bool {
	a.Time, b.Time, a.Device, b.Device = time.Time{}, time.Time{}, "", ""
	return a == b
}
