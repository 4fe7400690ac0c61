package conformance

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// The monitor check: each probe whose explain check said the datapath
// drops or refuses it (and passed) must also show up in `xvs monitor`: an
// event from the probe's client to its destination, with the reason
// explain named. The run's monitor reads the scenario agent's event ring
// (ebpf mode) or the NFLOG group of xvs's rules in the node's network
// namespace (ipvs mode) from the first probe step on.

// monitor is the scenario's event source, opened on first use; nil with
// the reason when it cannot be.
func (r *scenarioRun) monitor() (model.MonitorSource, string) {
	if r.mon == nil && r.monErr == "" {
		var err error
		switch r.opts.Mode {
		case ModeEBPF:
			r.mon, err = maps.OpenMonitor(r.w.pinPath, maps.DefaultMonitorRate, maps.DefaultMonitorBurst)
		case ModeIPVS:
			err = r.w.node.NS.Do(func() (err error) {
				r.mon, err = ipvs.OpenMonitor()
				return err
			})
		default:
			err = fmt.Errorf("no monitor in %s mode", r.opts.Mode)
		}
		if err != nil {
			r.mon, r.monErr = nil, "ERROR: "+err.Error()
		}
	}
	return r.mon, r.monErr
}

// closeMonitor turns the scenario's events off again.
func (r *scenarioRun) closeMonitor() {
	if r.mon != nil {
		r.mon.Close()
		r.mon = nil
	}
}

// monitorWait is how long the check waits for the event after the probe
// (the events are written as the packets are dropped; the probe has
// already seen the outcome).
const monitorWait = time.Second

// checkMonitor looks for the probe's event among those written since the
// last check.
func (r *scenarioRun) checkMonitor(step int, p *Probe, c client, x *model.Explanation) {
	src := c.src
	if x.Host {
		src = x.Source.Addr() // the hooks report the node's address
	}
	want := fmt.Sprintf("%s event %s from %s to %s", x.Action, x.Verdict, src, p.to)
	m, merr := r.monitor()
	if m == nil {
		r.reportMonitor(step, p.Name, want, merr, false)
		return
	}
	seen := map[string]int{}
	var others []string // other tuples' events, for the report of a miss
	end := time.Now().Add(monitorWait)
	for {
		ev, err := m.Read(end)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			r.reportMonitor(step, p.Name, want, "ERROR: "+err.Error(), false)
			return
		}
		if ev.Source.Addr() == src && ev.Destination == p.to && ev.Protocol == p.proto {
			if ev.Type == x.Action && ev.Reason == x.Verdict {
				r.reportMonitor(step, p.Name, want, fmt.Sprintf("%s event %s from %s to %s", ev.Type, ev.Reason, ev.Source, ev.Destination), true)
				// The probe's other tries' events stay queued; the
				// next check reads past them.
				return
			}
			seen[ev.Type+" "+ev.Reason]++
		} else if len(others) < 3 {
			others = append(others, fmt.Sprintf("%s %s %s %s -> %s", ev.Type, ev.Reason, ev.Protocol, ev.Source, ev.Destination))
		}
	}
	got := "no event"
	if len(seen) > 0 {
		got = fmt.Sprintf("other events for the probe: %v", seen)
	}
	if len(others) > 0 {
		got += fmt.Sprintf(" (events for other packets meanwhile: %s)", strings.Join(others, "; "))
	}
	r.reportMonitor(step, p.Name, want, got, false)
}

// reportMonitor records the monitor check of a probe, as a result of its
// own (ProbeResult.Monitor).
func (r *scenarioRun) reportMonitor(step int, name, expected, got string, pass bool) {
	r.report(step, "monitor "+name, expected, got, "", pass)
	r.res.Probes[len(r.res.Probes)-1].Monitor = true
}
