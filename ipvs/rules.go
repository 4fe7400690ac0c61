package ipvs

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/nft"
)

// TableName is the nftables table (one per family, ip and ip6) that holds
// every rule xvs's IPVS mode needs. xvs owns it entirely: each sync
// replaces it atomically and cleanup deletes it, touching nothing else.
const TableName = "xvs-ipvs"

// MasqueradeMark is the packet mark bit that asks for SNAT: kube-proxy's
// (bit 14), so both agree on a node being migrated.
const MasqueradeMark = 0x4000

// The rules do what kube-proxy's IPVS mode does with iptables and ipsets:
//
//   - filter_input (priority filter, before IPVS takes the packet at
//     LOCAL_IN): loadBalancerSourceRanges drop sources outside the ranges
//     (KUBE-LOAD-BALANCER-FW), then new connections to a dummy-interface
//     address on a port that is not a Service are rejected
//     (KUBE-IPVS-FILTER, #72236); new connections to a virtual server
//     without a real server of weight above 0 are logged (IPVS itself
//     refuses them). filter_output applies the source ranges and the log
//     to the node's own connections. Every drop and reject is logged to
//     NFLOG first, for xvs monitor.
//   - mark_prerouting, mark_output: mark for masquerade new packets to
//     external frontends with externalTrafficPolicy=Cluster, and to
//     ClusterIPs with masqueradeAll or from outside the pod CIDRs (the
//     ClusterCIDR local-traffic detector);
//   - nat_postrouting: masquerade marked packets (IPVS keeps the mark when
//     it forwards) and hairpin connections (KUBE-LOOP-BACK). IPVS with
//     net.ipv4.vs.conntrack=1 keeps the flows in conntrack, so the NAT
//     applies to the whole connection.
type ruleApplier interface {
	Apply(script string) error
	Delete() error
}

type nftRules struct{}

func (nftRules) Apply(script string) error { return nft.Run(script) }

func (nftRules) Delete() error { return nft.DeleteTables(TableName) }

type famSpec struct {
	nft, addrType string
	is4           bool
}

var families = []famSpec{{"ip", "ipv4_addr", true}, {"ip6", "ipv6_addr", false}}

func protoName(p model.Protocol) string { return strings.ToLower(p.String()) }

func elem(k vsKey) string {
	return fmt.Sprintf("%s . %s . %d", k.Addr, protoName(k.Proto), k.Port)
}

