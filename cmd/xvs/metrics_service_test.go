package main

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// TestPrivServiceMetrics: the per-Service metrics of a live agent count
// what real transfers through the VIP moved: connections, bytes both ways
// at least the payloads, each backend's share summing to the frontend's,
// the one connection held open as active, and the backends programmed,
// down to zero when the Service loses its endpoints.
func TestPrivServiceMetrics(t *testing.T) {
	const metricsAddr = "127.0.0.1:10249"
	w := newWorld(t, "--metrics-bind-address", metricsAddr)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	const transfers, down, up = 6, 2 << 20, 1 << 20
	for i := range transfers {
		res, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), tcp, lab.TransferSpec{Download: down, Upload: up})
		if err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		if res.Downloaded != down || res.Uploaded != up {
			t.Fatalf("transfer %d moved %d down, %d up", i, res.Downloaded, res.Uploaded)
		}
	}
	_, held, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := lab.EchoCheck(held, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	const udpProbes = 5
	for range udpProbes {
		if r := lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 2*time.Second); r.Verdict != lab.OK {
			t.Fatalf("UDP probe: %v", r)
		}
	}

	scrape := func() string {
		t.Helper()
		code, _, body, err := nsGet(w.Node.NS, "http://"+metricsAddr+"/metrics")
		if err != nil || code != 200 {
			t.Fatalf("/metrics: %d %v", code, err)
		}
		return body
	}
	labels := func(port, proto string, fe netip.AddrPort) string {
		return fmt.Sprintf(`{frontend="%s",kind="ClusterIP",namespace="demo",port="%s",protocol="%s",service="web"}`, fe, port, proto)
	}
	http, dns := labels("http", "TCP", tcp), labels("dns", "UDP", udp)
	body := scrape()
	value := func(series string) float64 {
		t.Helper()
		v := metricValue(body, series)
		if v < 0 {
			t.Fatalf("no series %s:\n%s", series, body)
		}
		return v
	}
	// Each transfer is a connection, and so is the held one.
	if got := value("xvs_service_connections_total" + http); got != transfers+1 {
		t.Errorf("connections through %s: %v, want %d", tcp, got, transfers+1)
	}
	if got := value("xvs_service_incoming_bytes_total" + http); got < transfers*up {
		t.Errorf("incoming bytes through %s: %v, want at least the %d uploaded", tcp, got, transfers*up)
	}
	if got := value("xvs_service_outgoing_bytes_total" + http); got < transfers*down {
		t.Errorf("outgoing bytes through %s: %v, want at least the %d downloaded", tcp, got, transfers*down)
	}
	if in, out := value("xvs_service_incoming_packets_total"+http), value("xvs_service_outgoing_packets_total"+http); in < 3*(transfers+1) || out < 3*(transfers+1) {
		t.Errorf("packets through %s: %v in, %v out, want at least 3 each way per connection", tcp, in, out)
	}
	if got := value("xvs_service_connections_total" + dns); got < 1 || got > udpProbes {
		t.Errorf("UDP flows through %s: %v, want 1 to %d", udp, got, udpProbes)
	}
	if got := value("xvs_service_backends" + http); got != float64(len(harness.DemoPodIPs)) {
		t.Errorf("backends of %s: %v, want %d", tcp, got, len(harness.DemoPodIPs))
	}
	// The services map: each frontend (TCP and UDP) a head and a slot
	// per backend.
	if got := value(`xvs_bpf_map_entries{map="services"}`); got != 2*(1+float64(len(harness.DemoPodIPs))) {
		t.Errorf("services map entries %v, want %d", got, 2*(1+len(harness.DemoPodIPs)))
	}
	if got := value("xvs_service_stats_read_errors"); got != 0 {
		t.Errorf("read errors %v", got)
	}
	// The backends' shares add up to the frontend's.
	backend := regexp.MustCompile(`(?m)^xvs_backend_(connections_total|outgoing_bytes_total|connections_active)\{backend="([^"]+)",frontend="` +
		regexp.QuoteMeta(tcp.String()) + `",[^}]*\} (\S+)$`)
	sums, seen := map[string]float64{}, map[string]bool{}
	for _, m := range backend.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[3], 64)
		sums[m[1]] += v
		seen[m[2]] = true
	}
	if len(seen) != len(harness.DemoPodIPs) || sums["connections_total"] != transfers+1 || sums["connections_active"] != 1 ||
		sums["outgoing_bytes_total"] < transfers*down || sums["outgoing_bytes_total"] > value("xvs_service_outgoing_bytes_total"+http) {
		t.Errorf("backends of %s: %v seen, sums %v; want %d backends, %d connections, 1 active, the frontend's bytes",
			tcp, seen, sums, len(harness.DemoPodIPs), transfers+1)
	}
	t.Logf("%s: %v connections, %v bytes in, %v out; backends %v", tcp, value("xvs_service_connections_total"+http),
		value("xvs_service_incoming_bytes_total"+http), value("xvs_service_outgoing_bytes_total"+http), sums)
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}

	// The Service loses its endpoints: the frontend stays, with none.
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitCount("metrics: backends of the VIP", 0, 10*time.Second, func() (int, error) {
		return int(metricValue(scrape(), "xvs_service_backends"+http)), nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(scrape(), `xvs_bpf_map_entries{map="services"}`); got != 2 {
		t.Errorf("services map entries without endpoints: %v, want the 2 heads", got)
	}
}
