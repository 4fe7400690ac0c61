package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
)

// The conntrack resize (bin/bench resize): a loaded datapath whose
// established table holds N flows' entries is loaded again with twice the
// table size, as an agent restarted with a new --bpf-conntrack-size does
// (the first objects stay open, as the running programs do). Measured:
// the copy of the old entries (loader.Resize.Took) and the whole Load
// (program verification included), and that every entry arrived.

type resizeResult struct {
	// table is the map resized: the established conntrack table, or the
	// services map (regrow).
	table      string
	entries    int
	from, to   uint32
	copyMedian time.Duration
	loadMedian time.Duration
	copies     []time.Duration
}

func resizeMain(args []string) int {
	fs := flag.NewFlagSet("resize", flag.ContinueOnError)
	out := fs.String("out", "docs/BENCHMARKS-resize.md", "report to write")
	sizesFlag := fs.String("entries", "131072,262144,524288,1048576", "entries in the established table before the resize")
	rounds := fs.Int("rounds", 3, "resizes per size")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var sizes []int
	for _, f := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "bench resize: -entries: %q\n", f)
			return 2
		}
		sizes = append(sizes, n)
	}
	var rs []resizeResult
	for _, table := range []string{xbpf.XvsMapXvsConntrack, xbpf.XvsMapXvsServices} {
		for _, n := range sizes {
			r, err := measureResize(table, n, *rounds)
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench resize:", err)
				return 1
			}
			fmt.Fprintf(os.Stderr, "bench resize: %s, %d entries: copy %v, load %v\n", table, n, r.copyMedian, r.loadMedian)
			rs = append(rs, r)
		}
	}
	png := strings.TrimSuffix(*out, ".md") + ".png"
	if err := resizePlot(png, rs); err != nil {
		fmt.Fprintln(os.Stderr, "bench resize:", err)
		return 1
	}
	report := resizeReport(rs, *rounds, filepath.Base(png), "bin/bench resize "+strings.Join(args, " "))
	if err := os.WriteFile(*out, report, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench resize:", err)
		return 1
	}
	os.Stdout.Write(report)
	fmt.Fprintln(os.Stderr, "bench resize: wrote", *out)
	return 0
}

