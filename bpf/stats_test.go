package bpf_test

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// serviceStats reads the listing's view of the one Service: the per-CPU
// counters plus what live conntrack entries still hold.
func serviceStats(t *testing.T, e *env) xbpf.Stats {
	t.Helper()
	snap, err := e.m.Read(true)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Services) != 1 {
		t.Fatalf("want one service, got %d", len(snap.Services))
	}
	return snap.Services[0].Stats
}

// flushedStats is the per-CPU counter of the one Service alone.
func flushedStats(t *testing.T, e *env) xbpf.Stats {
	t.Helper()
	var per []xbpf.Stats
	var sum xbpf.Stats
	for id := uint32(0); id < 16; id++ {
		if err := e.m.SvcStats.Lookup(&id, &per); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // an ID no service has
		} else if err != nil {
			t.Fatal(err)
		}
		for _, s := range per {
			sum.Conns += s.Conns
			sum.PacketsIn += s.PacketsIn
			sum.PacketsOut += s.PacketsOut
		}
	}
	return sum
}

// TestPrivPacketCounters: packets of an established flow are counted on
// its conntrack entry and flushed to the service counters in batches (on
// the first reply, every 64 packets, and while closing); the listing adds
// what is pending, so it is exact at every moment.
func TestPrivPacketCounters(t *testing.T) {
	e := oneService(t, model.TCP, 80, backend1)
	fwd := func(flags l4) {
		flags.proto, flags.sport, flags.dport = model.TCP, 41000, 80
		if ret, _ := e.run(t, packet(t, client, vip, flags)); ret != tcActOK {
			t.Fatalf("forward packet: ret %d", ret)
		}
	}
	rep := func(flags l4) {
		flags.proto, flags.sport, flags.dport = model.TCP, 8080, 41000
		if ret, _ := e.run(t, packet(t, backend1.Addr(), client, flags)); ret != tcActOK {
			t.Fatalf("reply packet: ret %d", ret)
		}
	}
	want := func(conns, in, out uint64, flushedIn uint64) {
		t.Helper()
		s := serviceStats(t, e)
		if s.Conns != conns || s.PacketsIn != in || s.PacketsOut != out {
			t.Fatalf("listing: conns %d in %d out %d, want %d %d %d", s.Conns, s.PacketsIn, s.PacketsOut, conns, in, out)
		}
		if f := flushedStats(t, e); f.PacketsIn != flushedIn {
			t.Fatalf("flushed packets in: %d, want %d", f.PacketsIn, flushedIn)
		}
	}

	fwd(l4{syn: true})
	want(1, 1, 0, 0) // pending in the entry, visible in the listing
	rep(l4{syn: true, ack: true})
	want(1, 1, 1, 1) // the first reply flushes the forward entry
	for i := 0; i < 63; i++ {
		fwd(l4{ack: true})
	}
	want(1, 64, 1, 1)
	fwd(l4{ack: true}) // the 64th pending packet flushes the batch
	want(1, 65, 1, 65)
	fwd(l4{fin: true, ack: true}) // closing: every packet is flushed
	want(1, 66, 1, 66)

	// A second connection counts as one more.
	e.run(t, packet(t, client, vip, l4{proto: model.TCP, sport: 41001, dport: 80, syn: true}))
	if s := serviceStats(t, e); s.Conns != 2 {
		t.Fatalf("conns %d, want 2", s.Conns)
	}
}
