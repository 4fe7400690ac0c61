package reconcile

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
)

// ReapGrace is how long past its expiry a flow is left alone before the
// reaper deletes it: a packet of that flow arriving meanwhile is handled by
// the datapath as a new flow, never raced by the reaper. (The datapath
// never needs the reaper to reuse a tuple or a masquerade port: a dead
// flow's entries are free to it at once.)
const ReapGrace = 30 * time.Second

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
// the read-modify-write there races with nothing. An entry is taken out
// with the value it holds at that instant (take), and put back if the
// datapath rewrote it since the pass read it (a new flow on the same
// tuple): what the reaper counts as handed back is what it deleted, so a
// connection the datapath released itself is not released twice. What a
// pass deleted is counted even when the pass stops on an error.
//
// A pass reads every table once, in batches, and answers "does this reply
// entry's flow live?" from fingerprints of the live forward entries it
// read; only a reply entry about to be deleted is looked up again in the
// maps. A pass costs no syscall per live flow.
func (d *Datapath) Reap(grace time.Duration) (int, error) {
	now, err := maps.MonotonicNow()
	if err != nil {
		return 0, err
	}
	tables := d.m.ConntrackTables()
	live := liveFlows{seed: maphash.MakeSeed()}
	scans := make([]tableScan, len(tables))
	for i, ct := range tables {
		if scans[i], err = scanTable(ct, now, grace, &live); err != nil {
			return 0, err
		}
	}
	slices.Sort(live.prints)
	reaped := map[uint32]xbpf.Conns{}
	deleted := 0
	for i, ct := range tables {
		n, err := scans[i].reap(ct, tables, &live, now, grace, reaped)
		deleted += n
		if err != nil {
			return deleted, errors.Join(err, d.handBack(reaped))
		}
		d.ctEntries[i].Store(uint64(scans[i].seen - n))
	}
	return deleted, d.handBack(reaped)
}

// handBack adds the connections of reaped flows to xvs_backend_reaped,
// which the least-connection schedulers subtract from what the datapath
// counts as held.
func (d *Datapath) handBack(reaped map[uint32]xbpf.Conns) error {
	for id, n := range reaped {
		var have xbpf.Conns
		if err := d.m.BackendReaped.Lookup(&id, &have); err != nil {
			return fmt.Errorf("read reaped count of backend %d: %w", id, err)
		}
		have.Active += n.Active
		have.Inactive += n.Inactive
		if err := d.m.BackendReaped.Update(&id, &have, 0); err != nil {
			return fmt.Errorf("write reaped count of backend %d: %w", id, err)
		}
	}
	return nil
}

// flowPrint is what a reply entry must find in its flow's forward entry
// (pointsBack): the flow's key, the backend, and the masquerade address if
// the flow has one.
type flowPrint struct {
	key      xbpf.CtKey
	natAddr  [16]byte
	natPort  uint16
	snat     bool
	snatAddr [16]byte
	snatPort uint16
}

// liveFlows are the sorted fingerprints of the forward entries alive
// within the grace. A fingerprint collision can only keep an orphaned
// reply entry for another pass, never delete a live one: a reply entry
// found in no fingerprint is looked up in the maps before it goes.
type liveFlows struct {
	seed   maphash.Seed
	prints []uint64
}

func (l *liveFlows) print(p flowPrint) uint64 { return maphash.Comparable(l.seed, p) }

func (l *liveFlows) has(p flowPrint) bool {
	_, ok := slices.BinarySearch(l.prints, l.print(p))
	return ok
}

// mayLive says whether the flow reply entry rk (value rev) points at may
// be alive: false means it certainly is not among the fingerprinted ones.
func (l *liveFlows) mayLive(rk xbpf.CtKey, rev xbpf.CtEntry) bool {
	p := flowPrint{key: flowKeyOf(rk, rev), natAddr: rk.Saddr, natPort: rk.Sport, snat: true, snatAddr: rk.Daddr, snatPort: rk.Dport}
	if l.has(p) {
		return true
	}
	if rev.SnatAddr != rk.Daddr || rev.SnatPort != rk.Dport {
		return false // only a masqueraded flow can own this reply entry
	}
	p.snat, p.snatAddr, p.snatPort = false, [16]byte{}, 0
	return l.has(p)
}

