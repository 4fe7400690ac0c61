package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// benchSchedulers are the schedulers whose new-flow cost is measured.
var benchSchedulers = func() []string {
	var out []string
	for _, s := range model.Schedulers {
		if s.BPF && s.Name != "" {
			out = append(out, s.Name)
		}
	}
	return out
}()

// maglevBackends and the table size of the Maglev build-time figure; the
// goal is 5 ms or less.
const (
	maglevBackends = 1000
	maglevGoal     = 5 * time.Millisecond
	maglevBuilds   = 20
)

type schedResult struct {
	Name string
	Xvs  stat
	Hit  stat
}

// schedBench measures, for one Service with 10 backends, the new-flow cost
// under each scheduler (the scheduler runs only on a flow's first packet),
// and the Maglev table build time.
type schedBench struct {
	Results     []schedResult
	Floor       stat
	MaglevBuild stat
}

func measureSchedulers(ctx context.Context, opts Options) (sb schedBench, err error) {
	cfg := loader.DefaultConfig()
	cfg.ConntrackSize = max(1<<16, pow2(4*(opts.Samples*len(benchSchedulers)+hitFlows)))
	objs, dp, done, err := privateDatapath(cfg, "sched")
	if err != nil {
		return sb, err
	}
	defer func() {
		if derr := done(); derr != nil && err == nil {
			err = derr
		}
	}()
	st := buildState(1)
	var floor []time.Duration
	for i, name := range benchSchedulers {
		for _, sp := range st.Services {
			next := *sp
			next.Scheduler = name
			st = &model.State{Services: map[model.ServicePortName]*model.ServicePort{sp.Name: &next}}
		}
		if err := dp.Sync(ctx, st); err != nil {
			return sb, fmt.Errorf("%s: sync: %w", name, err)
		}
		if p := dp.Problems(); len(p) > 0 {
			return sb, fmt.Errorf("%s: %v", name, p)
		}
		// Each scheduler gets its own clients, so every timed packet is
		// a new flow.
		c := caseNewOne + benchCase(i)
		xvs, empty, err := measureCase(ctx, objs, c, 1, opts.Samples)
		if err != nil {
			return sb, fmt.Errorf("%s: %w", name, err)
		}
		floor = append(floor, empty...)
		sb.Results = append(sb.Results, schedResult{Name: name, Xvs: summarise(xvs)})
		logf(opts.Log, "scheduler %s: new flow %.0f ns (median)", name, sb.Results[i].Xvs.Median)
	}
	sb.Floor = summarise(floor)

	names := make([]string, maglevBackends)
	for i := range names {
		names[i] = addAddr(backendBase, i).String() + ":" + strconv.Itoa(backendPort)
	}
	var builds []time.Duration
	for range maglevBuilds {
		start := time.Now()
		if _, err := reconcile.MaglevTable(names, reconcile.DefaultMaglevSize); err != nil {
			return sb, err
		}
		builds = append(builds, time.Since(start))
	}
	sb.MaglevBuild = summarise(builds)
	logf(opts.Log, "maglev: %d backends, M=%d: %.2f ms (median)", maglevBackends, reconcile.DefaultMaglevSize, sb.MaglevBuild.Median/1e6)
	return sb, nil
}

func writeSchedulers(b *bytes.Buffer, sb schedBench) {
	fmt.Fprintf(b, "## Schedulers\n\n")
	fmt.Fprintf(b, "New-flow cost (the scheduler runs on the first packet of a flow only; conntrack hits never consult it) for one Service with %d backends, each scheduler in turn, same method as above. lc/wlc/sed/nq scan all slots; wrr and mh read a per-Service table.\n\n", backendsPerService)
	fmt.Fprintf(b, "| Scheduler | new flow, median (ns) | mean (ns) | vs random |\n|---|---:|---:|---:|\n")
	base := sb.Results[0].Xvs.Median
	for _, r := range sb.Results {
		fmt.Fprintf(b, "| %s | %.0f | %.1f | %.2fx |\n", r.Name, r.Xvs.Median, r.Xvs.Mean, ratio(r.Xvs.Median, base))
	}
	fmt.Fprintf(b, "\nEmpty program over the same packets: %.0f ns (median).\n\n", sb.Floor.Median)
	fmt.Fprintf(b, "**Maglev table build** (`reconcile.MaglevTable`, M = %d, %d backends, median of %d builds): %.2f ms, mean %.2f ms. Goal %v or less: %s.\n\n",
		reconcile.DefaultMaglevSize, maglevBackends, maglevBuilds, sb.MaglevBuild.Median/1e6, sb.MaglevBuild.Mean/1e6, maglevGoal, yesNo(sb.MaglevBuild.Median <= float64(maglevGoal)))
}

// privatePinPath is where privateDatapath(tag) pins its maps.
func privatePinPath(tag string) string {
	return filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-%s", os.Getpid(), tag))
}

// privateDatapath loads fresh objects under a pin path of this process's
// own (tag names it) and takes over their maps; done closes the objects and
// removes the pins.
func privateDatapath(cfg loader.Config, tag string) (*loader.Objects, *reconcile.Datapath, func() error, error) {
	cfg.PinPath = privatePinPath(tag)
	_ = os.RemoveAll(cfg.PinPath)
	remove := func() error {
		if err := os.RemoveAll(cfg.PinPath); err != nil {
			return fmt.Errorf("remove %s: %w", cfg.PinPath, err)
		}
		return nil
	}
	objs, err := loader.Load(cfg)
	if err != nil {
		remove()
		return nil, nil, nil, err
	}
	done := func() error {
		objs.Close()
		return remove()
	}
	dp, err := reconcile.NewDatapath(maps.FromObjects(objs), reconcile.Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends})
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return objs, dp, done, nil
}
