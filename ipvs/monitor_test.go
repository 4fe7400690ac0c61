package ipvs

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/nft"
)

// TestDecodeNFLOGPacket reads the fields of logged packets: IPv4 TCP with
// options, IPv6 UDP behind extension headers, a later fragment (no ports)
// and packets too short to hold what their headers say.
func TestDecodeNFLOGPacket(t *testing.T) {
	v4 := make([]byte, 24+20)
	v4[0] = 0x46 // IHL 6: one word of options
	binary.BigEndian.PutUint16(v4[2:], 1500)
	v4[9] = unix.IPPROTO_TCP
	copy(v4[12:], []byte{198, 51, 100, 20})
	copy(v4[16:], []byte{10, 96, 0, 10})
	binary.BigEndian.PutUint16(v4[24:], 40000)
	binary.BigEndian.PutUint16(v4[26:], 81)
	v4[24+13] = 0x02 // SYN

	v6 := make([]byte, 40+8+16+8)
	v6[0] = 0x60
	binary.BigEndian.PutUint16(v6[4:], uint16(len(v6)-40))
	v6[6] = unix.IPPROTO_HOPOPTS
	copy(v6[8:], netip.MustParseAddr("2001:db8::20").AsSlice())
	copy(v6[24:], netip.MustParseAddr("fd00::10").AsSlice())
	v6[40], v6[41] = unix.IPPROTO_DSTOPTS, 0 // hop-by-hop: 8 bytes
	v6[48], v6[49] = unix.IPPROTO_UDP, 1     // destination options: 16 bytes
	binary.BigEndian.PutUint16(v6[64:], 5353)
	binary.BigEndian.PutUint16(v6[66:], 53)

	frag := append([]byte(nil), v4...)
	binary.BigEndian.PutUint16(frag[6:], 185) // fragment offset 185*8

	for _, c := range []struct {
		name   string
		family uint8
		p      []byte
		want   model.MonitorEvent
		ok     bool
	}{
		{"IPv4 TCP SYN with options", unix.AF_INET, v4, model.MonitorEvent{Protocol: "TCP", Length: 1500,
			Source: netip.MustParseAddrPort("198.51.100.20:40000"), Destination: netip.MustParseAddrPort("10.96.0.10:81"), TCPFlags: "SYN"}, true},
		{"IPv6 UDP behind two extension headers", unix.AF_INET6, v6, model.MonitorEvent{Protocol: "UDP", Length: uint32(len(v6)),
			Source: netip.MustParseAddrPort("[2001:db8::20]:5353"), Destination: netip.MustParseAddrPort("[fd00::10]:53")}, true},
		{"an IPv4 later fragment", unix.AF_INET, frag, model.MonitorEvent{Protocol: "TCP", Length: 1500,
			Source: netip.MustParseAddrPort("198.51.100.20:0"), Destination: netip.MustParseAddrPort("10.96.0.10:0")}, true},
		{"IPv4 shorter than its IHL", unix.AF_INET, v4[:22], model.MonitorEvent{}, false},
		{"IPv6 extension header cut short", unix.AF_INET6, v6[:52], model.MonitorEvent{}, false},
		{"IPv4 bytes said to be IPv6", unix.AF_INET6, v4, model.MonitorEvent{}, false},
	} {
		got, ok := decodePacket(c.family, c.p)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestPrivNFLOGMonitor applies the rules ipvs mode writes for a
// LoadBalancer Service without endpoints, with source ranges, to a node,
// sends it what they refuse and drop from a client and from the node
// itself, and reads the events back through the monitor: reason, type,
// addresses, hook and device of each, the rules' rate limit under a flood,
// and a second monitor refused while the first listens. It needs no IPVS
// (nothing here is forwarded), so it runs on every kernel with nftables.
func TestPrivNFLOGMonitor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the NFLOG monitor test needs root")
	}
	l, err := lab.New(lab.UniquePrefix("nflog"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	node, err := l.AddNode("node", nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	clientIP := netip.MustParseAddr("198.51.100.20")
	client, err := l.AddClient(node, "client", clientIP)
	if err != nil {
		t.Fatal(err)
	}
	sp := webPort()
	sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	st := state(sp)
	for _, a := range []string{vip.String(), lbIP.String()} {
		run(t, node.NS, "ip", "addr", "add", a+"/32", "dev", "lo")
	}
	in(t, node.NS, func() error { return nft.Run(renderRules(st, buildDesired(st, "", nil), Config{})) })
	var m *Monitor
	in(t, node.NS, func() (err error) { m, err = OpenMonitor(); return err })
	t.Cleanup(func() { m.Close() })
	in(t, node.NS, func() error {
		if _, err := OpenMonitor(); err == nil || !strings.Contains(err.Error(), "bound by another process") {
			t.Errorf("a second monitor of the namespace: %v, want the group bound by another process", err)
		}
		return nil
	})

	send := func(ns *lab.NS, proto string, to netip.AddrPort) {
		t.Helper()
		in(t, ns, func() error {
			c, err := net.DialTimeout(proto, to.String(), 300*time.Millisecond)
			if err == nil {
				if proto == "udp" {
					c.Write([]byte("ping"))
				}
				c.Close()
			}
			return nil
		})
	}
	type seen struct {
		typ, reason, proto, hook string
		dst                      netip.AddrPort
	}
	expect := func(name string, want seen, src netip.Addr, dev string) {
		t.Helper()
		// Delivered as the packet is dropped: the kernel's default
		// batching (100 packets or a second) would miss this deadline.
		end := time.Now().Add(500 * time.Millisecond)
		var other []model.MonitorEvent
		for {
			ev, err := m.Read(end)
			if err != nil {
				t.Errorf("%s: no event %+v (%v); others: %+v", name, want, err, other)
				return
			}
			got := seen{ev.Type, ev.Reason, ev.Protocol, ev.Hook, ev.Destination}
			if got != want || src.IsValid() && ev.Source.Addr() != src {
				other = append(other, ev)
				continue
			}
			if dev != "" && ev.Device != dev {
				t.Errorf("%s: device %q, want %q", name, ev.Device, dev)
			}
			if ev.Protocol == "TCP" && !strings.Contains(ev.TCPFlags, "SYN") {
				t.Errorf("%s: TCP flags %q of the first packet", name, ev.TCPFlags)
			}
			if ev.Source.Port() == 0 || ev.Length == 0 || time.Since(ev.Time) > time.Minute {
				t.Errorf("%s: event %+v", name, ev)
			}
			return
		}
	}
	// The node's side of the client's veth, as the monitor names it.
	ext := node.IfaceNames(lab.RoleExternal)
	if len(ext) != 1 {
		t.Fatalf("node's external links: %v", ext)
	}
	ap := netip.AddrPortFrom
	send(client, "tcp", ap(vip, 81))
	expect("a ClusterIP's port no Service has", seen{"reject", "reject_wrong_port", "TCP", "input", ap(vip, 81)}, clientIP, ext[0])
	send(client, "udp", ap(vip, 80))
	expect("UDP to a TCP Service's port", seen{"reject", "reject_wrong_port", "UDP", "input", ap(vip, 80)}, clientIP, ext[0])
	send(client, "tcp", ap(lbIP, 80))
	expect("outside the source ranges", seen{"drop", "drop_source_range", "TCP", "input", ap(lbIP, 80)}, clientIP, ext[0])
	send(client, "tcp", ap(vip, 80))
	expect("a ClusterIP without endpoints", seen{"reject", "reject_no_endpoints", "TCP", "input", ap(vip, 80)}, clientIP, ext[0])
	send(client, "tcp", ap(nodeIP, 30080))
	expect("a NodePort without endpoints", seen{"reject", "reject_no_endpoints", "TCP", "input", ap(nodeIP, 30080)}, clientIP, ext[0])
	send(node.NS, "tcp", ap(vip, 80))
	expect("the node's own connection", seen{"reject", "reject_no_endpoints", "TCP", "output", ap(vip, 80)}, netip.Addr{}, "lo")

	// A flood: the rule's limit lets through its burst and then its rate.
	const flood = 5000
	start := time.Now()
	in(t, client, func() error {
		c, err := net.Dial("udp", ap(vip, 9).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for range flood {
			c.Write([]byte("x")) // refused with ICMP: later writes may fail, and are sent anyway
		}
		return nil
	})
	n := 0
	for {
		ev, err := m.Read(time.Now().Add(500 * time.Millisecond))
		if err != nil {
			break
		}
		if ev.Destination == ap(vip, 9) {
			n++
		}
	}
	most := MonitorBurst + int(time.Since(start).Seconds()*MonitorRate) + 1
	if n < MonitorBurst || n > most {
		t.Errorf("a flood of %d refused packets gave %d events: want the burst (%d) at least, at most %d over %v",
			flood, n, MonitorBurst, most, time.Since(start))
	}
	if c, _ := m.Counts(); c.Lost != 0 {
		t.Errorf("%d events lost with the reader keeping up", c.Lost)
	}
	t.Logf("flood: %d packets, %d events in %v", flood, n, time.Since(start))

	// Closed, the group is free for the next monitor.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	in(t, node.NS, func() (err error) { m, err = OpenMonitor(); return err })
}
