package maps

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Connection is one live flow, as `ipvsadm -Lnc` lists a connection: the
// client, the frontend it asked for, the backend it went to, plus the
// address and port the flow leaves from when it is masqueraded (or
// remapped on a clash).
type Connection struct {
	Protocol string `json:"protocol"`
	// Expires is how long the flow lives without another packet.
	Expires time.Duration `json:"expiresNanoseconds"`
	// State is netfilter's TCP state name (conntrack -L), "UDP" or
	// "SCTP" for the others, "NONE" for a TCP flow not yet answered.
	State       string         `json:"state"`
	Source      netip.AddrPort `json:"source"`
	Virtual     netip.AddrPort `json:"virtual"`
	Destination netip.AddrPort `json:"destination"`
	// Masquerade is the flow's source as the backend sees it, when xvs
	// rewrote it (unset otherwise; in netfilter mode netfilter's own
	// masquerade is in `conntrack -L`).
	Masquerade netip.AddrPort `json:"masquerade,omitzero"`
	// Replied: the backend has answered (the flow is in the established
	// table, not the unreplied one). ebpf mode only.
	Replied bool     `json:"replied"`
	Flags   []string `json:"flags,omitempty"`
	Packets uint32   `json:"packets"`
	Bytes   uint32   `json:"bytes"`
	// Service owns Virtual, as the running agent publishes it; nil
	// without one.
	Service *ServiceRef `json:"service,omitempty"`
}

var ctStateNames = map[xbpf.CtState]string{
	xbpf.XvsXvsCtStateXVS_CT_NONE:        "NONE",
	xbpf.XvsXvsCtStateXVS_CT_SYN_SENT:    "SYN_SENT",
	xbpf.XvsXvsCtStateXVS_CT_SYN_RECV:    "SYN_RECV",
	xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED: "ESTABLISHED",
	xbpf.XvsXvsCtStateXVS_CT_FIN_WAIT:    "FIN_WAIT",
	xbpf.XvsXvsCtStateXVS_CT_CLOSE_WAIT:  "CLOSE_WAIT",
	xbpf.XvsXvsCtStateXVS_CT_LAST_ACK:    "LAST_ACK",
	xbpf.XvsXvsCtStateXVS_CT_TIME_WAIT:   "TIME_WAIT",
	xbpf.XvsXvsCtStateXVS_CT_CLOSE:       "CLOSE",
}

var ctFlagNames = []struct {
	f    xbpf.CtFlags
	name string
}{
	{xbpf.XvsXvsCtFlagsXVS_CT_F_HOST, "host-backend"},
	{xbpf.XvsXvsCtFlagsXVS_CT_F_NETFILTER, "netfilter"},
	{xbpf.XvsXvsCtFlagsXVS_CT_F_NF_MASQ, "netfilter-masquerade"},
	{xbpf.XvsXvsCtFlagsXVS_CT_F_HELD, "counted-active"},
	{xbpf.XvsXvsCtFlagsXVS_CT_F_INACTIVE, "counted-inactive"},
}

// ConnectionFilter selects connections: a zero field matches anything,
// and an address with a zero port matches every port.
type ConnectionFilter struct {
	Protocol model.Protocol
	Virtual  netip.AddrPort // the frontend (conntrack's original destination)
	// Source is the client (the original source), Destination the
	// backend (the reply's source).
	Source, Destination netip.AddrPort
}

// Match says whether f selects c.
func (f ConnectionFilter) Match(c *Connection) bool {
	if f.Protocol != 0 && f.Protocol.String() != c.Protocol {
		return false
	}
	return addrPortMatch(f.Virtual, c.Virtual) && addrPortMatch(f.Source, c.Source) && addrPortMatch(f.Destination, c.Destination)
}

// addrPortMatch: an unset want matches anything, a zero port every port.
func addrPortMatch(want, got netip.AddrPort) bool {
	return !want.Addr().IsValid() || want.Addr() == got.Addr() && (want.Port() == 0 || want.Port() == got.Port())
}

