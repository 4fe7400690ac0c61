package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// VerdictCounts are the datapath's counters of one verdict, summed over
// CPUs.
type VerdictCounts struct {
	Packets, Bytes uint64
}

// verdictCollector reads the datapath's per-verdict counters at scrape
// time: the BPF program counts, the registry only reports.
type verdictCollector struct {
	read    func() (map[string]VerdictCounts, error)
	packets *prometheus.Desc
	bytes   *prometheus.Desc
	errors  *prometheus.Desc
}

// RegisterVerdicts exports xvs_datapath_packets_total{verdict} and
// xvs_datapath_bytes_total{verdict} from read, called on every scrape (the
// eBPF datapath reads its per-CPU verdict array). A failed read is
// reported as xvs_datapath_read_errors 1 rather than failing the scrape.
func (m *Metrics) RegisterVerdicts(read func() (map[string]VerdictCounts, error)) error {
	return m.Registry.Register(&verdictCollector{
		read: read,
		packets: prometheus.NewDesc("xvs_datapath_packets_total",
			"Packets seen by the datapath program, by verdict", []string{"verdict"}, nil),
		bytes: prometheus.NewDesc("xvs_datapath_bytes_total",
			"Bytes seen by the datapath program, by verdict", []string{"verdict"}, nil),
		errors: prometheus.NewDesc("xvs_datapath_read_errors",
			"1 when the last scrape could not read the datapath counters", nil, nil),
	})
}

func (c *verdictCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.errors
}

func (c *verdictCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.read()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.GaugeValue, failed)
	for v, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(n.Packets), v)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(n.Bytes), v)
	}
}

// ConntrackTable is one conntrack table's occupancy: its live entries (as
// last counted) and its size.
type ConntrackTable struct {
	Entries, Capacity uint64
}

// RegisterConntrack exports xvs_conntrack_entries{table} and
// xvs_conntrack_capacity{table} from read, called on every scrape. The
// tables are "established" (flows that have seen a reply) and "unreplied"
// (flows that have not: when it is full they evict each other, never an
// established flow).
func (m *Metrics) RegisterConntrack(read func() map[string]ConntrackTable) error {
	entries := prometheus.NewDesc("xvs_conntrack_entries",
		"Conntrack entries (two per flow) by table, as the last reaper pass counted them", []string{"table"}, nil)
	capacity := prometheus.NewDesc("xvs_conntrack_capacity",
		"Size of each conntrack table, in entries", []string{"table"}, nil)
	return m.Registry.Register(collectorFunc{descs: []*prometheus.Desc{entries, capacity}, collect: func(ch chan<- prometheus.Metric) {
		for table, t := range read() {
			ch <- prometheus.MustNewConstMetric(entries, prometheus.GaugeValue, float64(t.Entries), table)
			ch <- prometheus.MustNewConstMetric(capacity, prometheus.GaugeValue, float64(t.Capacity), table)
		}
	}})
}

// RegisterMapOccupancy exports xvs_bpf_map_entries{map} and
// xvs_bpf_map_capacity{map} from read, called on every scrape: the BPF
// maps whose fill the agent accounts for (reconcile.Datapath.MapOccupancy: a
// ServicePort that would overflow one is refused alone).
func (m *Metrics) RegisterMapOccupancy(read func() map[string][2]uint64) error {
	entries := prometheus.NewDesc("xvs_bpf_map_entries",
		"Entries the agent has written in each BPF map it accounts for", []string{"map"}, nil)
	capacity := prometheus.NewDesc("xvs_bpf_map_capacity",
		"Size of each BPF map the agent accounts for, in entries", []string{"map"}, nil)
	return m.Registry.Register(collectorFunc{descs: []*prometheus.Desc{entries, capacity}, collect: func(ch chan<- prometheus.Metric) {
		for name, v := range read() {
			ch <- prometheus.MustNewConstMetric(entries, prometheus.GaugeValue, float64(v[0]), name)
			ch <- prometheus.MustNewConstMetric(capacity, prometheus.GaugeValue, float64(v[1]), name)
		}
	}})
}

// collectorFunc is a collector of fixed descriptions whose values come from
// a function at scrape time.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
