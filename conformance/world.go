package conformance

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// world is one scenario realised in network namespaces:
//
//	node     the node under test: node.addresses on lo, the agent, its
//	         hostNetwork endpoints and host clients
//	pN       pods on the node (local endpoints, pod clients), veth "lxcN"
//	remote   another node behind a fabric link, with the remote endpoints
//	         and remote-pod clients (rN)
//	ext      every external client address, behind the node's "ext" link
//	rtrN/farN  an external client behind a router (from.router), on a link
//	         of from.mtu
//	sink     owns every probed destination no namespace owns (Service
//	         VIPs, unallocated IPs) and listens there, so traffic the proxy
//	         leaves untouched is seen as PASS rather than mistaken for a
//	         REJECT (no route) or a DROP
//	syncc/syncb  the runner's own sentinel client and backend (sync.go)
type world struct {
	sc   *Scenario
	mode string
	lab  *lab.Lab

	node   *lab.Node
	remote *lab.Node
	fabric *lab.Fabric
	ext    *lab.NS
	sink   *lab.NS
	// far are external clients behind a router (version 4's from.router),
	// by address; routers the router namespaces, by address.
	far     map[netip.Addr]*lab.NS
	routers map[netip.Addr]*lab.NS

	eps  map[netip.Addr]*endpointInfo
	pods map[netip.Addr]*lab.NS // endpoint and pod-client namespaces by address
	npod int

	// listening is every (address, port, protocol) served by an echo server.
	listening map[listenKey]bool
	// unsupported records why some listeners could not be started (SCTP).
	unsupported map[listenKey]string

	objs     *objectSet        // the objects that exist now
	written  map[string][]byte // files in dir, by name
	gen      int               // generation of the last write (sentinel port)
	sentinel *sentinel
	dir      string // the agent's --objects directory
	pinPath  string
	logPath  string
	agent    *lab.Process
	holds    map[string]net.Conn
	held     map[string]*lab.HeldStream // bulk holds (version 2)
	sessions map[string]*session        // UDP sessions (version 2)
	changed  time.Time                  // when the agent had applied the last apply or delete
	sctp     []*sctpEcho
}

type listenKey struct {
	ap    netip.AddrPort
	proto string
}

// nodeOwned reports whether a is one of the node's own addresses.
func (w *world) nodeOwned(a netip.Addr) bool {
	return slices.Contains(w.node.Addrs, a) || a.IsLoopback()
}

// roleOf applies FORMAT.md's "Roles of from" to an address. An address
// that is a remote endpoint is a remote pod: the runner cannot place one
// address in two namespaces.
func (w *world) roleOf(f From) Role {
	if f.Role != RoleAuto {
		return f.Role
	}
	if f.Router.IsValid() {
		return RoleExternal
	}
	switch {
	case slices.Contains(w.sc.nodeAddrs, f.IP) || f.IP.IsLoopback():
		return RoleHost
	case w.eps[f.IP] != nil && !w.eps[f.IP].local && !slices.Contains(w.sc.nodeAddrs, f.IP):
		return RoleRemotePod
	case w.eps[f.IP] != nil, prefixesContain(w.sc.podCIDRs, f.IP):
		return RolePod
	}
	return RoleExternal
}

