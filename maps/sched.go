package maps

import (
	"fmt"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// schedulers maps IPVS scheduler names (ipvs.scheduler, the xvs.io/scheduler
// annotation) to the datapath's enum. "" and "random" are uniform random, as
// kube-proxy's nftables mode chooses.
var schedulers = map[string]xbpf.Sched{
	"":       xbpf.XvsXvsSchedXVS_SCHED_RANDOM,
	"random": xbpf.XvsXvsSchedXVS_SCHED_RANDOM,
	"rr":     xbpf.XvsXvsSchedXVS_SCHED_RR,
	"wrr":    xbpf.XvsXvsSchedXVS_SCHED_WRR,
	"lc":     xbpf.XvsXvsSchedXVS_SCHED_LC,
	"wlc":    xbpf.XvsXvsSchedXVS_SCHED_WLC,
	"sed":    xbpf.XvsXvsSchedXVS_SCHED_SED,
	"nq":     xbpf.XvsXvsSchedXVS_SCHED_NQ,
	"sh":     xbpf.XvsXvsSchedXVS_SCHED_SH,
	"dh":     xbpf.XvsXvsSchedXVS_SCHED_DH,
	"mh":     xbpf.XvsXvsSchedXVS_SCHED_MH,
}

// SchedulerByName resolves a scheduler name.
func SchedulerByName(name string) (xbpf.Sched, error) {
	s, ok := schedulers[name]
	if !ok {
		return 0, fmt.Errorf("unknown scheduler %q", name)
	}
	return s, nil
}

// SchedulerName is the listing name of a scheduler.
func SchedulerName(s xbpf.Sched) string {
	for name, v := range schedulers {
		if v == s && name != "" {
			return name
		}
	}
	return fmt.Sprintf("sched-%d", s)
}
