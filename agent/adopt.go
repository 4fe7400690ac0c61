package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// Taking over kube-proxy's connections at the switch (docs/migration.md):
// once the first sync has programmed the Services, connections kube-proxy
// translated would reach xvs's programs mid-flow, unknown to its
// conntrack, and be dropped. The agent finds them in netfilter's conntrack
// (kube-proxy's IPVS mode keeps them there with net.ipv4.vs.conntrack=1,
// its iptables and nftables modes always), writes them into xvs's
// conntrack on the backend they have (reconcile.Datapath.Adopt: forwarded by
// the programs past netfilter, whose old entries of them would clash), and
// deletes netfilter's entries of those it took, which nothing uses then.

// connectionAdopter takes over connections another proxy translated
// (reconcile.Datapath): those its next sync finds (AdoptAtNextSync, written
// before the Services become visible to the programs), and any later.
type connectionAdopter interface {
	AdoptAtNextSync(flows []reconcile.AdoptedFlow)
	Adopted() (*reconcile.AdoptResult, error)
	Adopt(flows []reconcile.AdoptedFlow) (reconcile.AdoptResult, error)
}

var _ connectionAdopter = (*reconcile.Datapath)(nil)

// adoptNotEstablished counts TCP connections not adopted because they
// were not established (opening, or closing: their last segments are
// lost, as at any proxy switch).
const adoptNotEstablished = "not-established"

// adoption is the take-over at the first sync: the flows found before it,
// handed to the datapath for that sync.
type adoption struct {
	start          time.Time
	flows          []reconcile.AdoptedFlow
	notEstablished int
}

// prepareAdoption reads netfilter's conntrack before the first sync and
// hands its translated flows to the datapath.
func (s *syncer) prepareAdoption() *adoption {
	a, ok := s.dp.(connectionAdopter)
	if !ok {
		return nil
	}
	ad := &adoption{start: time.Now()}
	var err error
	if ad.flows, ad.notEstablished, err = translatedFlows(); err != nil {
		s.log.Warn("Cannot read netfilter's conntrack: connections another proxy translated are not taken over", "err", err)
		s.metrics.AdoptedFlows.WithLabelValues("conntrack-unreadable").Inc()
		return nil
	}
	a.AdoptAtNextSync(ad.flows)
	return ad
}

// finishAdoption runs after the first sync: it takes the result, adopts
// the flows opened since the first read (before the sync made the
// Services visible, kube-proxy's rules still served new connections), and
// deletes netfilter's entries of every flow taken over.
func (s *syncer) finishAdoption(ad *adoption) {
	a := s.dp.(connectionAdopter)
	done, err := a.Adopted()
	if err != nil {
		s.log.Warn("Some connections could not be taken over", "err", err)
	}
	if done == nil {
		return // the sync failed before it adopted: the next one has them
	}
	res := *done
	seen := map[flowKey]bool{}
	for _, f := range ad.flows {
		seen[adoptedKey(f.Proto, f.Client, f.Frontend)] = true
	}
	if later, notEst, err := translatedFlows(); err == nil {
		var fresh []reconcile.AdoptedFlow
		for _, f := range later {
			if !seen[adoptedKey(f.Proto, f.Client, f.Frontend)] {
				fresh = append(fresh, f)
			}
		}
		more, err := a.Adopt(fresh)
		if err != nil {
			s.log.Warn("Some connections could not be taken over", "err", err)
		}
		res.Adopted = append(res.Adopted, more.Adopted...)
		for why, n := range more.Skipped {
			res.Skipped[why] += n
		}
		ad.notEstablished = max(ad.notEstablished, notEst)
	}
	deleted, derr := deleteNetfilterFlows(res.Adopted)
	if derr != nil {
		s.log.Warn("Cannot delete netfilter's entries of the connections taken over (unused, they expire)", "err", derr)
	}
	s.metrics.AdoptedFlows.WithLabelValues("adopted").Add(float64(len(res.Adopted)))
	res.Skipped[adoptNotEstablished] += ad.notEstablished
	for why, n := range res.Skipped {
		s.metrics.AdoptedFlows.WithLabelValues(why).Add(float64(n))
	}
	if len(res.Adopted) > 0 || len(ad.flows) > 0 || ad.notEstablished > 0 {
		s.log.Info("Took over the connections another proxy translated", "adopted", len(res.Adopted),
			"skipped", res.Skipped, "netfilterEntriesDeleted", deleted, "took", time.Since(ad.start))
	}
}