// Connections lists the live flows of both conntrack tables (their
// forward entries; expired ones are left out), sorted by frontend, then
// client.
func (m *Maps) Connections(f ConnectionFilter) ([]Connection, error) {
	now, err := MonotonicNow()
	if err != nil {
		return nil, err
	}
	var out []Connection
	for i, ct := range m.ConntrackTables() {
		if ct == nil {
			continue
		}
		err := Walk(ct, func(k *xbpf.CtKey, e *xbpf.CtEntry) {
			if c, ok := liveConnection(k, e, now, i == 0); ok && f.Match(&c) {
				out = append(out, c)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	SortConnections(out)
	return out, nil
}

// liveConnection is the connection of a forward entry that has not
// expired (false for reply entries and expired flows).
func liveConnection(k *xbpf.CtKey, e *xbpf.CtEntry, now uint64, replied bool) (Connection, bool) {
	flags := xbpf.CtFlags(e.Flags)
	if flags&xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY != 0 || e.Expires <= now {
		return Connection{}, false
	}
	proto := model.Protocol(k.Proto)
	c := Connection{
		Protocol:    proto.String(),
		Expires:     time.Duration(e.Expires - now),
		Source:      netip.AddrPortFrom(DecodeAddr(k.Saddr, k.Family), Ntohs(k.Sport)),
		Virtual:     netip.AddrPortFrom(DecodeAddr(k.Daddr, k.Family), Ntohs(k.Dport)),
		Destination: netip.AddrPortFrom(DecodeAddr(e.NatAddr, k.Family), Ntohs(e.NatPort)),
		Replied:     replied,
		Packets:     e.Packets,
		Bytes:       e.Bytes,
	}
	switch {
	case proto == model.TCP:
		c.State = ctStateNames[xbpf.CtState(e.State)]
	default:
		c.State = strings.ToUpper(proto.String())
	}
	if flags&xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT != 0 {
		c.Masquerade = netip.AddrPortFrom(DecodeAddr(e.SnatAddr, k.Family), Ntohs(e.SnatPort))
	}
	for _, fl := range ctFlagNames {
		if flags&fl.f != 0 {
			c.Flags = append(c.Flags, fl.name)
		}
	}
	return c, true
}

// replyKeyOf is the reply entry's key of a flow's forward entry: backend
// to client, or to the masquerade address.
func ReplyKeyOf(k *xbpf.CtKey, e *xbpf.CtEntry) xbpf.CtKey {
	rk := xbpf.CtKey{Saddr: e.NatAddr, Sport: e.NatPort, Daddr: k.Saddr, Dport: k.Sport, Proto: k.Proto, Family: k.Family}
	if e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT) != 0 {
		rk.Daddr, rk.Dport = e.SnatAddr, e.SnatPort
	}
	return rk
}

// ExpireConnections ends the live flows f selects, as `conntrack -D` does:
// both entries of each are marked expired, so the datapath treats its
// next packet as a new flow's (a UDP client is balanced again; a TCP
// segment of a connection is INVALID and dropped), and the agent's reaper
// deletes them and gives the least-connection schedulers their counts
// back, as for any flow that expired. It returns how many flows it ended.
// A packet of the flow in the same instant may refresh an entry and keep
// the flow alive; the count then includes it.
func (m *Maps) ExpireConnections(f ConnectionFilter) (int, error) {
	now, err := MonotonicNow()
	if err != nil {
		return 0, err
	}
	n := 0
	for i, ct := range m.ConntrackTables() {
		if ct == nil {
			continue
		}
		var keys []xbpf.CtKey
		err := Walk(ct, func(k *xbpf.CtKey, e *xbpf.CtEntry) {
			if c, ok := liveConnection(k, e, now, i == 0); ok && f.Match(&c) {
				keys = append(keys, *k, ReplyKeyOf(k, e))
			}
		})
		if err != nil {
			return n, err
		}
		for j, k := range keys {
			var e xbpf.CtEntry
			if err := ct.Lookup(&k, &e); err != nil {
				continue // gone meanwhile, or a reply entry never written
			}
			e.Expires = 1 // long ago: past the reaper's grace too
			if err := ct.Update(&k, &e, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, fmt.Errorf("expire conntrack entry: %w", err)
			}
			if j%2 == 0 {
				n++
			}
		}
	}
	return n, nil
}

// SortConnections orders connections by frontend, protocol, then client.
func SortConnections(cs []Connection) {
	slices.SortFunc(cs, func(a, b Connection) int {
		return cmp.Or(a.Virtual.Compare(b.Virtual), cmp.Compare(a.Protocol, b.Protocol), a.Source.Compare(b.Source))
	})
}
