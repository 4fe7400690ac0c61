package monitoring

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	xmetrics "github.com/xvs-lb/xvs/metrics"
	xmodel "github.com/xvs-lb/xvs/model"
)

// exported is what an agent's /metrics serves once every metric has a
// value: xvs's registry with each collector the agent registers, and
// component-base's (process, Go, client-go's rest_client_* after one
// request to an API server).
func exported(t *testing.T) map[string]model.MetricType {
	t.Helper()
	m := xmetrics.New()
	m.ObserveSync([]string{xmetrics.IPv4}, true, time.Millisecond, time.Now())
	m.ObserveSync([]string{xmetrics.IPv4}, false, time.Millisecond, time.Now())
	m.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(xmetrics.IPv4).Set(1)
	m.NetworkProgrammingLatency.WithLabelValues(xmetrics.IPv4).Observe(0.1)
	m.NoLocalEndpointsTotal.WithLabelValues("internal", xmetrics.IPv4).Set(0)
	m.ProxyHealthzTotal.WithLabelValues("200").Inc()
	m.ProxyLivezTotal.WithLabelValues("200").Inc()
	m.ConntrackDeletedTotal.WithLabelValues(xmetrics.IPv4).Add(0)
	m.ConntrackReconcileLatency.WithLabelValues(xmetrics.IPv4).Observe(0.001)
	m.RulesRestoreFailuresTotal.WithLabelValues(xmetrics.IPv4).Add(0)
	m.SyncFailuresTotal.WithLabelValues(string(xmodel.ModeEBPF)).Add(0)
	m.Problems.WithLabelValues("Service").Set(0)
	m.UnsupportedConfig.WithLabelValues("x").Set(0)
	m.DatapathFallbacks.WithLabelValues("ipvs", "BPFLoadFailed").Add(0)
	m.SetDatapathMode(xmodel.ModeEBPF)
	if err := m.RegisterVerdicts(func() (map[string]xmetrics.VerdictCounts, error) {
		return map[string]xmetrics.VerdictCounts{"forward_new": {}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterConntrack(func() map[string]xmetrics.ConntrackTable {
		return map[string]xmetrics.ConntrackTable{"established": {}}
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterMapOccupancy(func() map[string][2]uint64 {
		return map[string][2]uint64{"services": {8, 1 << 21}}
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterServices(func() ([]xmetrics.FrontendSample, error) {
		return []xmetrics.FrontendSample{{Protocol: "TCP", Address: netip.MustParseAddrPort("10.96.0.1:443"),
			Backends: []xmetrics.BackendSample{{Address: netip.MustParseAddrPort("192.168.0.1:6443")}}}}, nil
	}, xmetrics.ServiceOptions{PerBackend: true}); err != nil {
		t.Fatal(err)
	}
	// One request through client-go, as the agent's informers make.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer api.Close()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	r := NewRecorder(nil, "xvs", "node")
	if err := r.families(rec.Body.Bytes()); err != nil {
		t.Fatal(err)
	}
	return r.Families
}

// TestDashboardAndAlerts: the dashboard is valid JSON whose every query
// parses as PromQL, the PrometheusRule loads as Prometheus loads rules,
// and every metric either selects is one the agent exports (or up, which
// Prometheus adds per target).
func TestDashboardAndAlerts(t *testing.T) {
	families := exported(t)
	families["up"] = model.MetricTypeGauge
	panels, err := LoadDashboard(DashboardPath, RateInterval)
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := LoadAlerts(RulesPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(panels) < 10 || len(alerts) < 8 {
		t.Fatalf("%d panels, %d alerts", len(panels), len(alerts))
	}
	check := func(where, expr string) {
		names, err := MetricNames(expr)
		if err != nil {
			t.Errorf("%s: %q: %v", where, expr, err)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", where, expr)
		}
		for _, n := range names {
			if !Known(families, n) {
				t.Errorf("%s: %q selects %s, which the agent does not export", where, expr, n)
			}
		}
	}
	for _, p := range panels {
		if len(p.Queries) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Queries {
			check("panel "+p.Title, q.Expr)
		}
	}
	var names []string
	for _, a := range alerts {
		check("alert "+a.Name, a.Expr)
		if a.Labels["severity"] == "" || a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
			t.Errorf("alert %s: want a severity, a summary and a description", a.Name)
		}
		names = append(names, a.Name)
	}
	if _, err := NewRules(alerts); err != nil {
		t.Fatal(err)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
		t.Errorf("alert names repeat: %v", names)
	}
	// The check itself: an unknown name is caught.
	if Known(families, "xvs_no_such_metric") || !Known(families, "kubeproxy_network_programming_duration_seconds_bucket") {
		t.Error("Known: wrong answer for a made-up name or a histogram's buckets")
	}
}
