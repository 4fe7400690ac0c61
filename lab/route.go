package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func ipNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	a := p.Addr().Unmap()
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(p.Bits(), a.BitLen())}
}

// AddAddr adds p (address with its prefix length) to dev inside the
// namespace. IPv6 addresses skip DAD so they are usable immediately.
func (n *NS) AddAddr(dev string, p netip.Prefix) error {
	return n.addAddr(dev, p, netlink.SCOPE_UNIVERSE)
}

func (n *NS) addAddr(dev string, p netip.Prefix, scope netlink.Scope) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", n.Name, dev, err)
	}
	a := p.Addr().Unmap()
	addr := &netlink.Addr{
		IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(p.Bits(), a.BitLen())},
		Scope: int(scope),
	}
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD
		addr.Scope = 0 // IPv6 derives scope from the address itself
	}
	if err := n.nl.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("%s: add %s to %s: %w", n.Name, p, dev, err)
	}
	return nil
}

// AddRoute installs (or replaces) a route to dst. With via unset it is a
// device route on dev (neighbours resolved on the link). With via and dev
// set, an IPv4 next hop is marked onlink, so it needs no covering subnet.
// With dev empty, the kernel finds the device from via.
func (n *NS) AddRoute(dst netip.Prefix, via netip.Addr, dev string) error {
	return n.addRoute(dst, via, dev, netip.Addr{})
}

// addRoute is AddRoute with a preferred source (RTA_PREFSRC), which steers
// the source the namespace picks for its own and masqueraded traffic.
func (n *NS) addRoute(dst netip.Prefix, via netip.Addr, dev string, src netip.Addr) error {
	r := &netlink.Route{Dst: ipNet(dst)}
	if dev != "" {
		link, err := n.nl.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", n.Name, dev, err)
		}
		r.LinkIndex = link.Attrs().Index
	}
	if via.IsValid() {
		via = via.Unmap()
		r.Gw = net.IP(via.AsSlice())
		// IPv6 link-local next hops are on-link by definition; the flag
		// would only add kernel checks.
		if dev != "" && via.Is4() {
			r.Flags = int(netlink.FLAG_ONLINK)
		}
	} else if dst.Addr().Is4() {
		r.Scope = netlink.SCOPE_LINK
	}
	if src.IsValid() && src.Is4() == dst.Addr().Is4() {
		r.Src = net.IP(src.Unmap().AsSlice())
	}
	if err := n.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("%s: route %s via %v dev %q: %w", n.Name, dst, via, dev, err)
	}
	return nil
}

// AddBlackhole installs (or replaces with) a blackhole route: matching
// packets are discarded silently, which probes see as a TIMEOUT.
func (n *NS) AddBlackhole(dst netip.Prefix) error {
	r := &netlink.Route{Dst: ipNet(dst), Type: unix.RTN_BLACKHOLE}
	if err := n.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("%s: blackhole %s: %w", n.Name, dst, err)
	}
	return nil
}

// DelRoute deletes the main-table route to dst, whatever its type or scope.
func (n *NS) DelRoute(dst netip.Prefix) error {
	r := &netlink.Route{Dst: ipNet(dst), Scope: netlink.SCOPE_NOWHERE}
	if err := n.nl.RouteDel(r); err != nil {
		return fmt.Errorf("%s: delete route %s: %w", n.Name, dst, err)
	}
	return nil
}

// AdvertiseMSS makes the namespace's default route of addr's family
// advertise mss in its TCP SYNs, whatever its own link's MTU (ip route
// ... advmss): a host behind a narrower link than its peers believe, as
// behind a tunnel without MSS clamping. Its peers then send segments that
// only path MTU discovery shrinks.
func (n *NS) AdvertiseMSS(v6 bool, mss int) error {
	family := netlink.FAMILY_V4
	if v6 {
		family = netlink.FAMILY_V6
	}
	routes, err := n.nl.RouteList(nil, family)
	if err != nil {
		return fmt.Errorf("%s: routes: %w", n.Name, err)
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		r.AdvMSS = mss
		if err := n.nl.RouteReplace(&r); err != nil {
			return fmt.Errorf("%s: default route advmss %d: %w", n.Name, mss, err)
		}
		return nil
	}
	return fmt.Errorf("%s: no default route to advertise MSS %d on", n.Name, mss)
}
