package agent

import (
	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	xmetrics "github.com/xvs-lb/xvs/metrics"
)

// verdictReader reads the program's per-CPU verdict counters for
// /metrics: one lookup per verdict, summed over CPUs (no map walk, so a
// scrape costs the same with 10 or 100k Services).
func verdictReader(objs *loader.Objects) func() (map[string]xmetrics.VerdictCounts, error) {
	m := maps.FromObjects(objs).Verdicts
	return func() (map[string]xmetrics.VerdictCounts, error) {
		out := make(map[string]xmetrics.VerdictCounts, int(xbpf.XvsXvsVerdictXVS_V_MAX))
		for v := xbpf.Verdict(0); v < xbpf.XvsXvsVerdictXVS_V_MAX; v++ {
			var per []xbpf.Stats
			key := uint32(v)
			if err := m.Lookup(&key, &per); err != nil {
				return out, err
			}
			var n xmetrics.VerdictCounts
			for _, s := range per {
				n.Packets += s.PacketsIn
				n.Bytes += s.BytesIn
			}
			out[maps.VerdictName(v)] = n
		}
		return out, nil
	}
}
