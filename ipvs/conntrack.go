package ipvs

import (
	"errors"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/model"
)

// conntrackCleaner deletes stale UDP conntrack entries.
type conntrackCleaner interface {
	CleanupUDP(serving map[vsKey]map[netip.Addr]bool, gone map[vsKey]bool) error
}

// staleUDP is kube-proxy's conntrack reconciler rule (SEMANTICS 3.17): a UDP
// entry whose original destination is a UDP frontend is stale when its
// reply source is not a serving endpoint of that port (also when the port
// has no serving endpoints at all), or when the frontend was removed.
// TCP is never touched: expire_nodest_conn ends flows to removed real
// servers.
type staleUDP struct {
	serving map[vsKey]map[netip.Addr]bool
	gone    map[vsKey]bool
}

func (f staleUDP) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return false
	}
	k := vsKey{Addr: dst.Unmap(), Proto: model.UDP, Port: flow.Forward.DstPort}
	if f.gone[k] {
		return true
	}
	serving, ok := f.serving[k]
	if !ok {
		return false
	}
	src, _ := netip.AddrFromSlice(flow.Reverse.SrcIP)
	return !serving[src.Unmap()]
}

type netlinkConntrack struct{}

func (netlinkConntrack) CleanupUDP(serving map[vsKey]map[netip.Addr]bool, gone map[vsKey]bool) error {
	if len(serving) == 0 && len(gone) == 0 {
		return nil
	}
	f := staleUDP{serving: serving, gone: gone}
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
