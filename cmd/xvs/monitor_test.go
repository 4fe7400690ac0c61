package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/xvs-lb/xvs/agent"
	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// startMonitor runs `xvs monitor -o json` in the node namespace with extra
// flags and waits until it listens.
func startMonitor(t *testing.T, w *harness.Single, extra ...string) (*lab.Process, string) {
	t.Helper()
	return startMonitorArgs(t, w, append([]string{"-o", "json", "--pin-path", w.PinPath}, extra...)...)
}

// startMonitorArgs runs `xvs monitor ARGS` in the node namespace and waits until
// it listens; it returns the process and the file of its output.
func startMonitorArgs(t *testing.T, w *harness.Single, args ...string) (*lab.Process, string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "monitor.log")
	p, err := lab.Start(w.Node.NS, log, w.Bin, append([]string{"monitor"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	if err := w.WaitCount("monitor listening", 1, 10*time.Second, func() (int, error) {
		b, err := os.ReadFile(log)
		return strings.Count(string(b), "listening for drop and reject events"), err
	}); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("%v:\n%s", err, b)
	}
	return p, log
}

// monitorEvents stops the monitor and reads what it printed: the events
// (its JSON lines) and its closing summary.
func monitorEvents(t *testing.T, p *lab.Process, log string) ([]model.MonitorEvent, string) {
	t.Helper()
	return monitorEventsAfter(t, p, log, 0)
}

// monitorEventsAfter is monitorEvents once the monitor has printed at
// least n events, or 10 s have passed: a log message reaches the monitor
// a moment after the packet is refused, and a loaded machine (two VMs
// under emulation) can stretch that moment past the test's next step.
func monitorEventsAfter(t *testing.T, p *lab.Process, log string, n int) ([]model.MonitorEvent, string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); n > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(log)
		events := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "{") && strings.HasSuffix(line, "}") {
				events++
			}
		}
		if events >= n {
			break
		}
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []model.MonitorEvent
	var rest []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			rest = append(rest, line)
			continue
		}
		var ev model.MonitorEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("monitor printed %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs, strings.Join(rest, "\n")
}

