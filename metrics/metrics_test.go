package metrics

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestNames: every kube-proxy metric xvs exports appears under kube-proxy's
// name once it has a value, with the ip_family label where kube-proxy has
// it, and the verdict collector reports the datapath counters.
func TestNames(t *testing.T) {
	m := New()
	m.ObserveSync([]string{IPv4, IPv6}, true, 3*time.Millisecond, time.Now())
	m.ObserveSync([]string{IPv4}, false, time.Millisecond, time.Now())
	m.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(IPv4).Set(1)
	m.NetworkProgrammingLatency.WithLabelValues(IPv4).Observe(0.3)
	m.EndpointChangesTotal.Inc()
	m.ServiceChangesTotal.Inc()
	m.NoLocalEndpointsTotal.WithLabelValues("internal", IPv4).Set(0)
	m.ProxyHealthzTotal.WithLabelValues("200").Inc()
	m.ProxyLivezTotal.WithLabelValues("200").Inc()
	m.Problems.WithLabelValues("Service").Set(2)
	m.UnsupportedConfig.WithLabelValues("nftables.masqueradeAll").Set(1)
	fail := false
	if err := m.RegisterVerdicts(func() (map[string]VerdictCounts, error) {
		if fail {
			return nil, errors.New("map gone")
		}
		return map[string]VerdictCounts{"forward_new": {Packets: 7, Bytes: 700}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterConntrack(func() map[string]ConntrackTable {
		return map[string]ConntrackTable{"established": {Entries: 10, Capacity: 524288}, "unreplied": {Entries: 4, Capacity: 131072}}
	}); err != nil {
		t.Fatal(err)
	}
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	body := scrape()
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 1`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 0`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="300"} 1`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 1`,
		`kubeproxy_sync_proxy_rules_service_changes_total 1`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0`,
		`kubeproxy_proxy_healthz_total{code="200"} 1`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
		`xvs_problems{kind="Service"} 2`,
		`xvs_config_unsupported_fields{field="nftables.masqueradeAll"} 1`,
		`xvs_datapath_packets_total{verdict="forward_new"} 7`,
		`xvs_datapath_bytes_total{verdict="forward_new"} 700`,
		`xvs_datapath_read_errors 0`,
		`xvs_conntrack_entries{table="established"} 10`,
		`xvs_conntrack_capacity{table="unreplied"} 131072`,
		`process_start_time_seconds`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
	fail = true
	if body := scrape(); !strings.Contains(body, "xvs_datapath_read_errors 1") {
		t.Errorf("failed read not reported:\n%s", body)
	}
}
