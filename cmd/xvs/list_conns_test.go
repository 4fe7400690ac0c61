package main

import (
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/maps"
)

// TestPrivListConnections: `xvs list -c` shows a live TCP connection
// through the VIP (client, VIP, the pod it reached, ESTABLISHED, a 24 h
// expiry), then its close (TIME_WAIT), and a UDP flow; -t and -u filter by
// frontend, in -c and in the listing of virtual servers (--stats, --rate,
// text and JSON), where a virtual server that is not there is an error
// (exit status 1); --sort is taken, as ipvsadm takes it.
func TestPrivListConnections(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	list := func(args ...string) []maps.Connection {
		t.Helper()
		out, err := lab.Run(w.Node.NS, w.Bin, append([]string{"list", "-c", "-o", "json", "--pin-path", w.PinPath}, args...)...)
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

	reply, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if err := lab.EchoCheck(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if r := lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 2*time.Second); r.Verdict != lab.OK {
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
	// The running agent names the Service port (agent/publish.go).
	if got.Service == nil || got.Service.String() != "demo/web:http" || got.Service.Kind != "ClusterIP" {
		t.Errorf("connection's Service %+v, want demo/web:http (ClusterIP)", got.Service)
	}
	if !slices.ContainsFunc(cs, func(c maps.Connection) bool {
		return c.Protocol == "UDP" && c.Virtual == udp && c.Source.Addr() == harness.DemoClientIP && c.State == "UDP"
	}) {
		t.Errorf("no UDP flow to %s listed: %+v", udp, cs)
	}
	for _, c := range list("-t", tcp.String()) {
		if c.Protocol != "TCP" || c.Virtual != tcp {
			t.Errorf("-t %s listed %+v", tcp, c)
		}
	}
	for _, c := range list("-u", harness.DemoVIP.String()) {
		if c.Protocol != "UDP" || c.Virtual.Addr() != harness.DemoVIP {
			t.Errorf("-u %s listed %+v", harness.DemoVIP, c)
		}
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "list", "-c", "--pin-path", w.PinPath); err != nil || !slices.ContainsFunc(strings.Split(string(out), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "TCP") && strings.Contains(l, "ESTABLISHED") && strings.Contains(l, src.String()) &&
			strings.Contains(l, tcp.String()) && strings.Contains(l, reply.Local.String()) && strings.HasSuffix(strings.TrimSpace(l), "demo/web:http")
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
	// The virtual servers with their Service ports and endpoint states,
	// and the same in the text form.
	out, err := lab.Run(w.Node.NS, w.Bin, "list", "-o", "json", "--pin-path", w.PinPath)
	var snap maps.Snapshot
	if err != nil || json.Unmarshal(out, &snap) != nil {
		t.Fatalf("xvs list -o json: %v\n%s", err, out)
	}
	for _, sv := range snap.Services {
		want := map[string]string{"TCP": "demo/web:http", "UDP": "demo/web:dns"}[sv.Protocol]
		if sv.Service == nil || sv.Service.String() != want || sv.Service.Kind != "ClusterIP" || len(sv.Backends) != len(harness.DemoPodIPs) {
			t.Errorf("%s %s: Service %+v with %d backends, want %s (ClusterIP) with %d", sv.Protocol, sv.Address, sv.Service, len(sv.Backends), want, len(harness.DemoPodIPs))
		}
		for _, b := range sv.Backends {
			if b.State != "ready" {
				t.Errorf("%s %s backend %s: state %q, want ready", sv.Protocol, sv.Address, b.Address, b.State)
			}
		}
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "list", "--pin-path", w.PinPath); err != nil ||
		!regexp.MustCompile(`(?m)^TCP  172\.30\.0\.10:80 .*  demo/web:http$`).Match(out) || !regexp.MustCompile(`(?m)^  -> 10\.244\.0\.11:8080 .* ready$`).Match(out) {
		t.Errorf("text listing lacks the names and states (%v):\n%s", err, out)
	}
	// The structured outputs name their layout.
	for _, c := range []struct{ args, want []string }{
		{[]string{"-o", "yaml"}, []string{"schemaVersion: xvs.list/v1", "services:", "address: 172.30.0.10:80"}},
		{[]string{"-o", "json"}, []string{`"schemaVersion": "xvs.list/v1"`}},
		{[]string{"-c", "-o", "yaml"}, []string{"schemaVersion: xvs.list.connections/v1", "connections:"}},
	} {
		out, err := lab.Run(w.Node.NS, w.Bin, append(append([]string{"list"}, c.args...), "--pin-path", w.PinPath)...)
		for _, want := range c.want {
			if err != nil || !strings.Contains(string(out), want) {
				t.Errorf("xvs list %v: %v, want %q in:\n%s", c.args, err, want, out)
			}
		}
	}
	// The virtual servers -t and -u name, alone.
	for _, c := range []struct {
		args []string
		want netip.AddrPort
	}{
		{[]string{"-t", tcp.String(), "--sort"}, tcp},
		{[]string{"-u", harness.DemoVIP.String(), "--stats"}, udp},
		{[]string{"-t", tcp.String(), "--rate", "--interval", "200ms"}, tcp},
	} {
		out, err := lab.Run(w.Node.NS, w.Bin, append([]string{"list", "-o", "json", "--pin-path", w.PinPath}, c.args...)...)
		var v struct {
			Services []struct{ Address netip.AddrPort }
			Verdicts map[string]any
		}
		if err != nil || json.Unmarshal(out, &v) != nil || len(v.Services) != 1 || v.Services[0].Address != c.want || v.Verdicts != nil {
			t.Errorf("xvs list %v: %v, want %s alone:\n%s", c.args, err, c.want, out)
		}
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "list", "--stats", "-t", tcp.String(), "--pin-path", w.PinPath); err != nil ||
		!regexp.MustCompile(`(?m)^TCP  172\.30\.0\.10:80 `).Match(out) || strings.Contains(string(out), ":53") || strings.Contains(string(out), "Verdict") {
		t.Errorf("xvs list --stats -t %s (%v): want its lines alone:\n%s", tcp, err, out)
	}
	out, err = lab.Run(w.Node.NS, w.Bin, "list", "-t", netip.AddrPortFrom(harness.DemoVIP, 81).String(), "--pin-path", w.PinPath)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "no such service: TCP 172.30.0.10:81") ||
		strings.Contains(string(out), "virtual servers") {
		t.Errorf("xvs list -t of no virtual server: %v, want exit status 1 and no such service, no listing:\n%s", err, out)
	}
}

// TestPrivListRate: `xvs list --rate` over a steady stream of connections
// through the VIP (50 a second, as fast as the machine manages: a busy
// emulated guest manages fewer) reports the rate generated while it ran
// within 10%, and the packets and bytes that came with them.
func TestPrivListRate(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	stop := make(chan struct{})
	done := make(chan []time.Time)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var made []time.Time
		for {
			select {
			case <-stop:
				done <- made
				return
			case <-tick.C:
				if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, time.Second); r.Verdict == lab.OK {
					made = append(made, time.Now())
				}
			}
		}
	}()
	time.Sleep(time.Second)
	out, err := lab.Run(w.Node.NS, w.Bin, "list", "--rate", "--interval", "4s", "-o", "json", "--pin-path", w.PinPath)
	time.Sleep(200 * time.Millisecond) // the connections of the window's last instant are counted
	close(stop)
	made := <-done
	sent := len(made)
	if err != nil {
		t.Fatalf("xvs list --rate: %v\n%s", err, out)
	}
	type serviceRate struct {
		Protocol string
		Address  netip.AddrPort
		CPS      float64
		InPPS    float64
		InBPS    float64
		Backends []struct{ CPS float64 }
	}
	var v struct {
		From, To time.Time
		Services []serviceRate
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	// The rate generated over the window the command measured (between
	// the ends of its two reads, as it reports them; the same clock). A
	// busy emulated guest generates unevenly, so the window is what
	// counts, not the command's whole run.
	during := 0
	for _, at := range made {
		if at.After(v.From) && !at.After(v.To) {
			during++
		}
	}
	generated := float64(during) / v.To.Sub(v.From).Seconds()
	i := slices.IndexFunc(v.Services, func(s serviceRate) bool { return s.Protocol == "TCP" && s.Address == tcp })
	if i < 0 {
		t.Fatalf("%s not in the rates:\n%s", tcp, out)
	}
	s := v.Services[i]
	sum := 0.0
	for _, b := range s.Backends {
		sum += b.CPS
	}
	t.Logf("generated %.1f/s while the command ran (%d connections in all); listed %.1f CPS (backends %.1f), %.0f in-pps, %.0f in-Bps",
		generated, sent, s.CPS, sum, s.InPPS, s.InBPS)
	if generated < 20 {
		t.Fatalf("the machine generated only %.1f connections a second: too few to judge a rate", generated)
	}
	if s.CPS < generated*0.9 || s.CPS > generated*1.1 || sum < s.CPS*0.99 || sum > s.CPS*1.01 || s.InPPS < 3*s.CPS || s.InBPS < 40*s.InPPS {
		t.Errorf("rate of %s: %+v, want %.1f CPS within 10%% (its backends summing to it), at least 3 packets of 40+ bytes per connection", tcp, s, generated)
	}
}

// TestPrivConntrackFlush: `xvs conntrack flush` ends the flows its
// filters select, as conntrack -D does: a UDP client that keeps its port
// (which stays on its backend while its flow lives) is balanced again by
// its next datagram; a TCP connection the filter does not select keeps
// working; one it selects is ended, and its next segment is dropped. No
// filter is refused.
func TestPrivConntrackFlush(t *testing.T) {
	w := newWorld(t)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	src := netip.AddrPortFrom(harness.DemoClientIP, 40100)
	exchange := func() netip.AddrPort {
		t.Helper()
		r, err := lab.UDPExchange(w.Client, src, udp, 512, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r.Server.Local
	}
	flush := func(args ...string) string {
		t.Helper()
		out, err := lab.Run(w.Node.NS, w.Bin, append([]string{"conntrack", "flush", "--pin-path", w.PinPath}, args...)...)
		if err != nil {
			t.Fatalf("xvs conntrack flush %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	first := exchange()
	for range 5 {
		if got := exchange(); got != first {
			t.Fatalf("a UDP client keeping its port moved from %s to %s while its flow lived", first, got)
		}
	}
	reply, held, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := lab.EchoCheck(held, 2*time.Second); err != nil {
		t.Fatal(err)
	}

	if out, err := lab.Run(w.Node.NS, w.Bin, "conntrack", "flush", "--pin-path", w.PinPath); err == nil || !strings.Contains(string(out), "no filter") {
		t.Errorf("flush without a filter: %v\n%s, want it refused", err, out)
	}
	if out := flush("-p", "udp", "-d", udp.String()); !strings.Contains(out, "1 flows ended") {
		t.Errorf("flush of the UDP flow: %q, want 1 flow", out)
	}
	cs, err := lab.Run(w.Node.NS, w.Bin, "list", "-c", "-o", "json", "--pin-path", w.PinPath)
	if err != nil || strings.Contains(string(cs), src.String()) || !strings.Contains(string(cs), "ESTABLISHED") {
		t.Errorf("connections after the UDP flush (%v): want the held TCP one and not the UDP flow:\n%s", err, cs)
	}
	if err := lab.EchoCheck(held, 2*time.Second); err != nil {
		t.Fatalf("the held TCP connection after the UDP flush: %v", err)
	}
	// Each flush makes the next datagram a new flow: balanced again, it
	// reaches another backend sooner or later.
	seen := map[netip.AddrPort]bool{first: true}
	for i := 0; i < 30 && len(seen) < 2; i++ {
		seen[exchange()] = true
		flush("-s", src.String(), "-p", "udp")
	}
	if len(seen) < 2 {
		t.Errorf("30 flushes: the UDP client stayed on %v", seen)
	}

	// The held connection, selected by its backend: ended.
	if out := flush("-p", "tcp", "-r", reply.Local.String()); !strings.Contains(out, "1 flows ended") {
		t.Errorf("flush of the held TCP connection by its backend %s: %q, want 1 flow", reply.Local, out)
	}
	if err := lab.EchoCheck(held, time.Second); err == nil {
		t.Error("the ended TCP connection still answers")
	}
}
