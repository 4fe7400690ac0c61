package lab

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// Gateways every pod and client uses as default next hop. They live on each
// node-side veth end with link scope, so the node never uses them as source.
var (
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
	GatewayV6 = netip.MustParseAddr("fe80::1")
	// routerGatewayV4: the same on a client's own downlink
	// (AddClientBehind).
	routerGatewayV4 = netip.MustParseAddr("169.254.2.1")
)

// Role says what sits behind a node interface; the load balancer attaches
// its programs according to it.
type Role int

const (
	RolePod      Role = iota // veth to a pod ("lxcN")
	RoleExternal             // link to an external client ("extN")
	RoleFabric               // link to another node ("fabN"); in a real cluster this is eth0 too
)

func (r Role) String() string {
	return [...]string{"pod", "external", "fabric"}[r]
}

// Iface is one node-side interface.
type Iface struct {
	Name      string // name inside the node namespace (<= 15 chars)
	Index     int    // ifindex inside the node namespace
	Role      Role
	Peer      *NS    // namespace at the other end (pod, client, or peer node)
	PeerIface string // interface name at the other end
}

// Node is a namespace that routes between its pods, clients and peer nodes.
type Node struct {
	*NS
	Index int // 1-based, unique in the lab; selects the node's fabric address

	ifaces []Iface
}

// Ifaces returns the node-side interfaces with one of the roles (all when
// none given), in creation order.
func (n *Node) Ifaces(roles ...Role) []Iface {
	n.lab.topo.Lock()
	defer n.lab.topo.Unlock()
	var out []Iface
	for _, i := range n.ifaces {
		if len(roles) == 0 || slices.Contains(roles, i.Role) {
			out = append(out, i)
		}
	}
	return out
}

// IfaceNames is Ifaces reduced to names.
func (n *Node) IfaceNames(roles ...Role) []string {
	var out []string
	for _, i := range n.Ifaces(roles...) {
		out = append(out, i.Name)
	}
	return out
}

