package metrics

import (
	"log/slog"
	"net/netip"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xvs-lb/xvs/model"
)

// Counts are a frontend's or a backend's traffic counters, in IPVS's terms:
// connections scheduled, packets and bytes towards the backends (in) and
// back to the clients (out).
type Counts struct {
	Conns, PacketsIn, PacketsOut, BytesIn, BytesOut uint64
}

// FrontendSample is one programmed frontend (an IPVS virtual server) with
// its counters and backends, and the ServicePort that owns it (a zero Name
// when the datapath serves a frontend the last synced state does not name:
// left over from a sync that failed, or being removed).
type FrontendSample struct {
	Name     model.ServicePortName
	Kind     string // ClusterIP, NodePort, ExternalIP, LoadBalancer
	Protocol string // TCP, UDP, SCTP
	Address  netip.AddrPort
	Counts   Counts
	Backends []BackendSample
}

// BackendSample is one backend of a frontend (an IPVS real server).
type BackendSample struct {
	Address netip.AddrPort
	Weight  uint16
	// Active and Inactive count the live connections as IPVS does:
	// established TCP connections are active, every other flow inactive.
	Active, Inactive int
	Counts           Counts
}

// serviceLabels name a frontend: its Service, port and protocol, the
// frontend's address and kind. The number of series is the number of
// programmed frontends (every ClusterIP, NodePort address, external and
// load-balancer IP of every Service port).
var serviceLabels = []string{"namespace", "service", "port", "protocol", "frontend", "kind"}

// backendLabels add the backend's address:port: one series per frontend
// and backend, which --metrics-per-backend=false turns off.
var backendLabels = append(append([]string{}, serviceLabels...), "backend")

// serviceCollector reads the datapath's per-frontend counters at scrape
// time, in the shape of node_exporter's IPVS collector (node_ipvs_*), so
// that IPVS dashboards carry over with a name change, and with the Service
// beside each frontend, which node_exporter cannot know.
type serviceCollector struct {
	read func() ([]FrontendSample, error)
	opts ServiceOptions
	// limited is the series the last scrape left out, for the log's
	// transitions (scrapes may run concurrently).
	limited atomic.Int64

	readErrors, dropped                        *prometheus.Desc
	conns, pktsIn, pktsOut, bytesIn, bytesOut  *prometheus.Desc
	bConns, bPktsIn, bPktsOut, bBytesIn, bOut  *prometheus.Desc
	bActive, bInactive, bWeight, endpointCount *prometheus.Desc
}

// ServiceOptions shape the per-Service metrics.
type ServiceOptions struct {
	// PerBackend adds the per-backend series (--metrics-per-backend).
	PerBackend bool
	// MaxSeries bounds the per-Service series of one scrape
	// (--metrics-max-series; 0: no bound). Over it, the backend series
	// are left out; if the service series alone are still over it, all
	// are, and the datapath is not read at all. The gauge
	// xvs_service_metrics_series_dropped says how many were left out.
	MaxSeries int
	// Size is what the next read would return, as cheaply known (from the
	// synced state, not the maps): frontends, and frontend-backend pairs.
	// Nil: no bound.
	Size func() (frontends, pairs int)
	// Log gets a line when the bound starts and stops leaving series out.
	Log *slog.Logger
}

// Series per frontend (the xvs_service_* counters and xvs_service_backends)
// and per frontend and backend (the xvs_backend_* series).
const (
	seriesPerFrontend = 6
	seriesPerBackend  = 8
)

// RegisterServices exports the per-frontend counters read returns, on
// every scrape:
//
//	xvs_service_connections_total, xvs_service_{incoming,outgoing}_{packets,bytes}_total
//	xvs_service_backends (the backends the frontend is programmed with)
//
// and, with perBackend, the same per backend plus its live connections and
// weight:
//
//	xvs_backend_connections_total, xvs_backend_{incoming,outgoing}_{packets,bytes}_total
//	xvs_backend_connections_active, xvs_backend_connections_inactive, xvs_backend_weight
//
// A failed read is reported as xvs_service_stats_read_errors 1, not as a
// failed scrape.
func (m *Metrics) RegisterServices(read func() ([]FrontendSample, error), opts ServiceOptions) error {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	svc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, serviceLabels, nil)
	}
	be := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, backendLabels, nil)
	}
	return m.Registry.Register(&serviceCollector{
		read: read,
		opts: opts,
		readErrors: prometheus.NewDesc("xvs_service_stats_read_errors",
			"1 when the last scrape could not read the per-Service counters", nil, nil),
		dropped: prometheus.NewDesc("xvs_service_metrics_series_dropped",
			"Per-Service and per-backend series the last scrape left out because they would pass --metrics-max-series (estimated from the synced state; 0: none)", nil, nil),
		conns:         svc("xvs_service_connections_total", "Connections (flows) scheduled through the frontend"),
		pktsIn:        svc("xvs_service_incoming_packets_total", "Packets from clients through the frontend to its backends"),
		pktsOut:       svc("xvs_service_outgoing_packets_total", "Packets from the frontend's backends back to clients"),
		bytesIn:       svc("xvs_service_incoming_bytes_total", "Bytes from clients through the frontend to its backends"),
		bytesOut:      svc("xvs_service_outgoing_bytes_total", "Bytes from the frontend's backends back to clients"),
		endpointCount: svc("xvs_service_backends", "Backends the frontend is programmed with (0: connections are rejected or dropped)"),
		bConns:        be("xvs_backend_connections_total", "Connections (flows) scheduled to the backend through the frontend"),
		bPktsIn:       be("xvs_backend_incoming_packets_total", "Packets from clients to the backend through the frontend"),
		bPktsOut:      be("xvs_backend_outgoing_packets_total", "Packets from the backend back to clients through the frontend"),
		bBytesIn:      be("xvs_backend_incoming_bytes_total", "Bytes from clients to the backend through the frontend"),
		bOut:          be("xvs_backend_outgoing_bytes_total", "Bytes from the backend back to clients through the frontend"),
		bActive:       be("xvs_backend_connections_active", "Live established TCP connections to the backend through the frontend"),
		bInactive:     be("xvs_backend_connections_inactive", "Live connections to the backend through the frontend that are not established TCP (UDP, opening, closing)"),
		bWeight:       be("xvs_backend_weight", "The backend's scheduler weight"),
	})
}