// TestPrivMonitor: `xvs monitor` reports each connection the datapath
// refuses or drops, with the reason, the client's address and port as
// sent, the frontend and the device: a port the ClusterIP does not have
// (REJECT), an unallocated address of the service range (DROP), the
// Service without endpoints (REJECT, TCP and UDP), with the Service's
// name where the agent publishes one. Connections served meanwhile give
// no event. Its exit turns the events off. A second monitor with a
// low rate, under a flood of dropped datagrams, gets no more than its
// rate allows and reports the rest as suppressed.
func TestPrivMonitor(t *testing.T) {
	w := newWorld(t, "--service-cluster-ip-range", "172.30.0.0/24")
	p, log := startMonitor(t, w)

	client := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(harness.DemoClientIP, port) }
	vip := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(harness.DemoVIP, port) }
	unallocated := netip.AddrPortFrom(netip.MustParseAddr("172.30.0.99"), 80)
	connect := func(src, dst netip.AddrPort, want lab.Verdict) {
		t.Helper()
		_, err := lab.Transfer(w.Client, src, dst, lab.TransferSpec{Download: 1 << 20, Connect: time.Second, Timeout: 5 * time.Second})
		if got := lab.Classify(err); got != want {
			t.Fatalf("%s -> %s: %v (%v), want %v", src, dst, got, err, want)
		}
	}
	// Served: no event.
	connect(client(40000), vip(80), lab.OK)
	connect(client(40001), vip(81), lab.Refused)
	connect(client(40002), unallocated, lab.Timeout)
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitProgrammed(0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	connect(client(40003), vip(80), lab.Refused)
	if r := lab.ProbeUDP(w.Client, harness.DemoClientIP, vip(53), 2*time.Second); r.Verdict != lab.Refused {
		t.Fatalf("UDP to the Service without endpoints: %v, want REFUSED", r)
	}
	// A process of the node itself: the socket-level balancer refuses
	// its connect(), before any packet.
	if _, err := lab.Transfer(w.Node.NS, netip.AddrPortFrom(harness.DemoNodeIP, 0), vip(80), lab.TransferSpec{Download: 1 << 10, Connect: time.Second, Timeout: 5 * time.Second}); lab.Classify(err) != lab.Refused {
		t.Fatalf("the node to the Service without endpoints: %v, want REFUSED", err)
	}
	evs, summary := monitorEvents(t, p, log)
	t.Logf("%d events:", len(evs))
	for _, ev := range evs {
		t.Logf("  %+v", ev)
	}
	find := func(reason string, src, dst netip.AddrPort, proto string) *model.MonitorEvent {
		for i, ev := range evs {
			if ev.Reason == reason && ev.Protocol == proto && ev.Destination == dst && (!src.IsValid() || ev.Source == src) {
				return &evs[i]
			}
		}
		return nil
	}
	for _, want := range []struct {
		typ, reason string
		src, dst    netip.AddrPort
		proto       string
	}{
		{"reject", "reject_wrong_port", client(40001), vip(81), "TCP"},
		{"drop", "drop_unallocated_service_ip", client(40002), unallocated, "TCP"},
		{"reject", "reject_no_endpoints", client(40003), vip(80), "TCP"},
		{"reject", "reject_no_endpoints", netip.AddrPort{}, vip(53), "UDP"},
	} {
		ev := find(want.reason, want.src, want.dst, want.proto)
		if ev == nil {
			t.Errorf("no %s event for %s %s -> %s", want.reason, want.proto, want.src, want.dst)
			continue
		}
		if ev.Type != want.typ || ev.Device != "ext1" || ev.Hook != "tc" || ev.Length == 0 || time.Since(ev.Time) > time.Minute || ev.Time.After(time.Now()) {
			t.Errorf("event %+v: want type %s, device ext1, hook tc, a length, a time in the last minute", *ev, want.typ)
		}
		if want.proto == "TCP" && ev.TCPFlags != "SYN" {
			t.Errorf("event %+v: want the SYN", *ev)
		}
	}
	if ev := find("host_socket_refused", netip.AddrPortFrom(harness.DemoNodeIP, 0), vip(80), "TCP"); ev == nil {
		t.Errorf("no host_socket_refused event for the node's connect() to %s", vip(80))
	} else if ev.Type != "reject" || ev.Hook != "socket" || ev.Device != "" {
		t.Errorf("event %+v: want type reject, hook socket, no device", *ev)
	}
	for _, ev := range evs {
		if ev.Source == client(40000) {
			t.Errorf("an event for the served connection: %+v", ev)
		}
	}
	// The running agent's services file names the Service: the port of a
	// frontend, the Service alone for a port its ClusterIP lacks.
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		reason  string
		dst     netip.AddrPort
		service string
	}{
		{"reject_no_endpoints", vip(80), `"service":{"namespace":"demo","name":"web","port":"http","kind":"ClusterIP"}`},
		{"reject_wrong_port", vip(81), `"service":{"namespace":"demo","name":"web","port":"","kind":"ClusterIP"}`},
		{"drop_unallocated_service_ip", unallocated, ""},
	} {
		found := false
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, `"reason":"`+want.reason+`"`) || !strings.Contains(line, `"destination":"`+want.dst.String()+`"`) {
				continue
			}
			found = true
			if want.service == "" && strings.Contains(line, `"service"`) || !strings.Contains(line, want.service) {
				t.Errorf("%s -> %s: want %s in %s", want.reason, want.dst, cmp.Or(want.service, "no service"), line)
			}
		}
		if !found {
			t.Errorf("no %s event for %s in:\n%s", want.reason, want.dst, b)
		}
	}
	if !strings.Contains(summary, "0 suppressed by the rate limit, 0 lost") {
		t.Errorf("summary %q: want nothing suppressed or lost", summary)
	}
	// The monitor's exit turned the events off.
	settings, err := ebpf.LoadPinnedMap(filepath.Join(w.PinPath, xbpf.XvsMapXvsMonitorConfig), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer settings.Close()
	var s xbpf.MonitorSettings
	if err := settings.Lookup(uint32(0), &s); err != nil || s.Enabled != 0 {
		t.Errorf("monitor settings after its exit: %+v %v, want disabled", s, err)
	}

	// A flood: 20,000 datagrams to the unallocated address from one
	// client, under a monitor that takes 10 a second with bursts of 5.
	p, log = startMonitor(t, w, "--rate", "10", "--burst", "5")
	start := time.Now()
	const flood = 20000
	if err := w.Client.Do(func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(client(40010)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(unallocated.Addr(), 53)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range flood {
			if _, err := c.Write([]byte("flood")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	evs, summary = monitorEvents(t, p, log)
	took := time.Since(start)
	// Per CPU: the burst, then the rate.
	most := 2 * (5 + int(10*took.Seconds()+1))
	n := 0
	for _, ev := range evs {
		if ev.Reason == "drop_unallocated_service_ip" && ev.Source == client(40010) {
			n++
		}
	}
	m := regexp.MustCompile(`(\d+) suppressed by the rate limit`).FindStringSubmatch(summary)
	suppressed := -1
	if m != nil {
		suppressed, _ = strconv.Atoi(m[1])
	}
	t.Logf("flood of %d datagrams in %v: %d events, %d suppressed", flood, took, n, suppressed)
	if n == 0 || n > most || suppressed < flood-most {
		t.Errorf("flood: %d events (want 1 to %d), %d suppressed (want at least %d); summary %q", n, most, suppressed, flood-most, summary)
	}
}

// TestPrivIPVSMonitor: in ipvs mode `xvs monitor` reports, from the NFLOG
// group of xvs's rules, the connections the node refuses: a port the
// ClusterIP does not have (xvs's reject rule), the Service without
// endpoints (IPVS's own ICMP, TCP and UDP), from the client and from the
// node itself (the output hook, with its real source). A connection
// served meanwhile gives no event; a second monitor is refused while the
// first listens; --rate is refused in this mode; the text output.
func TestPrivIPVSMonitor(t *testing.T) {
	w := newIPVSWorld(t, "--proxy-mode", "ipvs")
	p, log := startMonitor(t, w, "--proxy-mode", "ipvs")
	client := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(harness.DemoClientIP, port) }
	vip := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(harness.DemoVIP, port) }
	connect := func(ns *lab.NS, src, dst netip.AddrPort, want lab.Verdict) {
		t.Helper()
		_, err := lab.Transfer(ns, src, dst, lab.TransferSpec{Download: 1 << 20, Connect: time.Second, Timeout: 5 * time.Second})
		if got := lab.Classify(err); got != want {
			t.Fatalf("%s -> %s: %v (%v), want %v", src, dst, got, err, want)
		}
	}
	connect(w.Client, client(40000), vip(80), lab.OK)
	connect(w.Client, client(40001), vip(81), lab.Refused)
	if out, err := lab.Run(w.Node.NS, w.Bin, "monitor", "--proxy-mode", "ipvs", "--timeout", "1s"); err == nil ||
		!strings.Contains(string(out), "bound by another process") {
		t.Errorf("a second monitor: %v\n%s", err, out)
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "monitor", "--proxy-mode", "ipvs", "--rate", "10"); err == nil ||
		!strings.Contains(string(out), "apply to ebpf mode") {
		t.Errorf("--rate in ipvs mode: %v\n%s", err, out)
	}
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	// The rules go in before IPVS changes (ipvs.Datapath.Sync): once the
	// virtual server has no real server of weight, no_endpoints holds it.
	if err := waitIPVS(w, 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	connect(w.Client, client(40003), vip(80), lab.Refused)
	if r := lab.ProbeUDP(w.Client, harness.DemoClientIP, vip(53), 2*time.Second); r.Verdict != lab.Refused {
		t.Fatalf("UDP to the Service without endpoints: %v, want REFUSED", r)
	}
	connect(w.Node.NS, netip.AddrPortFrom(harness.DemoNodeIP, 40004), vip(80), lab.Refused)
	evs, summary := monitorEventsAfter(t, p, log, 4)
	for _, ev := range evs {
		t.Logf("  %+v", ev)
	}
	for _, want := range []struct {
		reason, proto, hook, dev string
		src, dst                 netip.AddrPort
	}{
		{"reject_wrong_port", "TCP", "input", "ext1", client(40001), vip(81)},
		{"reject_no_endpoints", "TCP", "input", "ext1", client(40003), vip(80)},
		{"reject_no_endpoints", "UDP", "input", "ext1", netip.AddrPort{}, vip(53)},
		{"reject_no_endpoints", "TCP", "output", "", netip.AddrPortFrom(harness.DemoNodeIP, 40004), vip(80)},
	} {
		i := slices.IndexFunc(evs, func(ev model.MonitorEvent) bool {
			return ev.Reason == want.reason && ev.Protocol == want.proto && ev.Destination == want.dst && (!want.src.IsValid() || ev.Source == want.src)
		})
		if i < 0 {
			t.Errorf("no %s event for %s %s -> %s", want.reason, want.proto, want.src, want.dst)
			continue
		}
		ev := evs[i]
		if ev.Type != "reject" || ev.Hook != want.hook || want.dev != "" && ev.Device != want.dev || ev.Device == "" ||
			ev.Length == 0 || time.Since(ev.Time) > time.Minute || ev.Time.After(time.Now()) {
			t.Errorf("event %+v: want a reject in the %s hook, device %q, a length, a time in the last minute", ev, want.hook, want.dev)
		}
		if want.proto == "TCP" && ev.TCPFlags != "SYN" {
			t.Errorf("event %+v: want the SYN", ev)
		}
	}
	for _, ev := range evs {
		if ev.Source == client(40000) {
			t.Errorf("an event for the served connection: %+v", ev)
		}
	}
	if !strings.Contains(summary, "0 lost") {
		t.Errorf("summary %q: want nothing lost", summary)
	}

	// The text output, as an operator reads it.
	text, log := startMonitorArgs(t, w, "--proxy-mode", "ipvs", "--count", "1", "--timeout", "20s")
	connect(w.Client, client(40005), vip(81), lab.Refused)
	if err := text.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(log)
	if !regexp.MustCompile(`reject reject_wrong_port +TCP 192\.0\.2\.\d+:40005 -> \S+:81 \[SYN\] dev ext1 \(input\) \d+ bytes`).Match(b) {
		t.Errorf("text output:\n%s", b)
	}
	t.Logf("xvs monitor (ipvs):\n%s", b)
}

// queuedEvents is a MonitorSource that hands out its events, then is
// closed.
type queuedEvents []model.MonitorEvent

func (q *queuedEvents) Read(time.Time) (model.MonitorEvent, error) {
	if len(*q) == 0 {
		return model.MonitorEvent{}, ringbuf.ErrClosed
	}
	ev := (*q)[0]
	*q = (*q)[1:]
	return ev, nil
}

func (q *queuedEvents) Counts() (model.MonitorCounts, error) { return model.MonitorCounts{}, nil }
func (q *queuedEvents) Close() error                         { return nil }

// writeServicesFile publishes ports as the agent does: a new file renamed
// over the old.
func writeServicesFile(t *testing.T, path string, ports ...agent.PublishedPort) {
	t.Helper()
	b, err := json.Marshal(agent.ServicesFile{SchemaVersion: agent.ServicesFileSchema, Written: time.Now(), Ports: ports})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func publishedPort(ns, name, port, proto string, frontends ...agent.PublishedFrontend) agent.PublishedPort {
	return agent.PublishedPort{Namespace: ns, Name: name, Port: port, Protocol: proto, Frontends: frontends, Endpoints: []agent.PublishedEndpoint{}}
}

// TestMonitorServiceNames: with the agent's services file, `xvs monitor`
// names the Service port each event was sent to, in its text (last, as
// xvs list prints it) and in an added JSON field `service`: a frontend
// by its owner (the first port of the file that has it, as the datapath
// gives it); an address of one Service's on a port it lacks
// (reject_wrong_port) by that Service, without a port; neither a node's
// address off its NodePorts nor an address two Services share. Without the file, or with one it cannot
// read, the events come unnamed and nothing fails. A file the agent
// rewrites is read again.
func TestMonitorServiceNames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "services.json")
	fe := func(addr, kind string) agent.PublishedFrontend {
		return agent.PublishedFrontend{Address: netip.MustParseAddrPort(addr), Kind: kind}
	}
	writeServicesFile(t, path,
		publishedPort("demo", "web", "http", "TCP", fe("172.30.0.10:80", "ClusterIP"), fe("192.168.50.2:30080", "NodePort")),
		publishedPort("demo", "web", "dns", "UDP", fe("172.30.0.10:53", "ClusterIP")),
		publishedPort("demo", "also", "http", "TCP", fe("172.30.0.10:80", "ClusterIP"), fe("192.168.50.2:30081", "NodePort")),
		publishedPort("demo", "solo", "http", "TCP", fe("172.30.0.12:80", "ClusterIP")),
		publishedPort("shop", "a", "http", "TCP", fe("203.0.113.1:80", "LoadBalancer")),
		publishedPort("shop", "b", "https", "TCP", fe("203.0.113.1:443", "LoadBalancer")),
	)
	event := func(reason, proto, dst string) model.MonitorEvent {
		return model.MonitorEvent{Time: time.Now(), Type: strings.SplitN(reason, "_", 2)[0], Reason: reason, Protocol: proto,
			Source: netip.MustParseAddrPort("192.0.2.10:40000"), Destination: netip.MustParseAddrPort(dst), Device: "ext1", Hook: "tc", Length: 74}
	}
	events := []model.MonitorEvent{
		event("reject_no_endpoints", "TCP", "172.30.0.10:80"),
		event("reject_wrong_port", "TCP", "172.30.0.12:81"),
		event("reject_wrong_port", "TCP", "172.30.0.10:81"),
		event("drop_no_local_endpoints", "TCP", "192.168.50.2:30080"),
		event("drop_source_range", "TCP", "192.168.50.2:22"),
		event("drop_unallocated_service_ip", "TCP", "172.30.0.99:80"),
		event("reject_wrong_port", "TCP", "203.0.113.1:8443"),
		event("reject_no_endpoints", "UDP", "172.30.0.10:53"),
	}
	want := []string{"demo/web:http ClusterIP", "demo/solo ClusterIP", "", "demo/web:http NodePort", "", "", "", "demo/web:dns ClusterIP"}
	run := func(names *serviceNames, output string) string {
		t.Helper()
		q := queuedEvents(slices.Clone(events))
		var out bytes.Buffer
		n, err := monitorLoop(&q, &out, names, "", output, 0, 0, nil)
		if err != nil || n != len(events) {
			t.Fatalf("monitorLoop: %d events, %v; want %d", n, err, len(events))
		}
		return out.String()
	}

	lines := strings.Split(strings.TrimSpace(run(newServiceNames(path), "json")), "\n")
	for i, line := range lines {
		var got struct {
			model.MonitorEvent
			Service *maps.ServiceRef `json:"service"`
		}
		var plain model.MonitorEvent
		if err := json.Unmarshal([]byte(line), &got); err != nil || json.Unmarshal([]byte(line), &plain) != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if plain.Reason != events[i].Reason || plain.Destination != events[i].Destination || plain.Device != "ext1" || plain.Length != 74 {
			t.Errorf("line %q: the event's own fields changed: %+v", line, plain)
		}
		name := ""
		if got.Service != nil {
			name = got.Service.String() + " " + got.Service.Kind
		}
		if name != want[i] {
			t.Errorf("%s -> %s: service %q, want %q (%s)", events[i].Reason, events[i].Destination, name, want[i], line)
		}
		if want[i] == "" && strings.Contains(line, `"service"`) {
			t.Errorf("an unnamed event has a service field: %s", line)
		}
	}

	lines = strings.Split(strings.TrimSpace(run(newServiceNames(path), "text")), "\n")
	for i, line := range lines {
		name, _, _ := strings.Cut(want[i], " ")
		if !strings.Contains(line, events[i].Destination.String()+" dev ext1 (tc) 74 bytes") ||
			name != "" && !strings.HasSuffix(line, "bytes  "+name) || name == "" && !strings.HasSuffix(line, "bytes") {
			t.Errorf("text line %q: want the event, then %q", line, name)
		}
	}

	// No file, or one of a layout this build does not read: no names.
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"schemaVersion": "xvs.services/v9"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "none.json"), bad} {
		if out := run(newServiceNames(p), "json"); strings.Contains(out, `"service"`) {
			t.Errorf("names from %s:\n%s", p, out)
		}
	}

	// The agent rewrites the file: the next look, a second on, reads it.
	names := newServiceNames(path)
	if ref := names.of("TCP", netip.MustParseAddrPort("172.30.0.11:80")); ref != nil {
		t.Fatalf("172.30.0.11:80 named %v before any Service has it", ref)
	}
	writeServicesFile(t, path, publishedPort("demo", "new", "http", "TCP", fe("172.30.0.11:80", "ClusterIP")))
	if ref := names.of("TCP", netip.MustParseAddrPort("172.30.0.11:80")); ref != nil {
		t.Errorf("the file read again within the second: %v", ref)
	}
	names.checked = names.checked.Add(-time.Second)
	if ref := names.of("TCP", netip.MustParseAddrPort("172.30.0.11:80")); ref == nil || ref.String() != "demo/new:http" {
		t.Errorf("172.30.0.11:80 after the rewrite: %v, want demo/new:http", ref)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	names.checked = names.checked.Add(-time.Second)
	if ref := names.of("TCP", netip.MustParseAddrPort("172.30.0.11:80")); ref != nil {
		t.Errorf("named %v after the agent removed the file", ref)
	}
}
