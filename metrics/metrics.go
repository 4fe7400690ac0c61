// Package metrics holds the agent's Prometheus metrics: kube-proxy's, under
// kube-proxy's names and buckets so that dashboards, alerts and
// clusterloader2's NetworkProgrammingLatency measurement work unchanged,
// and xvs's own under the xvs_ prefix.
//
// Every metric of the agent's own lives in a Metrics value with its own
// registry, so tests and several agents in one process do not collide.
// /metrics serves it beside component-base's process-wide registry, as
// kube-proxy serves that one: the Go and process collectors, client-go's
// rest_client_* metrics, kubernetes_build_info, kubernetes_feature_enabled
// and the registry's own meta metrics.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/restclient" // rest_client_*: client-go's requests to the API server
	_ "k8s.io/component-base/metrics/prometheus/version"    // kubernetes_build_info

	"github.com/xvs-lb/xvs/model"
)

const kubeProxySubsystem = "kubeproxy"

// IP family label values, as kube-proxy spells them (v1.IPFamily).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Metrics are the agent's metrics.
type Metrics struct {
	Registry *prometheus.Registry
	// Gatherer is what /metrics serves: component-base's registry, then
	// Registry.
	Gatherer prometheus.Gatherer

	// kube-proxy's (docs/semantics.md §3.21).
	SyncProxyRulesLatency             *prometheus.HistogramVec
	SyncFullProxyRulesLatency         *prometheus.HistogramVec
	SyncPartialProxyRulesLatency      *prometheus.HistogramVec
	SyncProxyRulesLastTimestamp       *prometheus.GaugeVec
	SyncProxyRulesLastQueuedTimestamp *prometheus.GaugeVec
	NetworkProgrammingLatency         *prometheus.HistogramVec
	EndpointChangesPending            prometheus.Gauge
	EndpointChangesTotal              prometheus.Counter
	ServiceChangesPending             prometheus.Gauge
	ServiceChangesTotal               prometheus.Counter
	NoLocalEndpointsTotal             *prometheus.GaugeVec
	ProxyHealthzTotal                 *prometheus.CounterVec
	ProxyLivezTotal                   *prometheus.CounterVec
	ConntrackDeletedTotal             *prometheus.CounterVec
	ConntrackReconcileLatency         *prometheus.HistogramVec
	RulesRestoreFailuresTotal         *prometheus.CounterVec

	// xvs's own.
	SyncFailuresTotal *prometheus.CounterVec
	Problems          *prometheus.GaugeVec
	UnsupportedConfig *prometheus.GaugeVec
	ServicePorts      prometheus.Gauge
	EventsDropped     prometheus.Counter
	FirstSyncHeld     prometheus.Counter
	AdoptedFlows      *prometheus.CounterVec
	DatapathMode      *prometheus.GaugeVec
	DatapathFallbacks *prometheus.CounterVec
	// AttachFailures counts devices the programs could not be put on.
	AttachFailures prometheus.Counter
}

// syncBuckets are kube-proxy's: 1 ms doubling, 15 buckets (to ~16 s).
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's network programming buckets: 0.25 s,
// 0.5 s, 1..59 s, 60..115 s by 5, 120..300 s by 30.
func programmingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)
	return b
}