// Primary returns the node's first address of addr's family (the source the
// node uses towards pods and clients of that family), or the zero Addr.
func (n *Node) Primary(v6 bool) netip.Addr {
	for _, a := range n.Addrs {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

// nextName picks the first free "<base>N" in the node (N from 1): names stay
// short and predictable whatever the pod or client is called.
func (n *Node) nextName(base string) string {
	for i := 1; ; i++ {
		name := fmt.Sprintf("%s%d", base, i)
		if !slices.ContainsFunc(n.ifaces, func(f Iface) bool { return f.Name == name }) {
			return name
		}
	}
}

// AddNode creates a forwarding node namespace; addrs are its node IPs
// (first of each family = primary), put on lo as host addresses.
func (l *Lab) AddNode(name string, addrs ...netip.Addr) (*Node, error) {
	if err := l.checkAddrs(addrs); err != nil {
		return nil, err
	}
	if len(l.Nodes()) >= 254 { // the index is the last byte of the fabric address
		return nil, fmt.Errorf("lab: too many nodes")
	}
	ns, err := l.newNS(name, KindNode)
	if err != nil {
		return nil, err
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	l.mu.Lock()
	node := &Node{NS: ns, Index: len(l.nodes) + 1}
	l.nodes = append(l.nodes, node)
	l.mu.Unlock()
	for _, a := range addrs {
		if err := ns.AddAddr("lo", netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())); err != nil {
			return nil, err
		}
		ns.Addrs = append(ns.Addrs, a.Unmap())
	}
	return node, nil
}

// AddPod creates a pod namespace attached to node by a veth (node side
// "lxcN", pod side "eth0") and gives it addrs.
func (l *Lab) AddPod(node *Node, name string, addrs ...netip.Addr) (*NS, error) {
	return l.attach(node, name, KindPod, addrs)
}

// AddClient creates an external client namespace attached to node by a veth
// (node side "extN", client side "eth0"). Its default routes point at the
// node, so service, node and pod addresses are all reached through it.
func (l *Lab) AddClient(node *Node, name string, addrs ...netip.Addr) (*NS, error) {
	return l.attach(node, name, KindClient, addrs)
}

func (l *Lab) attach(node *Node, name string, kind Kind, addrs []netip.Addr) (*NS, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("lab: %s %s needs an address", kind, name)
	}
	if err := l.checkAddrs(addrs); err != nil {
		return nil, err
	}
	ns, err := l.newNS(name, kind)
	if err != nil {
		return nil, err
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	role, base := RolePod, "lxc"
	if kind == KindClient {
		role, base = RoleExternal, "ext"
	}
	ifc, err := node.addVeth(node.nextName(base), ns, "eth0", role)
	if err != nil {
		return nil, err
	}
	ns.Node, ns.NodeIface = node, ifc.Name
	var has4, has6 bool
	for _, a := range addrs {
		a = a.Unmap()
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
		if err := ns.AddAddr("eth0", netip.PrefixFrom(a, a.BitLen())); err != nil {
			return nil, err
		}
		ns.Addrs = append(ns.Addrs, a)
		// The node reaches the pod/client straight over the veth (ARP/ND on
		// the link) and answers from its own primary address.
		if err := node.addRoute(netip.PrefixFrom(a, a.BitLen()), netip.Addr{}, ifc.Name, node.Primary(a.Is6())); err != nil {
			return nil, err
		}
	}
	for _, gw := range []netip.Addr{GatewayV4, GatewayV6} {
		if (gw.Is4() && !has4) || (gw.Is6() && !has6) {
			continue
		}
		if err := node.addLinkLocal(ifc.Name, gw); err != nil {
			return nil, err
		}
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if gw.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		if err := ns.AddRoute(def, gw, "eth0"); err != nil {
			return nil, err
		}
	}
	return ns, nil
}

// checkAddrs refuses unusable addresses and addresses another namespace of
// the lab owns: a second /32 route on the node would silently replace the
// first owner's.
func (l *Lab) checkAddrs(addrs []netip.Addr) error {
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("lab: unusable address %v", a)
		}
		if o := l.Owner(a); o != nil {
			return fmt.Errorf("lab: %s already belongs to %s", a, o.Name)
		}
	}
	return nil
}

// addVeth creates a veth whose peer is born directly inside peer (it never
// appears in the caller's namespace), brings both ends up and turns off
// rp_filter on the node end.
func (n *Node) addVeth(name string, peer *NS, peerName string, role Role) (Iface, error) {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(int(peer.Handle)),
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		return Iface{}, fmt.Errorf("%s: add veth %s/%s@%s: %w", n.Name, name, peerName, peer.Name, err)
	}
	// Recorded before configuration so a failure still shows what exists.
	ifc := Iface{Name: name, Role: role, Peer: peer, PeerIface: peerName}
	n.ifaces = append(n.ifaces, ifc)
	link, err := n.nl.LinkByName(name)
	if err == nil {
		err = n.nl.LinkSetUp(link)
	}
	if err != nil {
		return Iface{}, fmt.Errorf("%s: %s up: %w", n.Name, name, err)
	}
	plink, err := peer.nl.LinkByName(peerName)
	if err == nil {
		err = peer.nl.LinkSetUp(plink)
	}
	if err != nil {
		return Iface{}, fmt.Errorf("%s: %s up: %w", peer.Name, peerName, err)
	}
	if err := n.Sysctl("net/ipv4/conf/"+name+"/rp_filter", "0"); err != nil {
		return Iface{}, err
	}
	if peer.Kind == KindNode {
		if err := peer.Sysctl("net/ipv4/conf/"+peerName+"/rp_filter", "0"); err != nil {
			return Iface{}, err
		}
	}
	ifc.Index = link.Attrs().Index
	n.ifaces[len(n.ifaces)-1] = ifc
	return ifc, nil
}