// translatedFlows lists netfilter's translated connections, both
// families: those whose reply comes from another address or port than
// their original destination (DNAT, or an IPVS NAT forward). TCP ones
// must be established; the others are counted.
func translatedFlows() (flows []reconcile.AdoptedFlow, notEstablished int, err error) {
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		list, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, 0, fmt.Errorf("list conntrack (family %d): %w", fam, err)
		}
		for _, fl := range list {
			f, ok := adoptedFlowOf(fl)
			if !ok {
				continue
			}
			if tcp, isTCP := fl.ProtoInfo.(*netlink.ProtoInfoTCP); f.Proto == model.TCP && (!isTCP || tcp.State != tcpConntrackEstablished) {
				notEstablished++
				continue
			}
			flows = append(flows, f)
		}
	}
	return flows, notEstablished, nil
}

// tcpConntrackEstablished is netfilter's TCP_CONNTRACK_ESTABLISHED.
const tcpConntrackEstablished = 3

// adoptedFlowOf reads a translated TCP or UDP connection of the default
// zone from netfilter's entry.
func adoptedFlowOf(fl *netlink.ConntrackFlow) (reconcile.AdoptedFlow, bool) {
	var proto model.Protocol
	switch fl.Forward.Protocol {
	case unix.IPPROTO_TCP:
		proto = model.TCP
	case unix.IPPROTO_UDP:
		proto = model.UDP
	default:
		return reconcile.AdoptedFlow{}, false
	}
	if fl.Zone != 0 {
		return reconcile.AdoptedFlow{}, false
	}
	ap := func(ip []byte, port uint16) (netip.AddrPort, bool) {
		a, ok := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port), ok
	}
	client, ok1 := ap(fl.Forward.SrcIP, fl.Forward.SrcPort)
	frontend, ok2 := ap(fl.Forward.DstIP, fl.Forward.DstPort)
	backend, ok3 := ap(fl.Reverse.SrcIP, fl.Reverse.SrcPort)
	replyTo, ok4 := ap(fl.Reverse.DstIP, fl.Reverse.DstPort)
	if !ok1 || !ok2 || !ok3 || !ok4 || backend == frontend {
		return reconcile.AdoptedFlow{}, false
	}
	return reconcile.AdoptedFlow{Proto: proto, Client: client, Frontend: frontend, Backend: backend, ReplyTo: replyTo,
		Remaining: time.Duration(fl.TimeOut) * time.Second}, true
}

// flowKey is a connection as netfilter's original direction names it.
type flowKey struct {
	proto            model.Protocol
	client, frontend netip.AddrPort
}

func adoptedKey(proto model.Protocol, client, frontend netip.AddrPort) flowKey {
	return flowKey{proto, client, frontend}
}

// adoptedFilter matches netfilter's entries of the adopted connections.
type adoptedFilter map[flowKey]bool

func (f adoptedFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	a, ok := adoptedFlowOf(fl)
	return ok && f[adoptedKey(a.Proto, a.Client, a.Frontend)]
}

// deleteNetfilterFlows deletes netfilter's entries of the adopted flows
// but the masqueraded ones, whose entries hold their masquerade ports
// against netfilter's MASQUERADE (reconcile.Datapath.Adopt).
func deleteNetfilterFlows(adopted []reconcile.AdoptedFlow) (uint, error) {
	f := adoptedFilter{}
	for _, a := range adopted {
		if !a.Masqueraded() {
			f[adoptedKey(a.Proto, a.Client, a.Frontend)] = true
		}
	}
	if len(f) == 0 {
		return 0, nil
	}
	var n uint
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		d, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		n += d
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}
