package metrics

import (
	"errors"
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
	scrape := func(m *Metrics) string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	const cip = `{frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"}`
	const np = `{frontend="192.168.50.2:30080",kind="NodePort",namespace="demo",port="http",protocol="TCP",service="web"}`
	const be1 = `{backend="10.244.0.11:8080",frontend="10.96.0.20:80",kind="ClusterIP",namespace="demo",port="http",protocol="TCP",service="web"}`
	m := New()
	if err := m.RegisterServices(read, true); err != nil {
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
	if err := off.RegisterServices(read, false); err != nil {
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