func prefixesContain(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// client is where a probe runs from.
type client struct {
	ns   *lab.NS
	src  netip.Addr
	role Role
}

// clientFor returns the namespace of a source built by build.
func (w *world) clientFor(f From) (client, error) {
	role := w.roleOf(f)
	c := client{src: f.IP, role: role}
	switch role {
	case RoleHost:
		c.ns = w.node.NS
	case RoleExternal:
		c.ns = w.ext
		if f.Router.IsValid() {
			c.ns = w.far[f.IP]
		}
	case RolePod, RoleRemotePod:
		c.ns = w.pods[f.IP]
	}
	if c.ns == nil {
		return c, fmt.Errorf("no namespace for source %s (%s)", f.IP, role)
	}
	return c, nil
}

// allSources lists every probe and hold source and destination, with the
// probe protocol (holds are TCP).
type flow struct {
	from  From
	to    netip.AddrPort
	proto string
}

func (s *Scenario) flows() []flow {
	var out []flow
	add := func(ps []Probe) {
		for _, p := range ps {
			out = append(out, flow{p.From, p.to, p.proto})
		}
	}
	add(s.Probes)
	for _, st := range s.Steps {
		add(st.Probes)
		if st.Hold != nil {
			out = append(out, flow{st.Hold.From, st.Hold.to, "TCP"})
		}
		if st.Session != nil {
			out = append(out, flow{st.Session.From, st.Session.to, "UDP"})
		}
	}
	return out
}

// listenPlan collects the listeners to start: namespace -> address:port ->
// protocols.
type listenPlan map[*lab.NS]map[netip.AddrPort][]string

func (l listenPlan) want(ns *lab.NS, ap netip.AddrPort, proto string) {
	if l[ns] == nil {
		l[ns] = map[netip.AddrPort][]string{}
	}
	if !slices.Contains(l[ns][ap], proto) {
		l[ns][ap] = append(l[ns][ap], proto)
	}
}

// build creates every namespace, address, route and listener of the
// scenario. On error the caller still closes the lab, which removes what
// was made.
func (w *world) build() error {
	var err error
	w.eps = map[netip.Addr]*endpointInfo{}
	w.pods = map[netip.Addr]*lab.NS{}
	w.listening = map[listenKey]bool{}
	w.unsupported = map[listenKey]string{}
	if w.node, err = w.lab.AddNode("node", w.sc.nodeAddrs...); err != nil {
		return err
	}
	plan := listenPlan{}
	if err := w.buildEndpoints(plan); err != nil {
		return err
	}
	if err := w.buildClients(); err != nil {
		return err
	}
	if err := w.planDestinations(plan); err != nil {
		return err
	}
	for ns, aps := range plan {
		for ap, protos := range aps {
			if err := w.startListener(ns, ap, protos); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildEndpoints creates a namespace per endpoint address: pods exist for
// the whole scenario; steps only change which of them are endpoints.
func (w *world) buildEndpoints(plan listenPlan) error {
	for _, e := range collectEndpoints(w.sc) {
		w.eps[e.addr] = e
		var ns *lab.NS
		var err error
		switch {
		case w.nodeOwned(e.addr): // hostNetwork endpoint
			ns = w.node.NS
		case e.local:
			ns, err = w.addPod(w.node, e.addr)
		default:
			ns, err = w.addRemotePod(e.addr)
		}
		if err != nil {
			return err
		}
		for _, p := range e.ports {
			if ap := netip.AddrPortFrom(e.addr, p.port); !w.sc.closed[ap] {
				plan.want(ns, ap, p.proto)
			}
		}
	}
	return nil
}

// buildClients places every probe and hold source by its role.
func (w *world) buildClients() error {
	var externals []netip.Addr
	for _, f := range w.sc.flows() {
		a := f.from.IP
		switch w.roleOf(f.from) {
		case RoleHost:
			if !w.nodeOwned(a) {
				if err := w.node.AddAddr("lo", netip.PrefixFrom(a, a.BitLen())); err != nil {
					return err
				}
				w.node.Addrs = append(w.node.Addrs, a)
			}
		case RolePod:
			if ns := w.pods[a]; ns != nil {
				if ns.Node != w.node {
					return fmt.Errorf("source %s has role pod but is an endpoint on another node", a)
				}
				continue
			}
			if o := w.lab.Owner(a); o != nil {
				return fmt.Errorf("source %s (pod) already belongs to %s", a, o.Name)
			}
			if _, err := w.addPod(w.node, a); err != nil {
				return err
			}
		case RoleRemotePod:
			if ns := w.pods[a]; ns != nil {
				if ns.Node == w.node {
					return fmt.Errorf("source %s has role remote-pod but is a local endpoint", a)
				}
				continue
			}
			if _, err := w.addRemotePod(a); err != nil {
				return err
			}
		case RoleExternal:
			if f.from.Router.IsValid() {
				if err := w.addFarClient(f.from); err != nil {
					return err
				}
				continue
			}
			if o := w.lab.Owner(a); o != nil {
				return fmt.Errorf("source %s (external) already belongs to %s", a, o.Name)
			}
			if !slices.Contains(externals, a) {
				externals = append(externals, a)
			}
		}
	}
	if len(externals) == 0 {
		return nil
	}
	var err error
	w.ext, err = w.lab.AddClient(w.node, "ext", externals...)
	return err
}

// addFarClient places an external client behind its router (created on
// first use, attached to the node like the other external clients), on
// a link of f.MTU whose router end answers packets too big for it with
// ICMP errors.
func (w *world) addFarClient(f From) error {
	if w.far == nil {
		w.far, w.routers = map[netip.Addr]*lab.NS{}, map[netip.Addr]*lab.NS{}
	}
	if w.far[f.IP] != nil {
		return nil
	}
	rtr := w.routers[f.Router]
	if rtr == nil {
		var err error
		if rtr, err = w.lab.AddClient(w.node, fmt.Sprintf("rtr%d", len(w.routers)), f.Router); err != nil {
			return fmt.Errorf("router %s: %w", f.Router, err)
		}
		w.routers[f.Router] = rtr
	}
	ns, err := w.lab.AddClientBehind(rtr, fmt.Sprintf("far%d", len(w.far)), f.IP, f.MTU)
	if err != nil {
		return fmt.Errorf("source %s behind %s: %w", f.IP, f.Router, err)
	}
	w.far[f.IP] = ns
	if f.MTU == 0 {
		return nil
	}
	// The client's SYNs advertise the MSS of a 1500-byte path (no MSS
	// clamping on the way): the backend's full-sized segments meet the
	// narrow link at the router, which answers them with ICMP errors.
	mss := 1500 - 40
	if f.IP.Is6() {
		mss = 1500 - 60
	}
	return ns.AdvertiseMSS(f.IP.Is6(), mss)
}

// planDestinations gives every probed address:port a listener where it
// lives, so an untouched packet answers "PASS" instead of looking like a
// REJECT (nothing listening) or a DROP (no route). Destinations no
// namespace owns go to the sink.
func (w *world) planDestinations(plan listenPlan) error {
	var sinkAddrs []netip.Addr
	var sinkFlows []flow
	for _, f := range w.sc.flows() {
		var owner *lab.NS
		if a := f.to.Addr(); a.IsLoopback() {
			c, err := w.clientFor(f.from)
			if err != nil {
				return err
			}
			owner = c.ns
		} else {
			owner = w.lab.Owner(a)
		}
		if owner != nil {
			plan.want(owner, f.to, f.proto)
			continue
		}
		if !slices.Contains(sinkAddrs, f.to.Addr()) {
			sinkAddrs = append(sinkAddrs, f.to.Addr())
		}
		sinkFlows = append(sinkFlows, f)
	}
	if len(sinkAddrs) == 0 {
		return nil
	}
	var err error
	if w.sink, err = w.lab.AddClient(w.node, "sink", sinkAddrs...); err != nil {
		return err
	}
	for _, f := range sinkFlows {
		plan.want(w.sink, f.to, f.proto)
	}
	return nil
}

// addPod creates a pod namespace on node with address a.
func (w *world) addPod(node *lab.Node, a netip.Addr) (*lab.NS, error) {
	w.npod++
	base := "p"
	if node != w.node {
		base = "r"
	}
	ns, err := w.lab.AddPod(node, fmt.Sprintf("%s%d", base, w.npod), a)
	if err != nil {
		return nil, err
	}
	w.pods[a] = ns
	return ns, nil
}

// addRemotePod puts a pod on the remote node (created on first use, with a
// fabric link to the node and a default route back) and routes its address
// from the node across the fabric.
func (w *world) addRemotePod(a netip.Addr) (*lab.NS, error) {
	if w.remote == nil {
		var err error
		if w.remote, err = w.lab.AddNode("remote"); err != nil {
			return nil, err
		}
		if w.fabric, err = w.lab.Link(w.node, w.remote); err != nil {
			return nil, err
		}
		defaults := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
		if hasIPv6() {
			defaults = append(defaults, netip.MustParsePrefix("::/0"))
		}
		if err := w.fabric.Route(w.remote, defaults...); err != nil {
			return nil, err
		}
	}
	ns, err := w.addPod(w.remote, a)
	if err != nil {
		return nil, err
	}
	if err := w.fabric.Route(w.node, netip.PrefixFrom(a, a.BitLen())); err != nil {
		return nil, err
	}
	return ns, nil
}

// startListener starts a bulk server (the echo greeting, and version 2's
// traffic) on ap for each protocol. An SCTP
// listener that cannot be created (no sctp module) is recorded so probes
// to it fail with that reason.
func (w *world) startListener(ns *lab.NS, ap netip.AddrPort, protos []string) error {
	var ps []lab.Proto
	for _, p := range protos {
		k := listenKey{ap, p}
		switch p {
		case "TCP":
			ps = append(ps, lab.TCP)
		case "UDP":
			ps = append(ps, lab.UDP)
		case "SCTP":
			e, err := startSCTPEcho(ns, ap)
			if err != nil {
				// Probes to it fail with this reason; the others still run.
				w.unsupported[k] = err.Error()
				continue
			}
			w.sctp = append(w.sctp, e)
		default:
			w.unsupported[k] = "the runner has no " + p + " listener"
			continue
		}
		w.listening[k] = true
	}
	if len(ps) == 0 {
		return nil
	}
	if _, err := lab.StartBulk(ns, ap, ps...); err != nil {
		return fmt.Errorf("listener %s %v: %w", ap, protos, err)
	}
	return nil
}

// hasIPv6 reports whether the kernel has IPv6 (the lab skips IPv6 setup
// without it, and so do we).
func hasIPv6() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// describe is a one-line summary of the namespaces, for logs.
func (w *world) describe() string {
	var parts []string
	for _, ns := range w.lab.Namespaces() {
		parts = append(parts, strings.TrimPrefix(ns.Name, w.lab.Prefix)+"="+fmt.Sprint(ns.Addrs))
	}
	return strings.Join(parts, " ")
}
