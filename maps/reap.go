package maps

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// ReapGrace is how long past its expiry a conntrack entry is left alone
// before the reaper deletes it: a packet of that flow arriving meanwhile is
// handled by the datapath as a new flow, never raced by the reaper.
const ReapGrace = 30 * time.Second

// Reap deletes conntrack entries that expired more than grace ago and
// hands back the connections the least-connection schedulers still counted
// for them (flows that ended without FIN or RST, UDP flows). It returns how
// many entries it deleted. The datapath never writes xvs_backend_reaped, so
// the read-modify-write here races with nothing.
func (d *Datapath) Reap(grace time.Duration) (int, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read clock: %w", err)
	}
	now := uint64(ts.Nano())
	var dead []xbpf.CtKey
	reaped := map[uint32]xbpf.Conns{}
	var k xbpf.CtKey
	var e xbpf.CtEntry
	it := d.m.Conntrack.Iterate()
	for it.Next(&k, &e) {
		if e.Expires+uint64(grace) > now {
			continue
		}
		dead = append(dead, k)
		switch c := reaped[e.BackendId]; {
		case e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_HELD) != 0:
			c.Active++
			reaped[e.BackendId] = c
		case e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_INACTIVE) != 0:
			c.Inactive++
			reaped[e.BackendId] = c
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read conntrack: %w", err)
	}
	if err := deleteMany(d.m.Conntrack, dead); err != nil {
		return 0, err
	}
	for id, n := range reaped {
		var have xbpf.Conns
		if err := d.m.BackendReaped.Lookup(&id, &have); err != nil {
			return 0, fmt.Errorf("read reaped count of backend %d: %w", id, err)
		}
		have.Active += n.Active
		have.Inactive += n.Inactive
		if err := d.m.BackendReaped.Update(&id, &have, 0); err != nil {
			return 0, fmt.Errorf("write reaped count of backend %d: %w", id, err)
		}
	}
	return len(dead), nil
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
