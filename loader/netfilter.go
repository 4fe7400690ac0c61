package loader

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/xvs-lb/xvs/nft"
)

// NetfilterTable is the nftables table (one per family, ip and ip6) of the
// ebpf datapath's netfilter mode. xvs owns it entirely: each install
// replaces it atomically and Cleanup deletes it, touching nothing else.
const NetfilterTable = "xvs-ebpf"

// DefaultMasqueradeMark is the packet mark bit the programs set on flows
// netfilter is to masquerade: kube-proxy's (iptables.masqueradeBit 14), so
// that a node's other rules read it as they did under kube-proxy.
const DefaultMasqueradeMark = 0x4000

// Netfilter describes the node rules of netfilter mode.
type Netfilter struct {
	// Mark is the masquerade mark bit (DefaultMasqueradeMark).
	Mark uint32
	// PortMin and PortMax bound the source ports MASQUERADE gives TCP,
	// UDP and SCTP flows. The tc program sees a masqueraded reply before
	// netfilter's conntrack does, so the range must not hold a NodePort:
	// a UDP reply to such a port would look like a new NodePort flow.
	PortMin, PortMax uint16
}

// DefaultNetfilterPorts is the masquerade port range of netfilter mode:
// above the API server's default NodePort range (30000-32767), where
// netfilter's NAT also keeps clear of the node's own connections (it
// tracks them as well).
const (
	DefaultNetfilterPortMin = 32768
	DefaultNetfilterPortMax = 65535
)

// script is the nft script that replaces both families' tables with the
// masquerade rule: kube-proxy's KUBE-POSTROUTING (clear the mark, then
// MASQUERADE --random-fully), with the port range above.
func (n Netfilter) script() string {
	var b strings.Builder
	for _, fam := range nft.Families {
		nft.DeleteTable(&b, fam, NetfilterTable)
		fmt.Fprintf(&b, "table %s %s {\n\tchain nat_postrouting {\n", fam, NetfilterTable)
		b.WriteString("\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
		fmt.Fprintf(&b, "\t\tmeta mark & %#x == 0 return\n", n.Mark)
		fmt.Fprintf(&b, "\t\tmeta mark set meta mark ^ %#x\n", n.Mark)
		fmt.Fprintf(&b, "\t\tmeta l4proto { tcp, udp, sctp } counter masquerade to :%d-%d fully-random\n", n.PortMin, n.PortMax)
		b.WriteString("\t\tcounter masquerade fully-random\n\t}\n}\n")
	}
	return b.String()
}

func (n Netfilter) validate() error {
	if n.Mark == 0 || n.Mark&(n.Mark-1) != 0 {
		return fmt.Errorf("masquerade mark %#x: want a single bit", n.Mark)
	}
	if n.PortMin == 0 || n.PortMax < n.PortMin {
		return fmt.Errorf("masquerade ports %d-%d: want lo-hi with 0 < lo <= hi", n.PortMin, n.PortMax)
	}
	return nil
}

// InstallNetfilter writes (or rewrites) the netfilter mode's table in the
// calling thread's network namespace. It needs the nft binary, as the IPVS
// mode does.
func InstallNetfilter(n Netfilter) error {
	if err := n.validate(); err != nil {
		return err
	}
	return nft.Run(n.script())
}

// RemoveNetfilter deletes the netfilter mode's tables; absent ones are
// fine.
func RemoveNetfilter() error {
	if _, err := exec.LookPath("nft"); err != nil {
		// Without nft there cannot be a table of ours.
		return nil
	}
	return nft.DeleteTables(NetfilterTable)
}
