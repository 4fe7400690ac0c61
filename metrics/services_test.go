package metrics

import (
	"errors"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/xvs-lb/xvs/model"
)

// TestServices: the per-frontend counters come out under the Service's
// name with one series per frontend, the backends' with their address, and
// none of the backends' when per-backend series are off; a failed read is
// a gauge, not a failed scrape.
func TestServices(t *testing.T) {
	web := model.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: model.TCP}
	samples := []FrontendSample{{
		Name: web, Kind: "ClusterIP", Protocol: "TCP", Address: netip.MustParseAddrPort("10.96.0.20:80"),
		Counts: Counts{Conns: 7, PacketsIn: 70, PacketsOut: 60, BytesIn: 7000, BytesOut: 600000},
		Backends: []BackendSample{
			{Address: netip.MustParseAddrPort("10.244.0.11:8080"), Weight: 1, Active: 2, Inactive: 1, Counts: Counts{Conns: 4, BytesOut: 400000}},
			{Address: netip.MustParseAddrPort("10.244.0.12:8080"), Weight: 1, Counts: Counts{Conns: 3, BytesOut: 200000}},
		},
	}, {
		Name: web, Kind: "NodePort", Protocol: "TCP", Address: netip.MustParseAddrPort("192.168.50.2:30080"),
	}, {
		// A frontend the last state does not name (being removed).
		Protocol: "UDP", Address: netip.MustParseAddrPort("10.96.0.30:53"), Counts: Counts{Conns: 1},
	}}
	var readErr error
	read := func() ([]FrontendSample, error) { return samples, readErr }
	scrape := func(m *Metrics) string { return scrapeBody(t, m) }
	const cip = `{frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"}`
	const np = `{frontend="192.168.50.2:30080",kind="NodePort",namespace="demo",port="http",protocol="TCP",service="web"}`
	const be1 = `{backend="10.244.0.11:8080",frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"}`
	m := New()
	if err := m.RegisterServices(read, ServiceOptions{PerBackend: true}); err != nil {
		t.Fatal(err)
	}
	body := scrape(m)
	for _, want := range []string{
		"xvs_service_connections_total" + cip + " 7",
		"xvs_service_incoming_packets_total" + cip + " 70",
		"xvs_service_outgoing_packets_total" + cip + " 60",
		"xvs_service_incoming_bytes_total" + cip + " 7000",
		"xvs_service_outgoing_bytes_total" + cip + " 600000",
		"xvs_service_backends" + cip + " 2",
		"xvs_service_backends" + np + " 0",
		`xvs_service_connections_total{frontend="10.96.0.30:53",kind="",namespace="",port="",protocol="UDP",service=""} 1`,
		"xvs_backend_connections_total" + be1 + " 4",
		"xvs_backend_outgoing_bytes_total" + be1 + " 400000",
		"xvs_backend_connections_active" + be1 + " 2",
		"xvs_backend_connections_inactive" + be1 + " 1",
		"xvs_backend_weight" + be1 + " 1",
		"xvs_service_stats_read_errors 0",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}

	off := New()
	if err := off.RegisterServices(read, ServiceOptions{}); err != nil {
		t.Fatal(err)
	}
	body = scrape(off)
	if strings.Contains(body, "xvs_backend_") || !strings.Contains(body, "xvs_service_connections_total"+cip+" 7\n") {
		t.Errorf("per-backend series off: want the frontends' and no backend's:\n%s", body)
	}
	readErr = errors.New("map gone")
	samples = nil
	if body := scrape(off); !strings.Contains(body, "xvs_service_stats_read_errors 1\n") {
		t.Errorf("failed read not reported:\n%s", body)
	}
}

// TestServicesSeriesBound: over --metrics-max-series the backend series go
// first, then every series, and then the datapath is not even read; the
// gauge says how many were left out, and the log has one line when the
// bound starts leaving series out and one when it stops.
func TestServicesSeriesBound(t *testing.T) {
	web := model.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: model.TCP}
	sample := FrontendSample{Name: web, Kind: "ClusterIP", Protocol: "TCP", Address: netip.MustParseAddrPort("10.96.0.20:80"),
		Counts: Counts{Conns: 7}, Backends: []BackendSample{{Address: netip.MustParseAddrPort("10.244.0.11:8080"), Counts: Counts{Conns: 7}}}}
	reads := 0
	read := func() ([]FrontendSample, error) { reads++; return []FrontendSample{sample}, nil }
	frontends, pairs := 1, 1
	var log strings.Builder
	m := New()
	if err := m.RegisterServices(read, ServiceOptions{PerBackend: true, MaxSeries: 100,
		Size: func() (int, int) { return frontends, pairs }, Log: slog.New(slog.NewTextHandler(&log, nil))}); err != nil {
		t.Fatal(err)
	}
	const svcLine = `xvs_service_connections_total{frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"} 7` + "\n"
	const beLine = `xvs_backend_connections_total{backend="10.244.0.11:8080",frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"} 7` + "\n"
	for _, c := range []struct {
		frontends, pairs int
		svc, be          bool
		dropped          string
		reads            int
	}{
		{1, 1, true, true, "0", 1},
		{10, 10, true, false, "80", 2},   // 60 + 80 > 100 >= 60
		{12, 12, true, false, "96", 3},   // still over: no second warning
		{20, 20, false, false, "280", 3}, // 120 > 100: nothing read
		{16, 1, true, false, "8", 4},     // 96 + 8 > 100 >= 96
		{2, 2, true, true, "0", 5},       // within again
	} {
		frontends, pairs = c.frontends, c.pairs
		body := scrapeBody(t, m)
		if strings.Contains(body, svcLine) != c.svc || strings.Contains(body, beLine) != c.be {
			t.Errorf("%d frontends, %d pairs: service series %v, backend series %v; want %v, %v:\n%s",
				c.frontends, c.pairs, strings.Contains(body, svcLine), strings.Contains(body, beLine), c.svc, c.be, body)
		}
		if want := "xvs_service_metrics_series_dropped " + c.dropped + "\n"; !strings.Contains(body, want) {
			t.Errorf("%d frontends, %d pairs: want %q:\n%s", c.frontends, c.pairs, want, body)
		}
		if reads != c.reads {
			t.Errorf("%d frontends, %d pairs: %d reads, want %d", c.frontends, c.pairs, reads, c.reads)
		}
	}
	if n := strings.Count(log.String(), "leaving series out"); n != 1 {
		t.Errorf("%d warnings, want 1 (at the first scrape over the bound):\n%s", n, log.String())
	}
	if n := strings.Count(log.String(), "within --metrics-max-series again"); n != 1 {
		t.Errorf("%d lines for the return under the bound, want 1:\n%s", n, log.String())
	}
}

func scrapeBody(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}