func (c *serviceCollector) descs() []*prometheus.Desc {
	d := []*prometheus.Desc{c.readErrors, c.dropped, c.conns, c.pktsIn, c.pktsOut, c.bytesIn, c.bytesOut, c.endpointCount}
	if c.opts.PerBackend {
		d = append(d, c.bConns, c.bPktsIn, c.bPktsOut, c.bBytesIn, c.bOut, c.bActive, c.bInactive, c.bWeight)
	}
	return d
}

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

// bound decides what this scrape exports: the service series, the backend
// series, and how many series are left out.
func (c *serviceCollector) bound() (services, backends bool, dropped int) {
	services, backends = true, c.opts.PerBackend
	if c.opts.MaxSeries <= 0 || c.opts.Size == nil {
		return services, backends, 0
	}
	frontends, pairs := c.opts.Size()
	svc, be := seriesPerFrontend*frontends, 0
	if backends {
		be = seriesPerBackend * pairs
	}
	switch {
	case svc+be <= c.opts.MaxSeries:
	case svc <= c.opts.MaxSeries:
		backends, dropped = false, be
	default:
		services, backends, dropped = false, false, svc+be
	}
	if prev := c.limited.Swap(int64(dropped)); (prev == 0) != (dropped == 0) {
		if dropped > 0 {
			c.opts.Log.Warn("per-Service metrics over --metrics-max-series: leaving series out",
				"frontends", frontends, "frontendBackendPairs", pairs, "maxSeries", c.opts.MaxSeries,
				"serviceSeries", services, "backendSeries", backends, "dropped", dropped)
		} else {
			c.opts.Log.Info("per-Service metrics within --metrics-max-series again", "frontends", frontends, "frontendBackendPairs", pairs)
		}
	}
	return services, backends, dropped
}

func (c *serviceCollector) Collect(ch chan<- prometheus.Metric) {
	services, perBackend, dropped := c.bound()
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.GaugeValue, float64(dropped))
	if !services {
		// Not even read: at this size the read alone costs more than a
		// scrape should.
		ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.GaugeValue, 0)
		return
	}
	frontends, err := c.read()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.GaugeValue, failed)
	counter := func(d *prometheus.Desc, v uint64, labels []string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels []string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	// Two frontends never share a label set (the frontend label is
	// unique per protocol), and a backend appears once per frontend.
	for _, f := range frontends {
		l := []string{f.Name.Namespace, f.Name.Name, f.Name.Port, f.Protocol, f.Address.String(), f.Kind}
		counter(c.conns, f.Counts.Conns, l)
		counter(c.pktsIn, f.Counts.PacketsIn, l)
		counter(c.pktsOut, f.Counts.PacketsOut, l)
		counter(c.bytesIn, f.Counts.BytesIn, l)
		counter(c.bytesOut, f.Counts.BytesOut, l)
		gauge(c.endpointCount, float64(len(f.Backends)), l)
		if !perBackend {
			continue
		}
		for _, b := range f.Backends {
			bl := append(l[:len(l):len(l)], b.Address.String())
			counter(c.bConns, b.Counts.Conns, bl)
			counter(c.bPktsIn, b.Counts.PacketsIn, bl)
			counter(c.bPktsOut, b.Counts.PacketsOut, bl)
			counter(c.bBytesIn, b.Counts.BytesIn, bl)
			counter(c.bOut, b.Counts.BytesOut, bl)
			gauge(c.bActive, float64(b.Active), bl)
			gauge(c.bInactive, float64(b.Inactive), bl)
			gauge(c.bWeight, float64(b.Weight), bl)
		}
	}
}
