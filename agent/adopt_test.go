package agent

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/model"
)

// TestAdoptedFlowOf: netfilter's entries of translated connections (an
// IPVS NAT forward, a masqueraded DNAT) become flows to adopt; untranslated
// ones, other zones and other protocols do not; the delete filter matches
// exactly the adopted flows' entries.
func TestAdoptedFlowOf(t *testing.T) {
	entry := func(proto uint8, src, dst string, sport, dport uint16, rsrc, rdst string, rsport, rdport uint16) *netlink.ConntrackFlow {
		return &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 86000,
			Forward:   netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst), SrcPort: sport, DstPort: dport},
			Reverse:   netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(rsrc), DstIP: net.ParseIP(rdst), SrcPort: rsport, DstPort: rdport},
			ProtoInfo: &netlink.ProtoInfoTCP{State: tcpConntrackEstablished}}
	}
	ipvs := entry(unix.IPPROTO_TCP, "10.244.3.4", "172.30.0.10", 40000, 80, "10.244.1.2", "10.244.3.4", 8080, 40000)
	masq := entry(unix.IPPROTO_UDP, "192.0.2.10", "192.168.50.2", 5353, 30053, "10.244.1.2", "192.168.50.2", 53, 5353)
	plain := entry(unix.IPPROTO_TCP, "10.244.3.4", "10.244.1.2", 40001, 8080, "10.244.1.2", "10.244.3.4", 8080, 40001)
	zoned := entry(unix.IPPROTO_TCP, "10.244.3.4", "172.30.0.10", 40002, 80, "10.244.1.2", "10.244.3.4", 8080, 40002)
	zoned.Zone = 7
	icmp := entry(unix.IPPROTO_ICMP, "10.244.3.4", "172.30.0.10", 0, 0, "10.244.1.2", "10.244.3.4", 0, 0)

	f, ok := adoptedFlowOf(ipvs)
	if !ok || f.Proto != model.TCP || f.Client.String() != "10.244.3.4:40000" || f.Frontend.String() != "172.30.0.10:80" ||
		f.Backend.String() != "10.244.1.2:8080" || f.Masqueraded() || f.Remaining != 86000*time.Second {
		t.Errorf("IPVS NAT entry: %+v %v", f, ok)
	}
	if f, ok := adoptedFlowOf(masq); !ok || f.Proto != model.UDP || !f.Masqueraded() || f.ReplyTo.String() != "192.168.50.2:5353" {
		t.Errorf("masqueraded NodePort entry: %+v %v", f, ok)
	}
	for name, e := range map[string]*netlink.ConntrackFlow{"untranslated": plain, "zone 7": zoned, "ICMP": icmp} {
		if f, ok := adoptedFlowOf(e); ok {
			t.Errorf("%s entry taken as a flow to adopt: %+v", name, f)
		}
	}
	filter := adoptedFilter{}
	filter[adoptedKey(f.Proto, f.Client, f.Frontend)] = true
	if !filter.MatchConntrackFlow(ipvs) || filter.MatchConntrackFlow(masq) || filter.MatchConntrackFlow(plain) || filter.MatchConntrackFlow(zoned) {
		t.Error("the delete filter matches other entries than the adopted flow's")
	}
}
