package reconcile

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// A node moving to xvs from kube-proxy has connections in flight that
// kube-proxy translated (IPVS with net.ipv4.vs.conntrack=1, iptables or
// nftables): netfilter's conntrack knows them, xvs's does not, and once
// xvs serves their Service a segment of such a connection, which is not a
// SYN, would find no flow and be dropped. Adopt writes them into xvs's
// conntrack as the flows they are, on the backend they already have, so
// that they carry on through xvs and survive the removal of kube-proxy's
// rules and virtual servers.

// AdoptedFlow is one connection another proxy translated, as netfilter's
// conntrack shows it: the original direction client -> frontend, the reply
// direction backend -> ReplyTo (the client, or the masquerade address).
type AdoptedFlow struct {
	Proto    model.Protocol
	Client   netip.AddrPort
	Frontend netip.AddrPort
	Backend  netip.AddrPort
	ReplyTo  netip.AddrPort
	// Remaining is what netfilter's entry has left to live: the flow keeps
	// it, and each packet extends it by xvs's own timeouts.
	Remaining time.Duration
}

// Masqueraded reports whether the backend sees another source than the
// client.
func (f AdoptedFlow) Masqueraded() bool { return f.ReplyTo != f.Client }

// Why a flow is not adopted (AdoptResult.Skipped's keys).
const (
	AdoptNotServed     = "not-a-frontend" // its frontend is not one xvs serves
	AdoptNoBackend     = "backend-gone"   // its backend is no endpoint of the frontend now
	AdoptHostBackend   = "host-backend"   // the backend is on the node's own address
	AdoptMasqueraded   = "masqueraded"    // the backend sees a node address: see Adopt
	AdoptAlreadyExists = "already-in-xvs" // xvs already tracks this client tuple
	AdoptNoRoom        = "conntrack-full" // xvs's conntrack table refused the entries
	AdoptOtherFailure  = "write-failed"   // any other map error
)

// adoptedFlags are an adopted flow's: replied, and never through
// netfilter, whatever the mode. netfilter's entry of the flow (original
// destination the Service address) would clash with the one it would make
// for xvs's translated packets (the same reply tuple), and netfilter
// settles such a clash by moving the new entry to another source port:
// the backend would see a stranger and reset the connection. Like every
// flow in bypass mode, an adopted flow is forwarded and reverse-NATed by
// the programs themselves, past the node's netfilter hooks (which admitted
// it when it opened), and netfilter's old entry is never used again.
const adoptedFlags = uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SEEN_REPLY)

// AdoptResult counts what Adopt did.
type AdoptResult struct {
	Adopted []AdoptedFlow
	Skipped map[string]int
}

// AdoptAtNextSync has the next Sync adopt flows (Adopt) once it has
// planned, before it writes the frontends that make their Services
// visible to the programs: from then on a packet of such a flow finds its
// entries. Adopting after the sync would leave a window in which a UDP
// datagram of the flow opens a new flow, to another backend, and a TCP
// segment is dropped. (A sync large enough to write in several batches,
// flushSlots, makes its first batches visible before it adopts.)
func (d *Datapath) AdoptAtNextSync(flows []AdoptedFlow) {
	d.adoptNext = flows
	d.adoptDone, d.adoptErr = nil, nil
}

// Adopted is what the sync asked by AdoptAtNextSync adopted (nil before
// it ran).
func (d *Datapath) Adopted() (*AdoptResult, error) { return d.adoptDone, d.adoptErr }

// adoptPending runs what AdoptAtNextSync asked for.
func (d *Datapath) adoptPending() {
	if d.adoptNext == nil {
		return
	}
	res, err := d.Adopt(d.adoptNext)
	d.adoptNext, d.adoptDone, d.adoptErr = nil, &res, err
}