// tableScan is what a pass read of one table: its entry count, the
// forward entries past their grace, and every reply entry.
type tableScan struct {
	seen                int
	dead, replies       []xbpf.CtKey
	deadVals, replyVals []xbpf.CtEntry
}

// scanTable reads one conntrack table, adding the fingerprints of its live
// forward entries to live.
func scanTable(ct *ebpf.Map, now uint64, grace time.Duration, live *liveFlows) (tableScan, error) {
	var s tableScan
	err := maps.Walk(ct, func(k *xbpf.CtKey, e *xbpf.CtEntry) {
		s.seen++
		switch {
		case e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) != 0:
			s.replies, s.replyVals = append(s.replies, *k), append(s.replyVals, *e)
		case e.Expires+uint64(grace) <= now:
			s.dead, s.deadVals = append(s.dead, *k), append(s.deadVals, *e)
		default:
			p := flowPrint{key: *k, natAddr: e.NatAddr, natPort: e.NatPort}
			if e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT) != 0 {
				p.snat, p.snatAddr, p.snatPort = true, e.SnatAddr, e.SnatPort
			}
			live.prints = append(live.prints, live.print(p))
		}
	})
	return s, err
}

// reap deletes what scanTable found dead in ct, adding the connections it
// hands back to reaped. A reply entry's flow is looked for in every table:
// a flow's entries move together, but not in one step.
func (s *tableScan) reap(ct *ebpf.Map, tables []*ebpf.Map, live *liveFlows, now uint64, grace time.Duration, reaped map[uint32]xbpf.Conns) (deleted int, err error) {
	for i, k := range s.dead {
		gone, ok, err := take(ct, k, s.deadVals[i])
		if ok {
			deleted++
			switch c := reaped[gone.BackendId]; {
			case gone.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_HELD) != 0:
				c.Active++
				reaped[gone.BackendId] = c
			case gone.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_INACTIVE) != 0:
				c.Inactive++
				reaped[gone.BackendId] = c
			}
		}
		if err != nil {
			return deleted, err
		}
	}
	for i, rk := range s.replies {
		rev := s.replyVals[i]
		if live.mayLive(rk, rev) {
			continue
		}
		// Not among the flows read: perhaps one that began after the
		// read, or moved tables meanwhile.
		if flowLives(tables, rk, rev, flowKeyOf(rk, rev), now, grace) {
			continue
		}
		_, ok, err := take(ct, rk, rev)
		if ok {
			deleted++
		}
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// beforeTake, when set (by tests), runs just before take deletes k: the
// moment at which the datapath rewriting the entry would have fooled a
// reaper that looked it up and then deleted it by key.
var beforeTake func(ct *ebpf.Map, k xbpf.CtKey)

// take deletes the entry at k, which a pass read as was, and returns the
// value it deleted. One syscall reads and deletes (BPF_MAP_LOOKUP_AND_DELETE_ELEM),
// so nothing the datapath writes can fall between the check and the
// delete. If the entry is no longer was (the datapath began a new flow on
// the tuple since the read), it is put back and ok is false; if a newer
// entry already took its place, the value taken is gone for good and
// counts as deleted (ok), so that what it held is handed back.
func take(ct *ebpf.Map, k xbpf.CtKey, was xbpf.CtEntry) (gone xbpf.CtEntry, ok bool, err error) {
	if beforeTake != nil {
		beforeTake(ct, k)
	}
	if err := ct.LookupAndDelete(&k, &gone); err != nil {
		if isNotExist(err) {
			return gone, false, nil
		}
		return gone, false, fmt.Errorf("delete conntrack entry: %w", err)
	}
	if gone == was {
		return gone, true, nil
	}
	switch err := ct.Update(&k, &gone, ebpf.UpdateNoExist); {
	case err == nil:
		return gone, false, nil
	case errors.Is(err, ebpf.ErrKeyExist):
		return gone, true, nil
	default:
		return gone, true, fmt.Errorf("put back conntrack entry the datapath rewrote: %w", err)
	}
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
