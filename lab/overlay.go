package lab

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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
	// wg: the WireGuard peers' keys and allowed IPs; nil on other kinds.
	wg map[*Node]*wgNode
	// addrs: the nodes' overlay addresses when they are global ones
	// (FlannelVXLAN); nil: link-scoped ones (overlayAddr).
	addrs map[*Node]netip.Addr
}

// addr is node's address on the overlay device.
func (o *Overlay) addr(node *Node) netip.Addr {
	if a, ok := o.addrs[node]; ok {
		return a
	}
	return overlayAddr(node)
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

// join builds overlay o between nodes a and b of this lab (how names the
// kind in errors), under the lab's topology lock: links, when not nil,
// once (what both ends share), then each(n, peer) for each end, a's
// first.
func (l *Lab) join(a, b *Node, how string, o *Overlay, links func() error, each func(n, peer *Node) error) (*Overlay, error) {
	if a == b || a.lab != l || b.lab != l {
		return nil, fmt.Errorf("lab: cannot join %s and %s by %s", a.Name, b.Name, how)
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	o.A, o.B = a, b
	if links != nil {
		if err := links(); err != nil {
			return nil, err
		}
	}
	for _, p := range [][2]*Node{{a, b}, {b, a}} {
		if err := each(p[0], p[1]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// VXLAN builds the overlay between a and b, whose IPv4 primary addresses
// must reach each other (Link routes them over a fabric).
func (l *Lab) VXLAN(a, b *Node) (*Overlay, error) {
	return l.vxlan(a, b, nil)
}

// FlannelVXLAN is VXLAN with flannel's own addressing: each node's vxlan0
// holds the first address of its pod CIDR (aAddr, bAddr: 10.244.0.0 for
// 10.244.0.0/24) as a global /32, which is the source the node's
// masquerade picks for packets it sends over the overlay. A node is then
// multi-homed: its primary address on the fabric, another on the tunnel.
func (l *Lab) FlannelVXLAN(a, b *Node, aAddr, bAddr netip.Addr) (*Overlay, error) {
	return l.vxlan(a, b, map[*Node]netip.Addr{a: aAddr, b: bAddr})
}

func (l *Lab) vxlan(a, b *Node, addrs map[*Node]netip.Addr) (*Overlay, error) {
	o := &Overlay{Dev: "vxlan0", addrs: addrs}
	return l.join(a, b, "VXLAN", o, nil, o.build)
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
	idx, err := o.upWithAddr(n, peer, 0)
	if err != nil {
		return err
	}
	// The peer's overlay address has the peer's MAC; that MAC lives
	// behind the peer's node address.
	if err := o.peerNeighbour(n, peer, idx); err != nil {
		return err
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
	via := o.addr(to)
	if o.ipip {
		via = to.Primary(false)
	}
	// The node's own packets leave from its primary address, except on
	// flannel's overlay, whose routes leave the choice to the kernel (the
	// overlay device's address).
	src := from.Primary(false)
	if o.addrs != nil {
		src = netip.Addr{}
	}
	for _, d := range dsts {
		if err := from.addRoute(d, via, o.Dev, src); err != nil {
			return err
		}
	}
	if o.wg != nil {
		// WireGuard sends a packet to the peer whose allowed IPs hold its
		// destination, and takes one from a peer only if they hold its
		// source: what from routes to the peer, the peer accepts from it.
		o.wg[from].allowed = append(o.wg[from].allowed, dsts...)
		return o.wgPeer(from, to)
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
	o := &Overlay{Dev: "tunl0", ipip: true}
	return l.join(a, b, "IPIP", o, nil, func(n, peer *Node) error {
		if _, err := o.upWithAddr(n, peer, 1480); err != nil {
			return fmt.Errorf("%w (is the ipip module loaded?)", err)
		}
		return nil
	})
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

// VLANID is the 802.1Q VLAN the lab's VLAN overlay tags its frames with.
const VLANID = 100

// VLAN joins a and b by an 802.1Q VLAN on the fabric veth between them, as
// a node whose cluster network is a tagged VLAN on a trunk port
// (eth0.100): a "vlan100" device on each node's fabric end with a /32
// overlay address; the peer's overlay address is resolved by ARP over the
// VLAN. Route sends prefixes through it via the peer's overlay address, on
// link; everything else stays untagged on the fabric. The kernel needs the
// 8021q module (not on this host: the VM rig's kernels have it).
func (l *Lab) VLAN(a, b *Node) (*Overlay, error) {
	o := &Overlay{Dev: fmt.Sprintf("vlan%d", VLANID)}
	return l.join(a, b, "VLAN", o, nil, func(n, peer *Node) error {
		lower := -1
		for _, ifc := range n.ifaces {
			if ifc.Role == RoleFabric && ifc.Peer == peer.NS {
				lower = ifc.Index
				break
			}
		}
		if lower < 0 {
			return fmt.Errorf("lab: VLAN needs a fabric between %s and %s (Link)", n.Name, peer.Name)
		}
		vl := &netlink.Vlan{
			LinkAttrs:    netlink.LinkAttrs{Name: o.Dev, ParentIndex: lower},
			VlanId:       VLANID,
			VlanProtocol: netlink.VLAN_PROTOCOL_8021Q,
		}
		if err := n.nl.LinkAdd(vl); err != nil {
			return fmt.Errorf("%s: add vlan %s (is the 8021q module loaded?): %w", n.Name, o.Dev, err)
		}
		_, err := o.upWithAddr(n, peer, 0)
		return err
	})
}

// upWithAddr records node n's overlay device, sets its MTU (unless 0),
// brings it up with rp_filter off, gives it n's /32 overlay address and
// returns its index.
func (o *Overlay) upWithAddr(n, peer *Node, mtu int) (int, error) {
	link, err := n.nl.LinkByName(o.Dev)
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w", n.Name, o.Dev, err)
	}
	idx := link.Attrs().Index
	n.ifaces = append(n.ifaces, Iface{Name: o.Dev, Index: idx, Role: RoleFabric, Peer: peer.NS, PeerIface: o.Dev})
	if mtu > 0 {
		if err := n.nl.LinkSetMTU(link, mtu); err != nil {
			return 0, fmt.Errorf("%s: %s mtu: %w", n.Name, o.Dev, err)
		}
	}
	if err := n.nl.LinkSetUp(link); err != nil {
		return 0, fmt.Errorf("%s: %s up: %w", n.Name, o.Dev, err)
	}
	if err := n.Sysctl("net/ipv4/conf/"+o.Dev+"/rp_filter", "0"); err != nil {
		return 0, err
	}
	scope := netlink.SCOPE_LINK
	if _, ok := o.addrs[n]; ok {
		scope = netlink.SCOPE_UNIVERSE
	}
	return idx, n.addAddr(o.Dev, netip.PrefixFrom(o.addr(n), 32), scope)
}

// WireGuardPort is the UDP port the lab's WireGuard devices listen on
// (WireGuard's customary one; Calico's WireGuard mode uses 51820 too).
const WireGuardPort = 51820

// wgNode is one node's WireGuard identity and what it routes to its peer.
type wgNode struct {
	private, public string // base64, as wg(8) reads and prints them
	allowed         []netip.Prefix
}

// WireGuard joins a and b by an encrypted WireGuard tunnel over their
// fabric, as Calico's and Cilium's WireGuard modes do: a "wg0" device on
// each node (MTU 1420, UDP 51820, its own key pair) whose one peer is the
// other node at its node address. The peer's allowed IPs start with its
// overlay and node addresses; Route adds what a node routes through the
// tunnel (via the peer's overlay address, on link). wg0 has no link-layer
// header. It needs the wireguard module and wg(8) (the VM rig's guest has
// both; this host's kernel has no wireguard).
func (l *Lab) WireGuard(a, b *Node) (*Overlay, error) {
	o := &Overlay{Dev: "wg0", wg: map[*Node]*wgNode{}}
	for _, n := range []*Node{a, b} {
		key, err := ecdh.X25519().GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		o.wg[n] = &wgNode{
			private: base64.StdEncoding.EncodeToString(key.Bytes()),
			public:  base64.StdEncoding.EncodeToString(key.PublicKey().Bytes()),
		}
	}
	return l.join(a, b, "WireGuard", o, nil, func(n, peer *Node) error {
		if err := n.nl.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: o.Dev, MTU: 1420}}); err != nil {
			return fmt.Errorf("%s: add wireguard %s (is the wireguard module loaded?): %w", n.Name, o.Dev, err)
		}
		if err := o.wgSetKey(n); err != nil {
			return err
		}
		if err := o.wgPeer(n, peer); err != nil {
			return err
		}
		_, err := o.upWithAddr(n, peer, 0)
		return err
	})
}

// wgSetKey gives n's wg0 its private key (through a file only root can
// read, as wg(8) wants it) and listening port.
func (o *Overlay) wgSetKey(n *Node) error {
	dir, err := os.MkdirTemp("", "xvs-lab-wg-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte(o.wg[n].private+"\n"), 0o600); err != nil {
		return err
	}
	return wg(n, "set", o.Dev, "listen-port", fmt.Sprint(WireGuardPort), "private-key", key)
}

// wgPeer (re)writes peer as n's one WireGuard peer: its endpoint is the
// peer's node address; its allowed IPs its overlay and node addresses and
// whatever n routes to it.
func (o *Overlay) wgPeer(n, peer *Node) error {
	allowed := []string{netip.PrefixFrom(o.addr(peer), 32).String(), netip.PrefixFrom(peer.Primary(false), 32).String()}
	for _, p := range o.wg[n].allowed {
		allowed = append(allowed, p.String())
	}
	return wg(n, "set", o.Dev, "peer", o.wg[peer].public,
		"endpoint", netip.AddrPortFrom(peer.Primary(false), WireGuardPort).String(),
		"allowed-ips", strings.Join(allowed, ","))
}

// wg runs wg(8) in n's network namespace.
func wg(n *Node, args ...string) error {
	bin, err := exec.LookPath("wg")
	if err != nil {
		return fmt.Errorf("lab: wg(8) (Debian's wireguard-tools): %w", err)
	}
	if out, err := Run(n.NS, bin, args...); err != nil {
		return fmt.Errorf("%s: wg %s: %v: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return nil
}

// Bond joins a and b by a static link aggregation of two veths ("bondN"
// ends on each side), as a node with two NICs bonded to a switch: "bond0"
// on each node, balance-xor with the layer3+4 hash (flows spread over both
// links; no LACP negotiation to wait for), a /32 overlay address, the
// peer's resolved by ARP over the bond. Route sends prefixes through it via
// the peer's overlay address, on link. The programs see each packet first
// on the link it arrived by, then again on bond0. The kernel needs the
// bonding module (not on this host: the VM rig's kernels have it).
func (l *Lab) Bond(a, b *Node) (*Overlay, error) {
	o := &Overlay{Dev: "bond0"}
	return l.join(a, b, "bond", o, func() error { return o.bondLinks(a, b) }, func(n, peer *Node) error {
		_, err := o.upWithAddr(n, peer, 0)
		return err
	})
}

// bondLinks makes bond0 on a and b and enslaves two veths between them to
// it, an end of each on each node.
func (o *Overlay) bondLinks(a, b *Node) error {
	for _, n := range []*Node{a, b} {
		bond := netlink.NewLinkBond(netlink.LinkAttrs{Name: o.Dev})
		bond.Mode = netlink.BOND_MODE_BALANCE_XOR
		bond.XmitHashPolicy = netlink.BOND_XMIT_HASH_POLICY_LAYER3_4
		bond.Miimon = 100
		if err := n.nl.LinkAdd(bond); err != nil {
			return fmt.Errorf("%s: add bond %s (is the bonding module loaded?): %w", n.Name, o.Dev, err)
		}
	}
	for range 2 {
		aName, bName := a.nextName("bond"), b.nextName("bond")
		if _, err := a.addVeth(aName, b.NS, bName, RoleFabric); err != nil {
			return err
		}
		bl, err := b.nl.LinkByName(bName)
		if err != nil {
			return fmt.Errorf("%s: %w", b.Name, err)
		}
		b.ifaces = append(b.ifaces, Iface{Name: bName, Index: bl.Attrs().Index, Role: RoleFabric, Peer: a.NS, PeerIface: aName})
		for _, end := range []struct {
			n   *Node
			dev string
		}{{a, aName}, {b, bName}} {
			if err := end.n.enslave(end.dev, o.Dev); err != nil {
				return err
			}
		}
	}
	return nil
}

// enslave makes dev a port of master (it must be down meanwhile).
func (n *Node) enslave(dev, master string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", n.Name, dev, err)
	}
	m, err := n.nl.LinkByName(master)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", n.Name, master, err)
	}
	if err := n.nl.LinkSetDown(link); err != nil {
		return fmt.Errorf("%s: %s down: %w", n.Name, dev, err)
	}
	if err := n.nl.LinkSetMaster(link, m); err != nil {
		return fmt.Errorf("%s: %s master %s: %w", n.Name, dev, master, err)
	}
	if err := n.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s: %s up: %w", n.Name, dev, err)
	}
	return nil
}

// GenevePort is the IANA Geneve port.
const GenevePort = 6081

// Geneve joins a and b by a Geneve tunnel (the encapsulation Cilium and
// OVN-Kubernetes use): "geneve0" on each node (VNI 1, UDP 6081, MTU 1450)
// whose one remote is the peer's node address, a /32 overlay address and a
// permanent neighbour entry for the peer's. Route sends prefixes through
// it via the peer's overlay address, on link. The kernel needs the geneve
// module (not on this host: the VM rig's kernels have it).
func (l *Lab) Geneve(a, b *Node) (*Overlay, error) {
	o := &Overlay{Dev: "geneve0"}
	return l.join(a, b, "Geneve", o, nil, func(n, peer *Node) error {
		gn := &netlink.Geneve{
			LinkAttrs: netlink.LinkAttrs{Name: o.Dev, MTU: 1450, HardwareAddr: overlayMAC(n)},
			ID:        1,
			Remote:    net.IP(peer.Primary(false).AsSlice()),
			Dport:     GenevePort,
		}
		if err := n.nl.LinkAdd(gn); err != nil {
			return fmt.Errorf("%s: add geneve %s (is the geneve module loaded?): %w", n.Name, o.Dev, err)
		}
		idx, err := o.upWithAddr(n, peer, 0)
		if err != nil {
			return err
		}
		return o.peerNeighbour(n, peer, idx)
	})
}

// peerNeighbour gives node n a permanent neighbour entry for peer's overlay
// address, with peer's overlay MAC, on the overlay device (index idx).
func (o *Overlay) peerNeighbour(n, peer *Node, idx int) error {
	if err := n.nl.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: net.IP(o.addr(peer).AsSlice()), HardwareAddr: overlayMAC(peer)}); err != nil {
		return fmt.Errorf("%s: neighbour on %s: %w", n.Name, o.Dev, err)
	}
	return nil
}
