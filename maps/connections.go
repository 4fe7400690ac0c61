package maps

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

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

// ConnectionFilter selects connections: a zero field matches anything.
type ConnectionFilter struct {
	Protocol model.Protocol
	Virtual  netip.AddrPort // the frontend; a zero port matches every port
}

// Match says whether f selects c.
func (f ConnectionFilter) Match(c *Connection) bool {
	if f.Protocol != 0 && f.Protocol.String() != c.Protocol {
		return false
	}
	if f.Virtual.Addr().IsValid() && (f.Virtual.Addr() != c.Virtual.Addr() ||
		(f.Virtual.Port() != 0 && f.Virtual.Port() != c.Virtual.Port())) {
		return false
	}
	return true
}

// Connections lists the live flows of both conntrack tables (their
// forward entries; expired ones are left out), sorted by frontend, then
// client.
func (m *Maps) Connections(f ConnectionFilter) ([]Connection, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	var out []Connection
	for i, ct := range m.ConntrackTables() {
		if ct == nil {
			continue
		}
		err := walk(ct, func(k *xbpf.CtKey, e *xbpf.CtEntry) {
			flags := xbpf.CtFlags(e.Flags)
			if flags&xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY != 0 || e.Expires <= now {
				return
			}
			proto := model.Protocol(k.Proto)
			c := Connection{
				Protocol:    proto.String(),
				Expires:     time.Duration(e.Expires - now),
				Source:      netip.AddrPortFrom(decodeAddr(k.Saddr, k.Family), ntohs(k.Sport)),
				Virtual:     netip.AddrPortFrom(decodeAddr(k.Daddr, k.Family), ntohs(k.Dport)),
				Destination: netip.AddrPortFrom(decodeAddr(e.NatAddr, k.Family), ntohs(e.NatPort)),
				Replied:     i == 0,
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
				c.Masquerade = netip.AddrPortFrom(decodeAddr(e.SnatAddr, k.Family), ntohs(e.SnatPort))
			}
			for _, fl := range ctFlagNames {
				if flags&fl.f != 0 {
					c.Flags = append(c.Flags, fl.name)
				}
			}
			if f.Match(&c) {
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

// SortConnections orders connections by frontend, protocol, then client.
func SortConnections(cs []Connection) {
	slices.SortFunc(cs, func(a, b Connection) int {
		return cmp.Or(a.Virtual.Compare(b.Virtual), cmp.Compare(a.Protocol, b.Protocol), a.Source.Compare(b.Source))
	})
}
