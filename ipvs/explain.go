package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/nft"
)

// Explaining a packet in IPVS mode: what the node does with it and why,
// read from what the kernel holds now — the virtual servers and their real
// servers (with their weights), IPVS's connections and persistence
// templates (/proc/net/ip_vs_conn), and the sets of xvs's nftables table —
// and walked in the order the packet meets them: filter_input's (or, for
// the node's own packets, filter_output's) rules, IPVS, then the marks
// that masquerade. The rules' meaning is renderRules'; the conformance
// corpus checks each answer against the probe that follows it. IPVS's
// schedulers keep their state in the kernel (a round-robin cursor, a
// hash table), so a new connection is answered with every real server the
// scheduler may pick.

// Explain explains p against the IPVS state of the caller's network
// namespace.
func Explain(cfg Config, p model.ExplainPacket) (*model.Explanation, error) {
	cfg.defaults()
	st, err := readExplainState(cfg, p)
	if err != nil {
		return nil, err
	}
	src := p.From.Addr().Unmap()
	if p.FromHost && !p.From.IsValid() {
		// An unbound socket of the node: its source is the one routing
		// gives it (for a VIP on the dummy interface, the VIP itself).
		if src, err = routeSource(p.To.Addr()); err != nil {
			return nil, err
		}
	}
	return st.explain(p, src), nil
}

// explainState is what the decision reads from the kernel.
type explainState struct {
	// server is p's virtual server and reals its real servers (found:
	// the kernel has the server).
	server kService
	reals  []kReal
	found  bool
	conns  []Conn
	// sets are the elements of xvs's sets in p's family, by set name;
	// masqAllClusterIPs: the ClusterIP mark rule has no pod CIDR
	// condition (masqueradeAll).
	sets              map[string][][]string
	masqAllClusterIPs bool
}

// explainSets are the sets of renderRules the decision reads.
var explainSets = []string{"services", "cluster_ips", "masq_external", "vips", "pod_cidrs", "lb_fw", "lb_allow"}

func readExplainState(cfg Config, p model.ExplainPacket) (*explainState, error) {
	mk, err := newMobyKernel(cfg.Device)
	if err != nil {
		return nil, err
	}
	defer mk.Close()
	st := &explainState{sets: map[string][][]string{}}
	k := vsKey{Addr: p.To.Addr().Unmap(), Proto: p.Proto, Port: p.To.Port()}
	have, err := mk.Services()
	if err != nil {
		return nil, err
	}
	for _, s := range have {
		if s.Key == k {
			st.server, st.found = s, true
			if st.reals, err = mk.Reals(k); err != nil {
				return nil, err
			}
		}
	}
	if st.conns, err = ReadConns(); err != nil {
		return nil, fmt.Errorf("IPVS connections: %w", err)
	}
	fam := "ip"
	if !k.Addr.Is4() {
		fam = "ip6"
	}
	for _, name := range explainSets {
		elems, err := nft.SetElements(fam, TableName, name)
		if errors.Is(err, nft.ErrNoSuchSet) {
			continue // no table of this family: no Service of it
		}
		if err != nil {
			return nil, err
		}
		st.sets[name] = elems
	}
	if len(st.sets) > 0 {
		chain, err := nft.ListChain(fam, TableName, "mark_prerouting")
		if err != nil {
			return nil, err
		}
		for line := range strings.SplitSeq(chain, "\n") {
			if strings.Contains(line, "@cluster_ips") && !strings.Contains(line, "@pod_cidrs") {
				st.masqAllClusterIPs = true
			}
		}
	}
	return st, nil
}

func routeSource(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
	if err != nil || len(routes) == 0 {
		return netip.Addr{}, fmt.Errorf("route to %s: %v", dst, err)
	}
	src, ok := netip.AddrFromSlice(routes[0].Src)
	if !ok {
		return netip.Addr{}, fmt.Errorf("route to %s has no source address", dst)
	}
	return src.Unmap(), nil
}

// Verdicts of the IPVS walk: the ebpf datapath's names where the outcome
// is the same, and their reasons.
var ipvsReasons = map[string]string{
	"pass":                    "not a virtual server: left to the node",
	"reject_wrong_port":       "a Service address on a port (or protocol) no Service has: rejected by xvs's filter_input rule",
	"drop_source_range":       "the source is outside the LoadBalancer's loadBalancerSourceRanges: dropped by xvs's rule before IPVS",
	"reject_no_endpoints":     "the virtual server has no real server of weight above 0: IPVS answers ICMP port unreachable",
	"forward_established":     "a packet of a connection IPVS already has: it follows that connection",
	"forward_new":             "a new connection: IPVS's scheduler picks one of the candidates",
	"forward_persistent":      "a new connection of a client with a persistence template (ClientIP affinity): IPVS sends it to that real server",
	"pass_no_ipvs_connection": "a TCP segment that is not a SYN, of no IPVS connection: IPVS leaves it to the node's stack, which has no such socket",
}