// renderRules returns the nft script that replaces both families' tables.
// Long by design: it reads top to bottom as the ruleset it writes (sets,
// then chains in hook order), which is how an operator compares it with
// `nft list table`.
func renderRules(st *model.State, want *desired, cfg Config) string {
	var b bytes.Buffer
	for _, fam := range families {
		var services, cluster, external, lbFW, lbAllow, loop, vips, pods, empty []string
		for _, k := range want.sortedKeys() {
			if k.Addr.Is4() != fam.is4 {
				continue
			}
			vs := want.Servers[k]
			services = append(services, elem(k))
			if !vs.hasWeight() {
				empty = append(empty, elem(k))
			}
			switch {
			case vs.Kind == model.ClusterIP:
				cluster = append(cluster, elem(k))
			case vs.Masquerade:
				external = append(external, elem(k))
			}
			for r := range vs.Reals {
				loop = append(loop, fmt.Sprintf("%s . %s . %d . %s", r.Addr, protoName(k.Proto), r.Port, r.Addr))
			}
			if len(vs.SourceRanges) > 0 {
				lbFW = append(lbFW, elem(k))
				nodeInRange := false
				for _, p := range vs.SourceRanges {
					lbAllow = append(lbAllow, fmt.Sprintf("%s . %s", elem(k), p))
					for _, a := range st.Node.Addresses {
						nodeInRange = nodeInRange || p.Contains(a)
					}
				}
				if nodeInRange {
					// The node reaching its own LB IP uses the LB IP as source.
					lbAllow = append(lbAllow, fmt.Sprintf("%s . %s", elem(k), k.Addr))
				}
			}
		}
		for a := range want.VIPs {
			if a.Is4() == fam.is4 {
				vips = append(vips, a.String())
			}
		}
		for _, p := range st.PodCIDRs {
			if p.Addr().Is4() == fam.is4 {
				pods = append(pods, p.String())
			}
		}
		slices.Sort(vips)
		slices.Sort(loop)
		nft.DeleteTable(&b, fam.nft, TableName)
		if len(services) == 0 {
			continue
		}
		key := fmt.Sprintf("%s . inet_proto . inet_service", fam.addrType)
		fmt.Fprintf(&b, "table %s %s {\n", fam.nft, TableName)
		writeSet(&b, "services", key, "", services)
		writeSet(&b, "cluster_ips", key, "", cluster)
		writeSet(&b, "masq_external", key, "", external)
		writeSet(&b, "vips", fam.addrType, "", vips)
		writeSet(&b, "pod_cidrs", fam.addrType, "interval", pods)
		writeSet(&b, "loop_back", key+" . "+fam.addrType, "", dedup(loop))
		writeSet(&b, "lb_fw", key, "", lbFW)
		writeSet(&b, "lb_allow", key+" . "+fam.addrType, "interval", lbAllow)
		writeSet(&b, "no_endpoints", key, "", empty)
		ip := fam.nft
		svc := fmt.Sprintf("%s daddr . meta l4proto . th dport", ip)
		// Each rule that drops or refuses logs first, for xvs monitor
		// (monitor.go). 6.12 refuses (EOPNOTSUPP) meta l4proto in a
		// lookup into a concatenated interval set; the header's protocol
		// field works.
		proto := "ip protocol"
		if !fam.is4 {
			proto = "ip6 nexthdr"
		}
		sourceRanges := func() {
			fmt.Fprintf(&b, "\t\t%s daddr . %s . th dport . %s saddr @lb_allow accept\n", ip, proto, ip)
			fmt.Fprintf(&b, "\t\t%s @lb_fw %s\n", svc, logStatement("drop_source_range"))
			fmt.Fprintf(&b, "\t\t%s @lb_fw counter drop\n", svc)
		}
		// IPVS refuses a new connection to a virtual server without a
		// real server of weight above 0 (ICMP port unreachable): only
		// the log is xvs's.
		noEndpoints := fmt.Sprintf("\t\tct state new %s @no_endpoints %s\n", svc, logStatement("reject_no_endpoints"))
		wrongPort := fmt.Sprintf("ct state new %s daddr @vips %s != @services", ip, svc)
		fmt.Fprintf(&b, "\tchain filter_input {\n\t\ttype filter hook input priority filter; policy accept;\n")
		fmt.Fprintf(&b, "\t\t%s %s\n", wrongPort, logStatement("reject_wrong_port"))
		fmt.Fprintf(&b, "\t\t%s counter reject\n", wrongPort)
		if len(lbFW) > 0 {
			sourceRanges()
		}
		b.WriteString(noEndpoints)
		fmt.Fprintf(&b, "\t}\n")
		// The node's own connections to a Service never reach INPUT: IPVS
		// takes them at LOCAL_OUT (priority -99), so the source ranges
		// apply before it (KUBE-IPVS-OUT-FILTER, #119656).
		fmt.Fprintf(&b, "\tchain filter_output {\n\t\ttype filter hook output priority -110; policy accept;\n")
		if len(lbFW) > 0 {
			sourceRanges()
		}
		b.WriteString(noEndpoints)
		fmt.Fprintf(&b, "\t}\n")
		// Mark-then-masquerade, as kube-proxy: the decision needs the
		// Service port, which only the packet before IPVS's DNAT carries.
		mark := fmt.Sprintf("meta mark set meta mark | %#x", MasqueradeMark)
		for _, chain := range []string{"mark_prerouting", "mark_output"} {
			hook := strings.TrimPrefix(chain, "mark_")
			fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority -100; policy accept;\n", chain, hook)
			fmt.Fprintf(&b, "\t\t%s @masq_external %s\n", svc, mark)
			switch {
			case st.MasqueradeAll:
				fmt.Fprintf(&b, "\t\t%s @cluster_ips %s\n", svc, mark)
			case len(pods) > 0:
				fmt.Fprintf(&b, "\t\t%s @cluster_ips %s saddr != @pod_cidrs %s\n", svc, ip, mark)
			}
			fmt.Fprintf(&b, "\t}\n")
		}
		fmt.Fprintf(&b, "\tchain nat_postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
		fmt.Fprintf(&b, "\t\tmeta mark & %#x == %#x counter masquerade\n", MasqueradeMark, MasqueradeMark)
		fmt.Fprintf(&b, "\t\t%s daddr . meta l4proto . th dport . %s saddr @loop_back counter masquerade\n", ip, ip)
		fmt.Fprintf(&b, "\t}\n}\n")
	}
	return b.String()
}

func writeSet(b *bytes.Buffer, name, typ, flags string, elems []string) {
	fmt.Fprintf(b, "\tset %s {\n\t\ttype %s\n", name, typ)
	if flags != "" {
		fmt.Fprintf(b, "\t\tflags %s\n", flags)
	}
	if len(elems) > 0 {
		fmt.Fprintf(b, "\t\telements = { %s }\n", strings.Join(elems, ", "))
	}
	fmt.Fprintf(b, "\t}\n")
}

func dedup(l []string) []string {
	seen := map[string]bool{}
	out := l[:0]
	for _, s := range l {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
