package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The peer report's bulk section: throughput and CPU per GB of each case's
// bulk runs, at the smallest size, against the floor's in the same round.

// goalBulkFloor: bulk throughput through a VIP against the floor.
const goalBulkFloor = 0.95

// bulkKey is one bulk run shape: a direction and a number of streams.
type bulkKey struct {
	dir     bulkDir
	streams int
}

func (k bulkKey) String() string { return fmt.Sprintf("%s ×%d", k.dir, k.streams) }

func (o PeersOptions) bulkKeys() []bulkKey {
	var ks []bulkKey
	for _, d := range []bulkDir{bulkDown, bulkUp} {
		for _, s := range o.BulkStreams {
			ks = append(ks, bulkKey{d, s})
		}
	}
	return ks
}

// bulkFigure reads one figure of run k off a round; 0 when it was not run.
func bulkFigure(k bulkKey, f func(peerBulk) float64) func(peerRun) float64 {
	return func(r peerRun) float64 {
		if b, ok := r.bulk(k.dir, k.streams); ok {
			return f(b)
		}
		return 0
	}
}

func bulkGbps(b peerBulk) float64  { return b.Gbps() }
func bulkCPUGB(b peerBulk) float64 { return float64(b.CPUPerGB()) }

// bulkResultAt is the result of the size the bulk runs were made at.
func bulkResultAt(o PeersOptions, rs []peerResult) (peerResult, bool) {
	for _, r := range rs {
		if o.bulkAt(r.N) {
			return r, true
		}
	}
	return peerResult{}, false
}

// writeBulkGoals adds the summary's bulk lines: each xvs case's
// throughput over the floor's, for every run shape.
func writeBulkGoals(b *bytes.Buffer, o PeersOptions, rs []peerResult) {
	r, ok := bulkResultAt(o, rs)
	if !ok {
		return
	}
	floor := r.Cells[peerCase{Proxy: ppFloor}]
	for _, x := range xvsProxies {
		if !slices.Contains(o.Proxies, x) {
			continue
		}
		for _, masq := range o.masqs() {
			c := peerCase{x, masq}
			var parts []string
			met, any := true, false
			for _, k := range o.bulkKeys() {
				v := peerRatio(r.Cells[c], floor, bulkFigure(k, bulkGbps), false)
				if v == 0 {
					parts, met = append(parts, k.String()+": –"), false
					continue
				}
				any = true
				parts = append(parts, fmt.Sprintf("%s: %.2fx", k, v))
				met = met && v >= goalBulkFloor
			}
			verdict := yesNo(met && any)
			if !any {
				verdict = "not measured"
			}
			fmt.Fprintf(b, "| bulk Gbit/s through a %s (%s) >= %.2fx the floor, N = %d | %s | %s | `make bench-peers` |\n",
				bulkTargetText(c), c, goalBulkFloor, r.N, strings.Join(parts, ", "), verdict)
		}
	}
}

// writeBulkResults writes the bulk tables: one row per case, one column
// per run shape.
func writeBulkResults(b *bytes.Buffer, o PeersOptions, rs []peerResult, plots map[string]string) {
	r, ok := bulkResultAt(o, rs)
	if !ok {
		return
	}
	keys := o.bulkKeys()
	fmt.Fprintf(b, "### Bulk TCP throughput at N = %d\n\n", r.N)
	if p := plots["bulk"]; p != "" {
		fmt.Fprintf(b, "![bulk throughput per case](%s)\n\n", p)
	}
	fmt.Fprintf(b, "Median Gbit/s of TCP payload over the rounds, and in brackets the median of same-round ratios to the floor. The floor's streams go to the pods themselves, the unmasqueraded cases' to Service 0's ClusterIP, the masqueraded cases' to its NodePort on the node's address (eTP=Cluster, so masqueraded by every proxy).\n\n")
	floor := r.Cells[peerCase{Proxy: ppFloor}]
	bulkTable(b, o, r, keys, func(c *peerCell, k bulkKey) string {
		v := peerMedian(c, bulkFigure(k, bulkGbps))
		if v == 0 {
			return "–"
		}
		if c == floor {
			return fmt.Sprintf("%.2f", v)
		}
		return fmt.Sprintf("%.2f (%s)", v, fmtRatio(peerRatio(c, floor, bulkFigure(k, bulkGbps), false)))
	})
	fmt.Fprintf(b, "CPU per GB moved (ms): the median over the rounds of (benchmark process + proxy process + ksoftirqd CPU time) over the window, per 10^9 bytes of payload; on this machine the veths' forwarding is charged to the benchmark process, so this is the whole path's cost.\n\n")
	bulkTable(b, o, r, keys, func(c *peerCell, k bulkKey) string {
		v := peerMedian(c, bulkFigure(k, bulkCPUGB))
		if v == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", v/float64(time.Millisecond))
	})
}

func bulkTable(b *bytes.Buffer, o PeersOptions, r peerResult, keys []bulkKey, cell func(*peerCell, bulkKey) string) {
	fmt.Fprintf(b, "| Case | through |")
	for _, k := range keys {
		fmt.Fprintf(b, " %s |", k)
	}
	fmt.Fprintf(b, "\n|---|---|%s\n", strings.Repeat("---:|", len(keys)))
	for _, c := range o.cases() {
		fmt.Fprintf(b, "| %s | %s |", c, bulkTargetText(c))
		for _, k := range keys {
			fmt.Fprintf(b, " %s |", cell(r.Cells[c], k))
		}
		fmt.Fprintln(b)
	}
	fmt.Fprintln(b)
}

// bulkPlot draws each case's median Gbit/s, grouped by run shape.
func bulkPlot(path string, o PeersOptions, r peerResult) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Bulk TCP throughput, real proxies, N = %d (median of rounds)", r.N)
	p.Y.Label.Text = "Gbit/s"
	keys, cases := o.bulkKeys(), o.cases()
	w := vg.Points(60 / float64(len(cases)))
	for i, c := range cases {
		vals := make(plotter.Values, len(keys))
		for j, k := range keys {
			vals[j] = peerMedian(r.Cells[c], bulkFigure(k, bulkGbps))
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Offset = (vg.Length(i) - vg.Length(len(cases)-1)/2) * w
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(c.String()+" ("+bulkTargetText(c)+")", bars)
	}
	names := make([]string, len(keys))
	for j, k := range keys {
		names[j] = k.String()
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(names...)
	p.Y.Min = 0
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
