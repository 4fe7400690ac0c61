package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VXLANPort is the IANA VXLAN port the overlay uses, as flannel's vxlan
// backend and Calico's VXLAN mode do.
const VXLANPort = 4789

// Overlay is a VXLAN network between two nodes over their fabric, shaped
// like flannel's vxlan backend: a "vxlan0" device on each node (VNI 1,
// UDP 4789, MTU 1450, no learning) with a /32 overlay address, a permanent
// neighbour entry for the peer's overlay address and a forwarding-database
// entry sending the peer's MAC to its node address. Route sends prefixes
// (the peer's pod CIDR) through it: via the peer's overlay address, on
// link.
type Overlay struct {
	A, B *Node
	Dev  string
	// ipip: the peer's next hop is its node address (the tunnel's outer
	// destination), not an overlay address.
	ipip bool
}

// overlayAddr is node's address on the overlay device (flannel gives the
// node the .0 of its pod CIDR; a link-scoped address does the same job).
func overlayAddr(node *Node) netip.Addr {
	return netip.AddrFrom4([4]byte{169, 254, 253, byte(node.Index)})
}

// overlayMAC is node's MAC on the overlay device.
func overlayMAC(node *Node) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0x58, 0x4c, 0x00, 0x00, byte(node.Index)}
}

// VXLAN builds the overlay between a and b, whose IPv4 primary addresses
// must reach each other (Link routes them over a fabric).
func (l *Lab) VXLAN(a, b *Node) (*Overlay, error) {
	if a == b || a.lab != l || b.lab != l {
		return nil, fmt.Errorf("lab: cannot join %s and %s by VXLAN", a.Name, b.Name)
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	o := &Overlay{A: a, B: b, Dev: "vxlan0"}
	for _, p := range [][2]*Node{{a, b}, {b, a}} {
		if err := o.build(p[0], p[1]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (o *Overlay) build(n, peer *Node) error {
	local, remote := n.Primary(false), peer.Primary(false)
	if !local.IsValid() || !remote.IsValid() {
		return fmt.Errorf("lab: VXLAN needs IPv4 node addresses on %s and %s", n.Name, peer.Name)
	}
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: o.Dev, MTU: 1450, HardwareAddr: overlayMAC(n)},
		VxlanId:   1,
		SrcAddr:   net.IP(local.AsSlice()),
		Port:      VXLANPort,
		Learning:  false,
	}
	if err := n.nl.LinkAdd(vx); err != nil {
		return fmt.Errorf("%s: add vxlan %s: %w", n.Name, o.Dev, err)
	}
	link, err := n.nl.LinkByName(o.Dev)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", n.Name, o.Dev, err)
	}
	n.ifaces = append(n.ifaces, Iface{Name: o.Dev, Index: link.Attrs().Index, Role: RoleFabric, Peer: peer.NS, PeerIface: o.Dev})
	if err := n.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s: %s up: %w", n.Name, o.Dev, err)
	}
	if err := n.Sysctl("net/ipv4/conf/"+o.Dev+"/rp_filter", "0"); err != nil {
		return err
	}
	if err := n.addAddr(o.Dev, netip.PrefixFrom(overlayAddr(n), 32), netlink.SCOPE_LINK); err != nil {
		return err
	}
	idx := link.Attrs().Index
	// The peer's overlay address has the peer's MAC; that MAC lives
	// behind the peer's node address.
	if err := n.nl.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: net.IP(overlayAddr(peer).AsSlice()), HardwareAddr: overlayMAC(peer)}); err != nil {
		return fmt.Errorf("%s: neighbour on %s: %w", n.Name, o.Dev, err)
	}
	if err := n.nl.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, IP: net.IP(remote.AsSlice()), HardwareAddr: overlayMAC(peer)}); err != nil {
		return fmt.Errorf("%s: fdb entry on %s: %w", n.Name, o.Dev, err)
	}
	return nil
}

// Route sends dsts (IPv4 prefixes) from node `from` through the overlay to
// the other node, replacing any route to them (the fabric's included).
func (o *Overlay) Route(from *Node, dsts ...netip.Prefix) error {
	to := o.B
	switch from {
	case o.A:
	case o.B:
		to = o.A
	default:
		return fmt.Errorf("lab: %s is not on overlay %s-%s", from.Name, o.A.Name, o.B.Name)
	}
	via := overlayAddr(to)
	if o.ipip {
		via = to.Primary(false)
	}
	for _, d := range dsts {
		if err := from.addRoute(d, via, o.Dev, from.Primary(false)); err != nil {
			return err
		}
	}
	return nil
}

// IPIP joins a and b the way Calico's IPIP mode does: each node's
// fallback IPIP device "tunl0" (an NBMA tunnel: no local or remote address,
// created in every namespace while the ipip module is loaded) up, with a
// /32 address and MTU 1480; Route sends prefixes via the peer's node
// address on tunl0, on link, so the tunnel takes each packet's outer
// destination from its route. The nodes' IPv4 primary addresses must reach
// each other (Link routes them over a fabric).
func (l *Lab) IPIP(a, b *Node) (*Overlay, error) {
	if a == b || a.lab != l || b.lab != l {
		return nil, fmt.Errorf("lab: cannot join %s and %s by IPIP", a.Name, b.Name)
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	o := &Overlay{A: a, B: b, Dev: "tunl0", ipip: true}
	for _, p := range [][2]*Node{{a, b}, {b, a}} {
		n, peer := p[0], p[1]
		link, err := n.nl.LinkByName(o.Dev)
		if err != nil {
			return nil, fmt.Errorf("%s: %s (is the ipip module loaded?): %w", n.Name, o.Dev, err)
		}
		n.ifaces = append(n.ifaces, Iface{Name: o.Dev, Index: link.Attrs().Index, Role: RoleFabric, Peer: peer.NS, PeerIface: o.Dev})
		if err := n.nl.LinkSetMTU(link, 1480); err != nil {
			return nil, fmt.Errorf("%s: %s mtu: %w", n.Name, o.Dev, err)
		}
		if err := n.nl.LinkSetUp(link); err != nil {
			return nil, fmt.Errorf("%s: %s up: %w", n.Name, o.Dev, err)
		}
		if err := n.Sysctl("net/ipv4/conf/"+o.Dev+"/rp_filter", "0"); err != nil {
			return nil, err
		}
		if err := n.addAddr(o.Dev, netip.PrefixFrom(overlayAddr(n), 32), netlink.SCOPE_LINK); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Stats reads node's overlay device counters: bytes received and sent
// (packet counts say little: GRO and GSO count a super-packet once).
func (o *Overlay) Stats(node *Node) (rx, tx uint64, err error) {
	link, err := node.nl.LinkByName(o.Dev)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %s: %w", node.Name, o.Dev, err)
	}
	s := link.Attrs().Statistics
	if s == nil {
		return 0, 0, fmt.Errorf("%s: %s: no statistics", node.Name, o.Dev)
	}
	return s.RxBytes, s.TxBytes, nil
}