// measureResize resizes a table of n entries to twice its size, rounds
// times, each in its own pin path.
func measureResize(table string, n, rounds int) (resizeResult, error) {
	r := resizeResult{table: table, entries: n}
	var loads []time.Duration
	for round := range rounds {
		copyTook, loadTook, from, to, err := resizeOnce(table, n, round)
		if err != nil {
			return r, err
		}
		r.from, r.to = from, to
		r.copies = append(r.copies, copyTook)
		loads = append(loads, loadTook)
	}
	r.copyMedian, r.loadMedian = medianDuration(r.copies), medianDuration(loads)
	return r, nil
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// resized is one map's part of a resize run: how to size it, fill it,
// and read the loader's report of its copy.
type resized struct {
	pin  string // pin directory prefix
	size func(*loader.Config, uint32)
	fill func(*loader.Objects, int) error
	// report is the copy's time and sizes and the entries copied.
	report func(*loader.Objects) (took time.Duration, from, to uint32, copied int, ok bool)
	count  func(*loader.Objects) (int, error)
}

var resizedMaps = map[string]resized{
	// Half full before, a quarter after: an LRU table evicts before it is
	// completely full.
	xbpf.XvsMapXvsConntrack: {
		pin:  "xvs-bench-resize",
		size: func(c *loader.Config, n uint32) { c.ConntrackSize = n },
		fill: func(o *loader.Objects, n int) error { return fillFlows(o.XvsConntrack, n) },
		report: func(o *loader.Objects) (time.Duration, uint32, uint32, int, bool) {
			for _, x := range o.Resized() {
				if x.Table == xbpf.XvsMapXvsConntrack {
					return x.Took, x.From, x.To, x.Copied + x.Kept, true
				}
			}
			return 0, 0, 0, 0, false
		},
		count: func(o *loader.Objects) (int, error) { return countEntries(o.XvsConntrack) },
	},
	// The services map (--bpf-max-service-slots): its entries are copied
	// before the new programs are attached (loader/regrow.go), and the
	// agent starts that much later.
	xbpf.XvsMapXvsServices: {
		pin:  "xvs-bench-regrow",
		size: func(c *loader.Config, n uint32) { c.MaxServiceSlots = n },
		fill: func(o *loader.Objects, n int) error { return fillSlots(o.XvsServices, n) },
		report: func(o *loader.Objects) (time.Duration, uint32, uint32, int, bool) {
			// The old map goes when the programs are attached; none are.
			if err := o.FinishResize(); err != nil {
				return 0, 0, 0, 0, false
			}
			for _, x := range o.MapsResized() {
				if x.Map == xbpf.XvsMapXvsServices {
					return x.Took, x.From, x.To, x.Copied, true
				}
			}
			return 0, 0, 0, 0, false
		},
		count: func(o *loader.Objects) (int, error) {
			got := 0
			var k xbpf.SvcKey
			var v xbpf.SvcValue
			it := o.XvsServices.Iterate()
			for it.Next(&k, &v) {
				got++
			}
			return got, it.Err()
		},
	},
}

// resizeOnce loads a datapath with table sized 2n, fills it with n
// entries, and loads it again with 4n, the first objects staying open as
// the running programs do.
func resizeOnce(table string, n, round int) (copyTook, loadTook time.Duration, from, to uint32, err error) {
	rm := resizedMaps[table]
	if err := loader.EnsureBPFFS(pinRoot); err != nil {
		return 0, 0, 0, 0, err
	}
	cfg := loader.DefaultConfig()
	cfg.PinPath = filepath.Join(pinRoot, fmt.Sprintf("%s-%d-%d-%d", rm.pin, os.Getpid(), n, round))
	_ = os.RemoveAll(cfg.PinPath)
	defer func() {
		if rerr := os.RemoveAll(cfg.PinPath); rerr != nil && err == nil {
			err = rerr
		}
	}()
	rm.size(&cfg, uint32(2*n))
	first, err := loader.Load(cfg)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer first.Close()
	if err := rm.fill(first, n); err != nil {
		return 0, 0, 0, 0, err
	}
	rm.size(&cfg, uint32(4*n))
	start := time.Now()
	objs, err := loader.Load(cfg)
	loadTook = time.Since(start)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer objs.Close()
	copyTook, from, to, copied, ok := rm.report(objs)
	if !ok || copied != n {
		return 0, 0, 0, 0, fmt.Errorf("resize of %s with %d entries: %d copied (%+v, %+v)", table, n, copied, objs.Resized(), objs.MapsResized())
	}
	got, err := rm.count(objs)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if got != n {
		return 0, 0, 0, 0, fmt.Errorf("resize of %s with %d entries: %d in the new map", table, n, got)
	}
	return copyTook, loadTook, from, to, nil
}

// fillSlots writes n service slots: frontends of 16 backends each.
func fillSlots(m *ebpf.Map, n int) error {
	return fillBatches(m, n, func(id int, k *xbpf.SvcKey, v *xbpf.SvcValue) {
		fe := id / 17
		*k = xbpf.SvcKey{Port: 80, Proto: 6, Family: xbpf.FamilyIPv4, Slot: uint16(id % 17)}
		k.Addr[0], k.Addr[1], k.Addr[2], k.Addr[3] = 172, 30, byte(fe>>8), byte(fe)
		*v = xbpf.SvcValue{SvcId: uint32(fe + 1), BackendId: uint32(id%1000 + 1), Count: 16}
	})
}

// fillFlows writes n entries, as n/2 flows' forward and reply entries
// would (distinct keys, values of live flows).
func fillFlows(m *ebpf.Map, n int) error {
	return fillBatches(m, n, func(id int, k *xbpf.CtKey, v *xbpf.CtEntry) {
		*k = xbpf.CtKey{Proto: 6, Family: xbpf.FamilyIPv4, Sport: uint16(id), Dport: 80}
		k.Saddr[0], k.Saddr[1], k.Saddr[2], k.Saddr[3] = 10, byte(id>>24), byte(id>>16), byte(id>>8)
		k.Daddr[0], k.Daddr[1], k.Daddr[2], k.Daddr[3] = 172, 30, 0, 10
		*v = xbpf.CtEntry{Expires: 1 << 62, BackendId: uint32(id % 1000), SvcId: 1, State: uint8(xbpf.XvsXvsCtStateXVS_CT_ESTABLISHED)}
	})
}

// fillBatches writes entries 0..n-1 of m, entry(id) each, in batches.
func fillBatches[K, V any](m *ebpf.Map, n int, entry func(id int, k *K, v *V)) error {
	const chunk = 4096
	keys := make([]K, chunk)
	vals := make([]V, chunk)
	for base := 0; base < n; base += chunk {
		c := min(chunk, n-base)
		for i := range c {
			entry(base+i, &keys[i], &vals[i])
		}
		if _, err := m.BatchUpdate(keys[:c], vals[:c], nil); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

func countEntries(m *ebpf.Map) (int, error) {
	keys := make([]xbpf.CtKey, 4096)
	vals := make([]xbpf.CtEntry, 4096)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

func resizePlot(path string, rs []resizeResult) error {
	p := plot.New()
	p.Title.Text = "Map resize: copy time of the old entries"
	p.X.Label.Text = "entries in the map"
	p.Y.Label.Text = "copy time (ms)"
	p.Add(plotter.NewGrid())
	var lines []any
	for _, table := range []string{xbpf.XvsMapXvsConntrack, xbpf.XvsMapXvsServices} {
		var xy plotter.XYs
		for _, r := range rs {
			if r.table == table {
				xy = append(xy, plotter.XY{X: float64(r.entries), Y: float64(r.copyMedian) / float64(time.Millisecond)})
			}
		}
		if len(xy) > 0 {
			lines = append(lines, table+" (median)", xy)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	p.Y.Min = 0
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

func resizeReport(rs []resizeResult, rounds int, png, cmd string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Map resize under live traffic\n\n")
	fmt.Fprintf(&b, "Generated by `%s` on %s, %d rounds per size.\n", strings.TrimSpace(cmd), time.Now().UTC().Format("2006-01-02"), rounds)
	var u unix.Utsname
	_ = unix.Uname(&u)
	fmt.Fprintf(&b, "Machine: Linux %s, %s, %d CPUs; load average %s.\n\n", unix.ByteSliceToString(u.Release[:]), cpuModel(), runtime.NumCPU(), loadAvg())
	b.WriteString(`A datapath whose established conntrack table holds N entries (N/2 flows) is
loaded again with the table twice as large, as an agent restarted with a new
` + "`--bpf-conntrack-size`" + ` is: the first objects stay open (the running programs),
the old table stays readable to every program through its old slot of
` + "`xvs_ct_tables`" + ` while its entries are copied (one BPF_NOEXIST update each: an
entry a program copied over on first use is kept), then the slot is emptied.
"copy" is that copy (loader.Resize.Took); "Load" is the whole loader.Load,
program verification included. Every run checks that the new table holds all
N entries.

The services map (` + "`--bpf-max-service-slots`" + `; the other maps sized by
` + "`--bpf-max-services`" + ` and ` + "`--bpf-max-backends`" + ` the same way) is named by the
programs directly: a new agent copies every entry of the old map into the new
one before its programs replace the running ones, which serve from the old map
meanwhile (loader/regrow.go). Its rows fill the map with N slots (frontends of
16 backends) and load again with twice the size; "copy" is loader.MapResize.Took,
which delays the new agent's start by as much.

| map | entries | map before -> after | copy (median) | copies | entries/s | whole Load (median) |
|---|---:|---|---:|---|---:|---:|
`)
	for _, r := range rs {
		var each []string
		for _, c := range r.copies {
			each = append(each, c.Round(time.Millisecond).String())
		}
		rate := float64(r.entries) / r.copyMedian.Seconds()
		fmt.Fprintf(&b, "| %s | %d | %d -> %d | %v | %s | %.0f | %v |\n", r.table, r.entries, r.from, r.to,
			r.copyMedian.Round(time.Millisecond), strings.Join(each, ", "), rate, r.loadMedian.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "\n![copy time against entries](%s)\n\n", png)
	b.WriteString(`While the copy runs, packets are served: a flow whose entry is not copied yet
is found in the old table (ct_get) and copied by the program itself. The
held-connection proof is a test, not a benchmark: TestPrivConntrackResizeLive
(cmd/xvs) restarts the agent with a new size under three byte-checked TCP
streams and a UDP client, plain, masqueraded by netfilter and masqueraded
by xvs; TestPrivPacketConntrackMidResize (bpf) runs packets of 60 flows
through the programs between the slot swap and the copy; TestPrivMapResizeLive
(cmd/xvs) restarts the agent with other Service, backend and slot sizes, up,
down, and too small (refused), under the same streams.

## Reproduce

As root: ` + "`make bench-resize`" + `, or ` + "`bin/bench resize [-out docs/BENCHMARKS-resize.md] [-entries 131072,262144,524288,1048576] [-rounds 3]`" + `.
Each run loads its objects under ` + "`/sys/fs/bpf/xvs-bench-resize-<pid>-<N>-<round>`" + ` (` + "`xvs-bench-regrow-...`" + ` for the services map) and removes them.
`)
	return b.Bytes()
}
