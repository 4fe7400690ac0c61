package main

import (
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
)

// TestPrivListConnections: `xvs list -c` shows a live TCP connection
// through the VIP (client, VIP, the pod it reached, ESTABLISHED, a 24 h
// expiry), then its close (TIME_WAIT), and a UDP flow; -t and -u filter by
// frontend.
func TestPrivListConnections(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(demoVIP, 80)
	udp := netip.AddrPortFrom(demoVIP, 53)
	list := func(args ...string) []maps.Connection {
		t.Helper()
		out, err := lab.Run(w.Node.NS, w.bin, append([]string{"list", "-c", "-o", "json", "--pin-path", w.PinPath}, args...)...)
		if err != nil {
			t.Fatalf("xvs list -c: %v\n%s", err, out)
		}
		var v struct{ Connections []maps.Connection }
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return v.Connections
	}
	find := func(cs []maps.Connection, src netip.AddrPort) *maps.Connection {
		i := slices.IndexFunc(cs, func(c maps.Connection) bool { return c.Source == src })
		if i < 0 {
			return nil
		}
		return &cs[i]
	}

	reply, c, err := lab.DialTCP(w.Client, demoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if err := lab.EchoCheck(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if r := lab.ProbeUDP(w.Client, demoClientIP, udp, 2*time.Second); r.Verdict != lab.OK {
		t.Fatalf("UDP probe: %v", r)
	}
	cs := list()
	got := find(cs, src)
	if got == nil {
		t.Fatalf("connection from %s not listed: %+v", src, cs)
	}
	if got.Protocol != "TCP" || got.Virtual != tcp || got.Destination.Addr() != reply.Local.Addr() || got.State != "ESTABLISHED" ||
		!got.Replied || got.Expires < 23*time.Hour {
		t.Errorf("listed %+v, want TCP %s -> %s -> %s ESTABLISHED, replied, ~24h to live", *got, src, tcp, reply.Local)
	}
	if !slices.ContainsFunc(cs, func(c maps.Connection) bool {
		return c.Protocol == "UDP" && c.Virtual == udp && c.Source.Addr() == demoClientIP && c.State == "UDP"
	}) {
		t.Errorf("no UDP flow to %s listed: %+v", udp, cs)
	}
	for _, c := range list("-t", tcp.String()) {
		if c.Protocol != "TCP" || c.Virtual != tcp {
			t.Errorf("-t %s listed %+v", tcp, c)
		}
	}
	for _, c := range list("-u", demoVIP.String()) {
		if c.Protocol != "UDP" || c.Virtual.Addr() != demoVIP {
			t.Errorf("-u %s listed %+v", demoVIP, c)
		}
	}
	if out, err := lab.Run(w.Node.NS, w.bin, "list", "-c", "--pin-path", w.PinPath); err != nil || !slices.ContainsFunc(strings.Split(string(out), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "TCP") && strings.Contains(l, "ESTABLISHED") && strings.Contains(l, src.String()) &&
			strings.Contains(l, tcp.String()) && strings.Contains(l, reply.Local.String())
	}) {
		t.Errorf("text listing lacks the connection (%v):\n%s", err, out)
	}

	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = find(list(), src)
		if got != nil && got.State == "TIME_WAIT" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after close: %+v, want TIME_WAIT", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
