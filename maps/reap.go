package maps

import (
	"context"

	"fmt"
	"github.com/cilium/ebpf"
	"time"

	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// ReapGrace is how long past its expiry a flow is left alone before the
// reaper deletes it: a packet of that flow arriving meanwhile is handled by
// the datapath as a new flow, never raced by the reaper. (The datapath
// never needs the reaper to reuse a tuple or a masquerade port: a dead
// flow's entries are free to it at once.)
const ReapGrace = 30 * time.Second

func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// flowKeyOf is the key of the forward entry a reply entry points at.
func flowKeyOf(rk xbpf.CtKey, rev xbpf.CtEntry) xbpf.CtKey {
	return xbpf.CtKey{
		Saddr: rev.SnatAddr, Daddr: rev.NatAddr, Sport: rev.SnatPort, Dport: rev.NatPort,
		Proto: rk.Proto, Family: rk.Family,
	}
}

// pointsBack says whether the flow fe is the one reply entry key rk (with
// value rev) belongs to, as the datapath's ct_flow_of decides it.
func pointsBack(rk xbpf.CtKey, rev, fe xbpf.CtEntry) bool {
	if fe.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) != 0 || fe.NatAddr != rk.Saddr || fe.NatPort != rk.Sport {
		return false
	}
	if fe.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT) != 0 {
		return fe.SnatAddr == rk.Daddr && fe.SnatPort == rk.Dport
	}
	return rev.SnatAddr == rk.Daddr && rev.SnatPort == rk.Dport
}

// Reap deletes flows that expired more than grace ago (both entries) and
// reply entries whose flow is gone or is another flow now, and hands back
// the connections the least-connection schedulers still counted for the
// flows (those that ended without FIN or RST, UDP flows). It returns how
// many entries it deleted. The datapath never writes xvs_backend_reaped, so
// the read-modify-write there races with nothing. Each entry is read again
// just before it is deleted, and left alone if the datapath rewrote it
// meanwhile (a new flow on the same tuple).
func (d *Datapath) Reap(grace time.Duration) (int, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	reaped := map[uint32]xbpf.Conns{}
	deleted := 0
	for i, ct := range d.m.ConntrackTables() {
		n, seen, err := reapTable(ct, d.m.ConntrackTables(), now, grace, reaped)
		deleted += n
		if err != nil {
			return deleted, err
		}
		d.ctEntries[i].Store(uint64(seen - n))
	}
	for id, n := range reaped {
		var have xbpf.Conns
		if err := d.m.BackendReaped.Lookup(&id, &have); err != nil {
			return deleted, fmt.Errorf("read reaped count of backend %d: %w", id, err)
		}
		have.Active += n.Active
		have.Inactive += n.Inactive
		if err := d.m.BackendReaped.Update(&id, &have, 0); err != nil {
			return deleted, fmt.Errorf("write reaped count of backend %d: %w", id, err)
		}
	}
	return deleted, nil
}

// reapTable reaps one conntrack table, adding the connections it hands
// back to reaped. A reply entry's flow is looked for in every table: a
// flow's entries move together, but not in one step.
func reapTable(ct *ebpf.Map, tables []*ebpf.Map, now uint64, grace time.Duration, reaped map[uint32]xbpf.Conns) (deleted, seen int, err error) {
	var dead, replies []xbpf.CtKey
	var deadVals, replyVals []xbpf.CtEntry
	var k xbpf.CtKey
	var e xbpf.CtEntry
	it := ct.Iterate()
	for it.Next(&k, &e) {
		seen++
		if e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) != 0 {
			replies, replyVals = append(replies, k), append(replyVals, e)
		} else if e.Expires+uint64(grace) <= now {
			dead, deadVals = append(dead, k), append(deadVals, e)
		}
	}
	if err := it.Err(); err != nil {
		return 0, seen, fmt.Errorf("read conntrack: %w", err)
	}
	unchanged := func(k xbpf.CtKey, was xbpf.CtEntry) bool {
		var now xbpf.CtEntry
		return ct.Lookup(&k, &now) == nil && now == was
	}
	del := func(k xbpf.CtKey) error {
		if err := ct.Delete(&k); err != nil && !isNotExist(err) {
			return fmt.Errorf("delete conntrack entry: %w", err)
		}
		deleted++
		return nil
	}
	for i, k := range dead {
		e := deadVals[i]
		if !unchanged(k, e) {
			continue
		}
		if err := del(k); err != nil {
			return deleted, seen, err
		}
		switch c := reaped[e.BackendId]; {
		case e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_HELD) != 0:
			c.Active++
			reaped[e.BackendId] = c
		case e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_INACTIVE) != 0:
			c.Inactive++
			reaped[e.BackendId] = c
		}
	}
	for i, rk := range replies {
		rev := replyVals[i]
		fk := flowKeyOf(rk, rev)
		if flowLives(tables, rk, rev, fk, now, grace) {
			continue
		}
		if !unchanged(rk, rev) {
			continue
		}
		if err := del(rk); err != nil {
			return deleted, seen, err
		}
	}
	return deleted, seen, nil
}

// flowLives says whether the flow at fk that reply entry rk points at is
// alive (within grace) in one of the tables.
func flowLives(tables []*ebpf.Map, rk xbpf.CtKey, rev xbpf.CtEntry, fk xbpf.CtKey, now uint64, grace time.Duration) bool {
	for _, t := range tables {
		var fe xbpf.CtEntry
		if t.Lookup(&fk, &fe) == nil && pointsBack(rk, rev, fe) && fe.Expires+uint64(grace) > now {
			return true
		}
	}
	return false
}

// RunReaper calls Reap every interval until ctx ends, reporting errors to
// onErr (which may be nil).
func (d *Datapath) RunReaper(ctx context.Context, interval time.Duration, onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := d.Reap(ReapGrace); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}
