package main

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
)

// ruleService is one ClusterIP Service port as the iptables and nftables
// rule sets see it: a VIP:port/TCP and its ready endpoints.
type ruleService struct {
	Namespace, Name, Port string // kube-proxy's ServicePortName parts
	VIP                   netip.Addr
	VIPPort               uint16
	Endpoints             []netip.AddrPort
	// NodePort, when set, makes it a NodePort Service (the API-server
	// benchmarks only; the shape-alike rule sets serve the ClusterIP).
	NodePort uint16
}

func (s ruleService) portName() string { return s.Namespace + "/" + s.Name + ":" + s.Port }

// kubeHash is kube-proxy's chain-name hash: base32 of a SHA-256 over the
// service port name and protocol (and the endpoint, for endpoint chains).
func kubeHash(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return base32.StdEncoding.EncodeToString(sum[:])
}

// iptablesRules renders svcs in kube-proxy's iptables mode shape, as one
// iptables-restore input for the nat and filter tables: PREROUTING and
// OUTPUT jump to KUBE-SERVICES, which holds one rule per Service port
// (matched in order: the linear list that makes iptables mode scale
// badly); each Service's KUBE-SVC chain picks an endpoint with `statistic
// --mode random` rules of probability 1/n, 1/(n-1), ..., and each
// KUBE-SEP chain marks hairpin traffic for masquerade and DNATs. Cluster
// CIDR detection is off (no --cluster-cidr), so, as in kube-proxy, traffic
// from outside is not masqueraded.
func iptablesRules(svcs []ruleService) string {
	var chains, rules strings.Builder
	chains.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	rules.WriteString(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
`)
	var svcRules, sepRules strings.Builder
	for _, s := range svcs {
		svcChain := "KUBE-SVC-" + kubeHash(s.portName(), "tcp")[:16]
		fmt.Fprintf(&chains, ":%s - [0:0]\n", svcChain)
		fmt.Fprintf(&rules, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport %d -j %s\n",
			s.VIP, s.portName(), s.VIPPort, svcChain)
		n := len(s.Endpoints)
		for i, ep := range s.Endpoints {
			sepChain := "KUBE-SEP-" + kubeHash(s.portName(), "tcp", ep.String())[:16]
			fmt.Fprintf(&chains, ":%s - [0:0]\n", sepChain)
			fmt.Fprintf(&svcRules, "-A %s -m comment --comment \"%s -> %s\"", svcChain, s.portName(), ep)
			if left := n - i; left > 1 {
				fmt.Fprintf(&svcRules, " -m statistic --mode random --probability %.11f", 1/float64(left))
			}
			fmt.Fprintf(&svcRules, " -j %s\n", sepChain)
			fmt.Fprintf(&sepRules, "-A %s -s %s/32 -m comment --comment %s -j KUBE-MARK-MASQ\n", sepChain, ep.Addr(), s.portName())
			fmt.Fprintf(&sepRules, "-A %s -p tcp -m comment --comment %s -m tcp -j DNAT --to-destination %s\n", sepChain, s.portName(), ep)
		}
	}
	rules.WriteString(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS` + "\n")
	var b strings.Builder
	b.WriteString(chains.String())
	b.WriteString(rules.String())
	b.WriteString(svcRules.String())
	b.WriteString(sepRules.String())
	b.WriteString("COMMIT\n")
	// The filter table's forwarding rules, which every forwarded packet
	// walks in iptables mode.
	b.WriteString(`*filter
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
`)
	return b.String()
}

// nftTable is the table kube-proxy's nftables mode owns.
const nftTable = "kube-proxy"

// nftablesRules renders svcs in kube-proxy's nftables mode shape, in the
// transaction form knftables feeds to `nft -f`: one service-ips verdict map
// from VIP . proto . port to a per-Service chain, which picks an endpoint
// chain with `numgen random mod n vmap`; each endpoint chain marks hairpin
// traffic for masquerade and DNATs. As in kube-proxy, new connections are
// checked against the cluster-ips set in the forward hook, and the
// masquerading chain runs in postrouting.
func nftablesRules(svcs []ruleService) string {
	var b strings.Builder
	t := "ip " + nftTable
	fmt.Fprintf(&b, `add table %[1]s { comment "rules for kube-proxy" ; }
add chain %[1]s mark-for-masquerade
add rule %[1]s mark-for-masquerade mark set mark or 0x4000
add chain %[1]s masquerading
add rule %[1]s masquerading mark and 0x4000 == 0 return
add rule %[1]s masquerading mark set mark xor 0x4000
add rule %[1]s masquerading masquerade fully-random
add map %[1]s service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map %[1]s no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add set %[1]s cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add chain %[1]s services
add rule %[1]s services ip daddr . meta l4proto . th dport vmap @service-ips
add chain %[1]s service-endpoints-check
add rule %[1]s service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add chain %[1]s cluster-ips-check
add rule %[1]s cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add chain %[1]s nat-prerouting { type nat hook prerouting priority -100 ; }
add rule %[1]s nat-prerouting jump services
add chain %[1]s nat-output { type nat hook output priority -100 ; }
add rule %[1]s nat-output jump services
add chain %[1]s nat-postrouting { type nat hook postrouting priority 100 ; }
add rule %[1]s nat-postrouting jump masquerading
add chain %[1]s filter-forward { type filter hook forward priority -110 ; }
add rule %[1]s filter-forward ct state new jump service-endpoints-check
add rule %[1]s filter-forward ct state new jump cluster-ips-check
`, t)
	for _, s := range svcs {
		base := s.Namespace + "/" + s.Name + "/tcp/" + s.Port
		svcChain := "service-" + kubeHash(s.portName(), "tcp")[:8] + "-" + base
		fmt.Fprintf(&b, "add chain %s %s\n", t, svcChain)
		var vmap []string
		for i, ep := range s.Endpoints {
			epChain := fmt.Sprintf("endpoint-%s-%s__%s/%d", kubeHash(s.portName(), "tcp", ep.String())[:8], base, ep.Addr(), ep.Port())
			fmt.Fprintf(&b, "add chain %s %s\n", t, epChain)
			fmt.Fprintf(&b, "add rule %s %s ip saddr %s jump mark-for-masquerade\n", t, epChain, ep.Addr())
			fmt.Fprintf(&b, "add rule %s %s meta l4proto tcp dnat to %s\n", t, epChain, ep)
			vmap = append(vmap, fmt.Sprintf("%d : goto %s", i, epChain))
		}
		fmt.Fprintf(&b, "add rule %s %s numgen random mod %d vmap { %s }\n", t, svcChain, len(s.Endpoints), strings.Join(vmap, " , "))
		fmt.Fprintf(&b, "add element %s service-ips { %s . tcp . %d : goto %s }\n", t, s.VIP, s.VIPPort, svcChain)
		fmt.Fprintf(&b, "add element %s cluster-ips { %s }\n", t, s.VIP)
	}
	return b.String()
}