// New returns the metrics registered on a fresh registry. Long by design:
// one declaration per metric, kube-proxy's in its order, then xvs's.
func New() *Metrics {
	kp := func(name string) prometheus.Opts {
		return prometheus.Opts{Subsystem: kubeProxySubsystem, Name: name}
	}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		o := kp(name)
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: o.Subsystem, Name: o.Name,
			Help: help + " [ALPHA]", Buckets: buckets}, labels)
	}
	gaugeVec := func(name, help string, labels ...string) *prometheus.GaugeVec {
		o := kp(name)
		o.Help = help + " [ALPHA]"
		return prometheus.NewGaugeVec(prometheus.GaugeOpts(o), labels)
	}
	gauge := func(name, help string) prometheus.Gauge {
		o := kp(name)
		o.Help = help + " [ALPHA]"
		return prometheus.NewGauge(prometheus.GaugeOpts(o))
	}
	counter := func(name, help string) prometheus.Counter {
		o := kp(name)
		o.Help = help + " [ALPHA]"
		return prometheus.NewCounter(prometheus.CounterOpts(o))
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		o := kp(name)
		o.Help = help + " [ALPHA]"
		return prometheus.NewCounterVec(prometheus.CounterOpts(o), labels)
	}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncProxyRulesLatency: hist("sync_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds", syncBuckets, "ip_family"),
		SyncFullProxyRulesLatency: hist("sync_full_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for full resyncs", syncBuckets, "ip_family"),
		SyncPartialProxyRulesLatency: hist("sync_partial_proxy_rules_duration_seconds",
			"SyncProxyRules latency in seconds for partial resyncs", syncBuckets, "ip_family"),
		SyncProxyRulesLastTimestamp: gaugeVec("sync_proxy_rules_last_timestamp_seconds",
			"The last time proxy rules were successfully synced", "ip_family"),
		SyncProxyRulesLastQueuedTimestamp: gaugeVec("sync_proxy_rules_last_queued_timestamp_seconds",
			"The last time a sync of proxy rules was queued", "ip_family"),
		NetworkProgrammingLatency: hist("network_programming_duration_seconds",
			"In Cluster Network Programming Latency in seconds", programmingBuckets(), "ip_family"),
		EndpointChangesPending: gauge("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"),
		EndpointChangesTotal:   counter("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"),
		ServiceChangesPending:  gauge("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"),
		ServiceChangesTotal:    counter("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"),
		NoLocalEndpointsTotal: gaugeVec("sync_proxy_rules_no_local_endpoints_total",
			"Number of services with a Local traffic policy and no endpoints", "traffic_policy", "ip_family"),
		ProxyHealthzTotal: counterVec("proxy_healthz_total", "Cumulative proxy healthz HTTP status", "code"),
		ProxyLivezTotal:   counterVec("proxy_livez_total", "Cumulative proxy livez HTTP status", "code"),
		ConntrackDeletedTotal: counterVec("conntrack_reconciler_deleted_entries_total",
			"Cumulative conntrack flows deleted by conntrack reconciler", "ip_family"),
		ConntrackReconcileLatency: hist("conntrack_reconciler_sync_duration_seconds",
			"ReconcileConntrackFlowsLatency latency in seconds", syncBuckets, "ip_family"),
		// kube-proxy's IPVS mode counts its iptables-restore failures; xvs
		// counts failed writes of its own netfilter table (the ipvs mode's
		// nftables masquerade and filter rules).
		RulesRestoreFailuresTotal: counterVec("sync_proxy_rules_iptables_restore_failures_total",
			"Cumulative proxy iptables restore failures", "ip_family"),

		SyncFailuresTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xvs_sync_failures_total",
			Help: "Datapath syncs that failed (each is followed by a full resync)"}, []string{"mode"}),
		Problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "xvs_problems",
			Help: "Current bad inputs (Services, EndpointSlices, Node, configuration) skipped or partly used, by object kind"},
			[]string{"kind"}),
		UnsupportedConfig: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "xvs_config_unsupported_fields",
			Help: "KubeProxyConfiguration fields set to a non-default value that xvs does not honour (1 per field)"},
			[]string{"field"}),
		ServicePorts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "xvs_service_ports",
			Help: "Service ports in the last synced state"}),
		EventsDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "xvs_events_dropped_total",
			Help: "Kubernetes Events not recorded because their object had used up its share (a burst of 5, then one a minute)"}),
		FirstSyncHeld: prometheus.NewCounter(prometheus.CounterOpts{Name: "xvs_first_sync_held_total",
			Help: "First syncs not applied because they would have removed most of what a restarted agent found programmed, and a second list of the API server did not confirm it"}),
		AdoptedFlows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xvs_adopted_connections_total",
			Help: "Connections another proxy (kube-proxy) translated that the agent found in netfilter's conntrack at start, by result: adopted (carried on through xvs) or why not"}, []string{"result"}),
		DatapathMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "xvs_datapath_mode",
			Help: "1 for the datapath mode in use (ebpf or ipvs), 0 for the other"}, []string{"mode"}),
		DatapathFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xvs_datapath_fallbacks_total",
			Help: "Times the agent fell back from the BPF datapath, by target mode and reason"}, []string{"to", "reason"}),
		AttachFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "xvs_device_attach_failures_total",
			Help: "Failures to put the programs on a selected device (a pod veth, a NIC) or to watch the node's devices; a device left without the programs does not translate its Service traffic"}),
	}
	m.Gatherer = prometheus.Gatherers{legacyregistry.DefaultGatherer, m.Registry}
	m.Registry.MustRegister(
		m.SyncProxyRulesLatency, m.SyncFullProxyRulesLatency, m.SyncPartialProxyRulesLatency,
		m.SyncProxyRulesLastTimestamp, m.SyncProxyRulesLastQueuedTimestamp, m.NetworkProgrammingLatency,
		m.EndpointChangesPending, m.EndpointChangesTotal, m.ServiceChangesPending, m.ServiceChangesTotal,
		m.NoLocalEndpointsTotal, m.ProxyHealthzTotal, m.ProxyLivezTotal, m.ConntrackDeletedTotal,
		m.ConntrackReconcileLatency, m.RulesRestoreFailuresTotal,
		m.SyncFailuresTotal, m.Problems, m.UnsupportedConfig, m.ServicePorts, m.EventsDropped, m.FirstSyncHeld,
		m.AdoptedFlows, m.DatapathMode, m.DatapathFallbacks, m.AttachFailures,
	)
	return m
}

// SetDatapathMode sets xvs_datapath_mode: 1 for mode, 0 for the others.
func (m *Metrics) SetDatapathMode(mode model.Mode) {
	for _, o := range model.Modes {
		v := 0.0
		if o == mode {
			v = 1
		}
		m.DatapathMode.WithLabelValues(string(o)).Set(v)
	}
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Gatherer, promhttp.HandlerOpts{Registry: m.Registry})
}

// ObserveSync records one successful sync of the given families.
func (m *Metrics) ObserveSync(families []string, full bool, took time.Duration, at time.Time) {
	for _, f := range families {
		m.SyncProxyRulesLatency.WithLabelValues(f).Observe(took.Seconds())
		if full {
			m.SyncFullProxyRulesLatency.WithLabelValues(f).Observe(took.Seconds())
		} else {
			m.SyncPartialProxyRulesLatency.WithLabelValues(f).Observe(took.Seconds())
		}
		m.SyncProxyRulesLastTimestamp.WithLabelValues(f).Set(float64(at.UnixNano()) / 1e9)
	}
}