// explain walks the packet through the rules and IPVS; src is its source
// address.
func (st *explainState) explain(p model.ExplainPacket, src netip.Addr) *model.Explanation {
	x := &model.Explanation{Host: p.FromHost, Source: netip.AddrPortFrom(src, p.From.Port())}
	defer func() { x.Why = ipvsReasons[x.Verdict] }()
	k := vsKey{Addr: p.To.Addr().Unmap(), Proto: p.Proto, Port: p.To.Port()}
	svc := []string{k.Addr.String(), protoName(k.Proto), strconv.Itoa(int(k.Port))}
	newFlow := !p.Established

	// filter_input: a new connection to a Service address on a port no
	// Service has. The node's own packet to such an address is not a
	// virtual server's either, so it reaches INPUT through lo as well.
	if newFlow && st.has("vips", []string{k.Addr.String()}) && !st.has("services", svc) {
		x.Action, x.Verdict = "reject", "reject_wrong_port"
		return x
	}
	// filter_input and filter_output: loadBalancerSourceRanges.
	if st.has("lb_fw", svc) && !st.has("lb_allow", append(slices.Clone(svc), src.String())) {
		x.Frontend = frontendName(k)
		x.Action, x.Verdict = "drop", "drop_source_range"
		return x
	}
	if !st.found {
		x.Action, x.Verdict = "pass", "pass"
		return x
	}
	x.Frontend, x.Scope, x.Scheduler = frontendName(k), "policy", st.server.Scheduler

	virtual := netip.AddrPortFrom(k.Addr, k.Port)
	if !p.FromHost {
		for _, c := range st.conns {
			if c.Protocol == p.Proto && c.Client == netip.AddrPortFrom(src, p.From.Port()) && c.Virtual == virtual {
				x.Action, x.Verdict, x.Tracked, x.Backend = "translate", "forward_established", true, c.Dest
				st.masquerade(x, k, src)
				return x
			}
		}
	}
	if p.Established && p.Proto == model.TCP {
		x.Action, x.Verdict = "pass", "pass_no_ipvs_connection"
		return x
	}
	weight := map[netip.AddrPort]int{}
	for _, r := range st.reals {
		weight[netip.AddrPortFrom(r.Key.Addr, r.Key.Port)] = r.Weight
	}
	if st.server.Flags&flagPersistent != 0 {
		// A persistence template: client address, port 0, to the
		// virtual server (kube-proxy sets expire_quiescent_template: a
		// template to a real server of weight 0 is not used).
		for _, c := range st.conns {
			if c.Protocol == p.Proto && c.Client == netip.AddrPortFrom(src, 0) && c.Virtual == virtual && weight[c.Dest] > 0 {
				x.Action, x.Verdict, x.Backend = "translate", "forward_persistent", c.Dest
				st.masquerade(x, k, src)
				return x
			}
		}
	}
	for r, w := range weight {
		if w > 0 {
			x.Candidates = append(x.Candidates, r)
		}
	}
	if len(x.Candidates) == 0 {
		x.Action, x.Verdict = "reject", "reject_no_endpoints"
		return x
	}
	slices.SortFunc(x.Candidates, netip.AddrPort.Compare)
	if len(x.Candidates) == 1 {
		x.Backend = x.Candidates[0]
	}
	x.Action, x.Verdict = "translate", "forward_new"
	st.masquerade(x, k, src)
	return x
}

// masquerade says whether xvs's rules mark the connection for netfilter's
// masquerade: an external frontend of eTP=Cluster, a ClusterIP from
// outside the pod CIDRs (every source with masqueradeAll), or a client
// that is its own backend (hairpin).
func (st *explainState) masquerade(x *model.Explanation, k vsKey, src netip.Addr) {
	svc := []string{k.Addr.String(), protoName(k.Proto), strconv.Itoa(int(k.Port))}
	switch {
	case st.has("masq_external", svc),
		st.has("cluster_ips", svc) && (st.masqAllClusterIPs || !st.has("pod_cidrs", []string{src.String()})),
		x.Backend.Addr() == src:
		x.Masquerade = "netfilter"
	}
}

// has reports whether set name holds an element matching want, field by
// field: an address matches a field that is that address or a prefix or
// range holding it.
func (st *explainState) has(name string, want []string) bool {
	for _, e := range st.sets[name] {
		if len(e) != len(want) {
			continue
		}
		match := true
		for i := range e {
			if !fieldMatches(e[i], want[i]) {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

func fieldMatches(field, v string) bool {
	if field == v {
		return true
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return false
	}
	if p, err := netip.ParsePrefix(field); err == nil {
		return p.Contains(a)
	}
	if lo, hi, ok := strings.Cut(field, "-"); ok {
		l, err1 := netip.ParseAddr(lo)
		h, err2 := netip.ParseAddr(hi)
		return err1 == nil && err2 == nil && l.Compare(a) <= 0 && a.Compare(h) <= 0
	}
	if f, err := netip.ParseAddr(field); err == nil {
		return f == a
	}
	return false
}

func frontendName(k vsKey) string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + k.Proto.String()
}