// addLinkLocal puts a next-hop address on a node interface: IPv4 as /32 with
// link scope (never chosen as a source for routed or masqueraded traffic),
// IPv6 as a link-local /64.
func (n *Node) addLinkLocal(dev string, a netip.Addr) error {
	bits := 32
	if a.Is6() {
		bits = 64
	}
	return n.addAddr(dev, netip.PrefixFrom(a, bits), netlink.SCOPE_LINK)
}

// Fabric is a veth between two nodes, standing for the cluster network.
type Fabric struct {
	A, B           *Node
	AIface, BIface string // fabric interface names in A and in B
}

// fabricAddr is node's next-hop address on all of its fabric ends.
func fabricAddr(node *Node, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 13: 0xff, 15: byte(node.Index)})
	}
	return netip.AddrFrom4([4]byte{169, 254, 255, byte(node.Index)})
}

// Link joins two nodes with a fabric veth ("fabN" on each side) and routes
// each node's IPs to the other. Route pod CIDRs (or a default) with
// Fabric.Route.
func (l *Lab) Link(a, b *Node) (*Fabric, error) {
	if a == b || a.lab != l || b.lab != l {
		return nil, fmt.Errorf("lab: cannot link %s to %s", a.Name, b.Name)
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	bName := b.nextName("fab")
	ai, err := a.addVeth(a.nextName("fab"), b.NS, bName, RoleFabric)
	if err != nil {
		return nil, err
	}
	f := &Fabric{A: a, B: b, AIface: ai.Name, BIface: bName}
	bl, err := b.nl.LinkByName(bName)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name, err)
	}
	b.ifaces = append(b.ifaces, Iface{Name: bName, Index: bl.Attrs().Index, Role: RoleFabric, Peer: a.NS, PeerIface: ai.Name})
	for _, v6 := range []bool{false, true} {
		if v6 && !hasIPv6 {
			continue
		}
		if err := a.addLinkLocal(f.AIface, fabricAddr(a, v6)); err != nil {
			return nil, err
		}
		if err := b.addLinkLocal(f.BIface, fabricAddr(b, v6)); err != nil {
			return nil, err
		}
	}
	for _, p := range [][2]*Node{{a, b}, {b, a}} {
		for _, ip := range p[1].Addrs {
			if err := f.route(p[0], netip.PrefixFrom(ip, ip.BitLen())); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Route sends dsts (e.g. the peer's pod CIDR, or a default route for replies
// to external clients) from node `from` across the fabric to the other node.
func (f *Fabric) Route(from *Node, dsts ...netip.Prefix) error {
	f.A.lab.topo.Lock()
	defer f.A.lab.topo.Unlock()
	for _, d := range dsts {
		if err := f.route(from, d); err != nil {
			return err
		}
	}
	return nil
}

func (f *Fabric) route(from *Node, dst netip.Prefix) error {
	to, dev := f.B, f.AIface
	switch from {
	case f.A:
	case f.B:
		to, dev = f.A, f.BIface
	default:
		return fmt.Errorf("lab: %s is not on fabric %s-%s", from.Name, f.A.Name, f.B.Name)
	}
	v6 := dst.Addr().Is6()
	return from.addRoute(dst, fabricAddr(to, v6), dev, from.Primary(v6))
}

// AddClientBehind creates an external client one router further away: a
// namespace attached by a veth (router side "downN", client side "eth0")
// to router, an existing client (itself perhaps behind another), which
// forwards between it and the rest. mtu (0: the default) is the new
// link's, both ends: a narrow link on the way, whose far end answers
// packets too big for it with ICMP errors from its own address. Every hop
// up to the node, and the node, route addr down the chain.
func (l *Lab) AddClientBehind(router *NS, name string, addr netip.Addr, mtu int) (*NS, error) {
	addr = addr.Unmap()
	if router.Node == nil {
		return nil, fmt.Errorf("lab: %s is attached to no node", router.Name)
	}
	ns, err := l.newClientNS(name, addr)
	if err != nil {
		return nil, err
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	dev, err := router.linkDown(ns, mtu)
	if err != nil {
		return nil, err
	}
	fwd := []string{"net/ipv4/ip_forward", "1", "net/ipv4/conf/all/rp_filter", "0", "net/ipv4/conf/" + dev + "/rp_filter", "0"}
	if hasIPv6 {
		fwd = append(fwd, "net/ipv6/conf/all/forwarding", "1")
	}
	if err := router.Sysctl(fwd...); err != nil {
		return nil, err
	}
	host := netip.PrefixFrom(addr, addr.BitLen())
	if err := ns.AddAddr("eth0", host); err != nil {
		return nil, err
	}
	ns.Addrs = append(ns.Addrs, addr)
	ns.Node, ns.NodeIface = router.Node, router.NodeIface
	ns.router, ns.routerDev = router, dev
	// The client's default route points at a next-hop address on the
	// router's side, as a client namespace's points at its node (not
	// the node's own GatewayV4, the router's next hop).
	gw, def, bits := routerGatewayV4, netip.PrefixFrom(netip.IPv4Unspecified(), 0), 32
	if addr.Is6() {
		gw, def, bits = GatewayV6, netip.PrefixFrom(netip.IPv6Unspecified(), 0), 64
	}
	if err := router.addAddr(dev, netip.PrefixFrom(gw, bits), netlink.SCOPE_LINK); err != nil {
		return nil, err
	}
	if err := ns.AddRoute(def, gw, "eth0"); err != nil {
		return nil, err
	}
	if err := router.AddRoute(host, netip.Addr{}, dev); err != nil {
		return nil, err
	}
	return ns, router.routeUpTheChain(host)
}

// linkDown adds the veth from n (the first free "downN") to ns's
// eth0, mtu (0: the default) at both ends, and sets both up.
func (n *NS) linkDown(ns *NS, mtu int) (string, error) {
	dev := ""
	for i := 1; dev == ""; i++ {
		if _, err := n.nl.LinkByName(fmt.Sprintf("down%d", i)); err != nil {
			dev = fmt.Sprintf("down%d", i)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: dev, MTU: mtu},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns.Handle)),
	}
	if mtu > 0 {
		veth.PeerMTU = uint32(mtu)
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		return "", fmt.Errorf("%s: add veth %s/eth0@%s: %w", n.Name, dev, ns.Name, err)
	}
	for _, end := range []struct {
		ns  *NS
		dev string
	}{{n, dev}, {ns, "eth0"}} {
		link, err := end.ns.nl.LinkByName(end.dev)
		if err == nil {
			err = end.ns.nl.LinkSetUp(link)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %s up: %w", end.ns.Name, end.dev, err)
		}
	}
	return dev, nil
}

// routeUpTheChain routes host, a client below n, at every hop above n
// up to the node: each reaches it via the hop below.
func (n *NS) routeUpTheChain(host netip.Prefix) error {
	addr := host.Addr()
	for hop := n; ; hop = hop.router {
		var via netip.Addr
		for _, a := range hop.Addrs {
			if a.Is6() == addr.Is6() {
				via = a
				break
			}
		}
		if !via.IsValid() {
			return fmt.Errorf("lab: %s has no address of %s's family", hop.Name, addr)
		}
		if hop.router == nil {
			return hop.Node.AddRoute(host, via, hop.NodeIface)
		}
		if err := hop.router.AddRoute(host, via, hop.routerDev); err != nil {
			return err
		}
	}
}

// newClientNS creates the namespace of an external client that will own
// addr alone (not yet given to it).
func (l *Lab) newClientNS(name string, addr netip.Addr) (*NS, error) {
	if err := l.checkAddrs([]netip.Addr{addr}); err != nil {
		return nil, err
	}
	return l.newNS(name, KindClient)
}
