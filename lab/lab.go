// Package lab builds throw-away network-namespace topologies with real
// sockets: a node namespace that forwards, pods behind veths, external
// clients behind "external" links and other nodes behind "fabric" links.
// The demo, namespace tests, the conformance runner and benchmarks use it to
// push real packets through the datapath under test.
//
// Every namespace is a named one (/run/netns/<prefix><name>) so it is visible
// to `ip netns list`, to bpftool/tc via nsenter, and to Cleanup after a
// crash. The lab only ever touches namespaces it created; all interfaces
// live inside those namespaces, none in the caller's.
//
// Addressing model (same for IPv4 and IPv6, addresses are netip.Addr):
//   - node IPs sit on the node's lo as /32 (/128), so they are reachable over
//     any link and are what the kernel picks as source for masquerade;
//   - each pod/client gets its IPs as /32 (/128) on its eth0 and a default
//     route via GatewayV4/GatewayV6 onlink; the node-side veth end owns the
//     gateway (link scope, so it is never picked as a source) and has a
//     /32 route to each pod/client IP with the node IP as preferred source;
//   - fabric links give each end a per-node link-local address
//     (169.254.255.<index>, fe80::ff:<index>) used as next hop between nodes.
package lab

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
)

// Lab owns a set of namespaces sharing one prefix. Its methods are safe for
// concurrent use; Close removes everything it created.
type Lab struct {
	Prefix string

	topo    sync.Mutex // serialises topology changes (interface counters, links)
	mu      sync.Mutex // guards the fields below
	spaces  []*NS
	nodes   []*Node
	servers map[io.Closer]struct{} // echo and bulk servers, stopped by Close
	closed  bool
}

// New returns an empty lab. The prefix (e.g. UniquePrefix("t")) is prepended
// to every namespace name; Cleanup(prefix) removes leftovers after a crash.
func New(prefix string) (*Lab, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if err := prepareNetnsDir(); err != nil {
		return nil, err
	}
	return &Lab{Prefix: prefix, servers: map[io.Closer]struct{}{}}, nil
}

// Close stops the echo and bulk servers started in the lab and deletes its
// namespaces (which destroys their veths). Sockets must go first: an open
// socket keeps its namespace alive after the name is gone.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	servers := make([]io.Closer, 0, len(l.servers))
	for s := range l.servers {
		servers = append(servers, s)
	}
	spaces := l.spaces
	l.mu.Unlock()

	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Close())
	}
	for _, n := range slices.Backward(spaces) {
		if n.nl != nil {
			n.nl.Close()
		}
		n.Handle.Close()
		errs = append(errs, deleteNamed(n.Name))
	}
	return errors.Join(errs...)
}

// Namespaces returns every namespace of the lab in creation order.
func (l *Lab) Namespaces() []*NS {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.spaces)
}

// Nodes returns the nodes in creation order.
func (l *Lab) Nodes() []*Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.nodes)
}

// Owner returns the namespace that owns addr (a node, pod or client IP), or
// nil. The conformance runner uses it to place a probe's `from`.
func (l *Lab) Owner(addr netip.Addr) *NS {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.spaces {
		if slices.Contains(n.Addrs, addr.Unmap()) {
			return n
		}
	}
	return nil
}

// baseSysctls apply to every namespace. DAD is off so IPv6 addresses are
// usable at once; ICMP rate limits are off so REJECT probes stay REJECT
// however many tries hit the same peer; rp_filter is off everywhere because
// DNATed and hairpinned flows are asymmetric by design.
var baseSysctls = []string{
	"net/ipv4/conf/all/rp_filter", "0",
	"net/ipv4/conf/default/rp_filter", "0",
	"net/ipv4/icmp_ratelimit", "0",
}

var baseSysctls6 = []string{
	"net/ipv6/conf/all/accept_dad", "0",
	"net/ipv6/conf/default/accept_dad", "0",
	"net/ipv6/conf/all/accept_ra", "0",
	"net/ipv6/conf/default/accept_ra", "0",
	"net/ipv6/icmp/ratelimit", "0",
}

// nodeSysctls make a node a router. send_redirects is off: hairpin traffic
// leaves by the interface it came in on and must not trigger ICMP redirects.
var nodeSysctls = []string{
	"net/ipv4/ip_forward", "1",
	"net/ipv4/conf/all/send_redirects", "0",
	"net/ipv4/conf/default/send_redirects", "0",
}

var nodeSysctls6 = []string{"net/ipv6/conf/all/forwarding", "1"}

// newNS creates and configures prefix+name. It is recorded before being
// configured so Close also removes a half-built namespace.
func (l *Lab) newNS(name string, kind Kind) (*NS, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || len(l.Prefix)+len(name) > 200 {
		return nil, fmt.Errorf("lab: invalid namespace name %q", name)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("lab: closed")
	}
	full := l.Prefix + name
	for _, n := range l.spaces {
		if n.Name == full {
			return nil, fmt.Errorf("lab: namespace %s exists", full)
		}
	}
	h, err := newNamed(full)
	if err != nil {
		return nil, err
	}
	n := &NS{Name: full, Kind: kind, Handle: h, lab: l}
	l.spaces = append(l.spaces, n)
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", full, err)
	}
	kv := slices.Clone(baseSysctls)
	if hasIPv6 {
		kv = append(kv, baseSysctls6...)
	}
	if kind == KindNode {
		kv = append(kv, nodeSysctls...)
		if hasIPv6 {
			kv = append(kv, nodeSysctls6...)
		}
	}
	if err := n.Sysctl(kv...); err != nil {
		return nil, fmt.Errorf("%s: %w", full, err)
	}
	lo, err := n.nl.LinkByName("lo")
	if err == nil {
		err = n.nl.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: lo up: %w", full, err)
	}
	return n, nil
}

// register and unregister track servers so Close can stop them.
func (l *Lab) register(s io.Closer) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("lab: closed")
	}
	l.servers[s] = struct{}{}
	return nil
}

func (l *Lab) unregister(s io.Closer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.servers, s)
}
