package reconcile

import (
	"fmt"
	"net/netip"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// Stale UDP and SCTP flows. A UDP client that keeps its source port (a DNS
// resolver, RTP, QUIC, statsd) would stay on its first backend for as long
// as it keeps talking, even after that endpoint went away: conntrack keeps
// the flow alive. kube-proxy's conntrack reconciler deletes, after each
// sync, the UDP entries of a Service port whose backend is not a serving
// endpoint any more, and those of deleted Services (SEMANTICS 3.17); xvs
// does the same for its own conntrack and for the socket-level balancer's
// per-socket choices, and for SCTP too. TCP flows stay: the old endpoint's
// RST ends them, and removed-but-terminating endpoints keep their
// established connections (graceful termination).

// datagramProto says whether flows of the protocol are flushed.
func datagramProto(p model.Protocol) bool { return p == model.UDP || p == model.SCTP }

// servingSet is every endpoint a ServicePort's frontends may use, both
// policies and both families: a flow to anything else is stale.
func servingSet(sp *model.ServicePort) map[netip.AddrPort]bool {
	out := make(map[netip.AddrPort]bool, len(sp.ClusterEndpoints)+len(sp.LocalEndpoints))
	for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, e := range set {
			if e.Serving {
				out[netip.AddrPortFrom(e.Addr.Unmap(), e.Port)] = true
			}
		}
	}
	return out
}

// staleFlows decides, for the flows of the frontends in touched, whether
// their backend is still serving.
type staleFlows struct {
	st      *model.State
	owners  map[maps.FrontendKey]model.ServicePortName
	touched map[maps.FrontendKey]bool
	sets    map[model.ServicePortName]map[netip.AddrPort]bool
}

func (s *staleFlows) stale(fk maps.FrontendKey, backend netip.AddrPort) bool {
	if !s.touched[fk] {
		return false
	}
	name, ok := s.owners[fk]
	if !ok {
		return true // the frontend went away
	}
	set, ok := s.sets[name]
	if !ok {
		sp := s.st.Services[name]
		if sp == nil {
			return true
		}
		set = servingSet(sp)
		s.sets[name] = set
	}
	return !set[backend]
}

// flushStale deletes the UDP and SCTP flows (both conntrack entries) and
// the socket-level choices of the frontends in touched whose backend no
// longer serves them, counting them per family in d.staleDeleted.
func (d *Datapath) flushStale(st *model.State, touched map[maps.FrontendKey]bool) error {
	if len(touched) == 0 {
		return nil
	}
	s := &staleFlows{st: st, owners: d.owners, touched: touched, sets: map[model.ServicePortName]map[netip.AddrPort]bool{}}
	for _, ct := range d.w.conntrack {
		if err := d.flushStaleIn(ct, s); err != nil {
			return err
		}
	}

	var socks []xbpf.XvsXvsSockKey
	err := d.w.sockFwd.each(func(sk *xbpf.XvsXvsSockKey, sv *xbpf.XvsXvsSockValue) {
		if !datagramProto(model.Protocol(sk.Proto)) {
			return
		}
		fam := sockFamily(sk.Addr)
		fk := maps.FrontendKey{Addr: maps.DecodeAddr(sk.Addr, fam), Port: maps.Ntohs(sk.Port), Proto: model.Protocol(sk.Proto)}
		if s.stale(fk, netip.AddrPortFrom(maps.DecodeAddr(sv.Addr, fam), maps.Ntohs(sv.Port))) {
			d.staleDeleted[familyIndex(fam)]++
			socks = append(socks, *sk)
		}
	})
	if err != nil {
		return fmt.Errorf("read socket choices: %w", err)
	}
	if err := d.w.sockFwd.del(socks); err != nil {
		return fmt.Errorf("delete stale socket choice: %w", err)
	}
	return nil
}

// familyIndex is 0 for IPv4, 1 for IPv6, as the metrics' ip_family.
func familyIndex(f uint8) int {
	if f == xbpf.FamilyIPv6 {
		return 1
	}
	return 0
}

// sockFamily tells the family of a socket-map address, which carries none:
// IPv4 addresses are zero-padded.
func sockFamily(a [16]byte) uint8 {
	for _, b := range a[4:] {
		if b != 0 {
			return xbpf.FamilyIPv6
		}
	}
	return xbpf.FamilyIPv4
}

// flushStaleIn deletes the stale flows of one conntrack table (a flow's
// two entries are always in the same one).
func (d *Datapath) flushStaleIn(ct kvMap[xbpf.CtKey, xbpf.CtEntry], s *staleFlows) error {
	var del []xbpf.CtKey
	err := ct.each(func(k *xbpf.CtKey, e *xbpf.CtEntry) {
		if e.Flags&uint16(xbpf.XvsXvsCtFlagsXVS_CT_F_REPLY) != 0 || !datagramProto(model.Protocol(k.Proto)) {
			return
		}
		fk := maps.FrontendKey{Addr: maps.DecodeAddr(k.Daddr, k.Family), Port: maps.Ntohs(k.Dport), Proto: model.Protocol(k.Proto)}
		backend := netip.AddrPortFrom(maps.DecodeAddr(e.NatAddr, k.Family), maps.Ntohs(e.NatPort))
		if !s.stale(fk, backend) {
			return
		}
		d.staleDeleted[familyIndex(k.Family)]++
		del = append(del, *k, maps.ReplyKeyOf(k, e))
	})
	if err != nil {
		return err
	}
	if err := ct.del(del); err != nil {
		return fmt.Errorf("delete stale flow: %w", err)
	}
	return nil
}