// Adopt writes each flow into the established conntrack table: the reply
// entry first (its replies are reverse-translated as soon as the forward
// entry sends packets to the backend), then the forward entry, neither
// over an entry that exists. A flow is adopted as established (TCP) or
// replied (UDP); its packets and bytes count in the Service's and the
// backend's counters, but it is not counted as a new connection, nor in
// the least-connection schedulers' active counts (it was scheduled
// elsewhere).
//
// A masqueraded TCP connection (the backend sees a node address, not the
// client's) keeps its masquerade address and port: xvs's programs
// masquerade it themselves, as in bypass mode, and its reply entry (backend
// -> that address and port) holds the port against xvs's own masquerade.
// netfilter's entry of it must stay (the caller keeps it): it holds the
// port against netfilter's MASQUERADE, which would otherwise give it to a
// new connection to the same backend. It lasts netfilter's established
// timeout (kube-proxy's 24 h), as long as xvs's own. A masqueraded UDP
// flow is skipped: netfilter's entry of it lasts a few minutes without
// traffic through it, after which its port could be given again.
func (d *Datapath) Adopt(flows []AdoptedFlow) (AdoptResult, error) {
	res := AdoptResult{Skipped: map[string]int{}}
	now, err := maps.MonotonicNow()
	if err != nil {
		return res, err
	}
	ct := d.w.conntrack[0]
	var failed error
	for _, f := range flows {
		fk := maps.FrontendKey{Addr: f.Frontend.Addr().Unmap(), Port: f.Frontend.Port(), Proto: f.Proto}
		svcID, ok := d.svcIDs.lookup(fk)
		if _, served := d.owners[fk]; !ok || !served {
			res.Skipped[AdoptNotServed]++
			continue
		}
		be, ok := d.backends.get(maps.NewBackendKey(f.Backend.Addr().Unmap(), f.Backend.Port(), f.Proto))
		if !ok || be.refs == 0 {
			res.Skipped[AdoptNoBackend]++
			continue
		}
		if slices.Contains(d.nodeAddrs, f.Backend.Addr().Unmap()) {
			res.Skipped[AdoptHostBackend]++
			continue
		}
		if f.Masqueraded() && f.Proto != model.TCP {
			res.Skipped[AdoptMasqueraded]++
			continue
		}
		fwdKey, fwd, revKey, rev := adoptedEntries(f, svcID, be.id, now)
		added, err := ct.add(revKey, rev)
		if err == nil && added {
			if added, err = ct.add(fwdKey, fwd); err == nil && !added {
				// A forward entry of this client tuple appeared in
				// between: it is the datapath's, and so is its reply.
				err = ct.del([]xbpf.CtKey{revKey})
				added = false
			}
		}
		switch {
		case err != nil && errors.Is(err, errMapFull):
			res.Skipped[AdoptNoRoom]++
		case err != nil:
			res.Skipped[AdoptOtherFailure]++
			failed = errors.Join(failed, fmt.Errorf("adopt %s %s -> %s: %w", f.Proto, f.Client, f.Frontend, err))
		case !added:
			res.Skipped[AdoptAlreadyExists]++
		default:
			res.Adopted = append(res.Adopted, f)
		}
	}
	return res, failed
}

// adoptedEntries are f's two conntrack entries, as flow_new writes them
// for a new flow, with the state of an established one.
func adoptedEntries(f AdoptedFlow, svcID, backendID uint32, now uint64) (fwdKey xbpf.CtKey, fwd xbpf.CtEntry, revKey xbpf.CtKey, rev xbpf.CtEntry) {
	flags := adoptedFlags
	client, fam := maps.EncodeAddr(f.Client.Addr())
	frontend, _ := maps.EncodeAddr(f.Frontend.Addr())
	backend, _ := maps.EncodeAddr(f.Backend.Addr())
	replyTo, _ := maps.EncodeAddr(f.ReplyTo.Addr())
	if f.Masqueraded() {
		flags |= uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT)
	}
	state := uint8(xbpf.XvsXvsCtStateXVS_CT_NONE)
	if f.Proto == model.TCP {
		state = uint8(xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED)
	}
	fwdKey = xbpf.CtKey{Saddr: client, Daddr: frontend, Sport: maps.Htons(f.Client.Port()), Dport: maps.Htons(f.Frontend.Port()),
		Proto: uint8(f.Proto), Family: fam}
	fwd = xbpf.CtEntry{Expires: now + uint64(max(f.Remaining, time.Second)), BackendId: backendID, SvcId: svcID,
		NatAddr: backend, NatPort: maps.Htons(f.Backend.Port()), Flags: flags, State: state}
	if f.Masqueraded() {
		fwd.SnatAddr, fwd.SnatPort = replyTo, maps.Htons(f.ReplyTo.Port())
	}
	revKey = xbpf.CtKey{Saddr: backend, Daddr: replyTo, Sport: maps.Htons(f.Backend.Port()), Dport: maps.Htons(f.ReplyTo.Port()),
		Proto: uint8(f.Proto), Family: fam}
	rev = xbpf.CtEntry{BackendId: backendID, SvcId: svcID, NatAddr: frontend, NatPort: maps.Htons(f.Frontend.Port()),
		SnatAddr: client, SnatPort: maps.Htons(f.Client.Port()), Flags: flags | uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY)}
	return fwdKey, fwd, revKey, rev
}

// errMapFull is a map refusing a new entry for want of room.
var errMapFull = errors.New("map full")

// addNew inserts k -> v if k has no entry: false, nil when it has one.
func addNew[K comparable, V any](m *ebpf.Map, k K, v V) (bool, error) {
	err := m.Update(&k, &v, ebpf.UpdateNoExist)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ebpf.ErrKeyExist):
		return false, nil
	case errors.Is(err, unix.E2BIG), errors.Is(err, unix.ENOMEM):
		return false, fmt.Errorf("%w: %w", errMapFull, err)
	}
	return false, err
}
