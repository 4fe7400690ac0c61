package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"
)

// writeSummary puts every benchmark goal (the constants goal* of this
// package) in one table, each with the
// measured figure of this run and whether it is met; the sections below
// have the details and what limits the missed ones.
func writeSummary(b *bytes.Buffer, rs []sizeResult, traffic []trafficResult, control []controlResult, agent []agentResult, vm *vmResult, took time.Duration) {
	fmt.Fprintf(b, "## Summary of the goals\n\n")
	fmt.Fprintf(b, "This run took %v. Details, methods and what limits the missed goals are in the sections below.\n\n", took.Round(time.Second))
	fmt.Fprintf(b, "| Goal | Measured | Met |\n|---|---|---|\n")
	if len(rs) > 0 {
		lo, hi := rs[0], rs[len(rs)-1]
		for c := range numCases {
			r := ratio(hi.Cases[c].Xvs.Median, lo.Cases[c].Xvs.Median)
			fmt.Fprintf(b, "| per packet (tc), %s: %d Services <= %.1fx of %d | %.2fx | %s |\n", c, hi.N, goalRatio, lo.N, r, yesNo(r <= goalRatio))
		}
	}
	summaryTraffic(b, traffic)
	summaryControl(b, control, agent)
	if vm != nil {
		var ms []string
		for _, r := range vm.Results {
			e, i := r.Cells[dpAgentEBPF], r.Cells[dpAgentIPVS]
			switch {
			case e != nil && i != nil && len(e.Runs) > 0 && len(i.Runs) > 0:
				ms = append(ms, fmt.Sprintf("%d: conn/s %.2fx, CPU %.2fx", r.N, mCPS.ratio(e, i), mCPUConn.ratio(e, i)))
			case e != nil && e.Err != "":
				ms = append(ms, fmt.Sprintf("%d: ebpf mode did not run", r.N))
			}
		}
		fmt.Fprintf(b, "| IPVS in the VM (emulated): ebpf mode against ipvs mode | %s | (no goal) |\n", strings.Join(ms, "; "))
	}
	fmt.Fprintln(b)
}

// summaryTraffic writes the real-traffic goals' rows.
func summaryTraffic(b *bytes.Buffer, traffic []trafficResult) {
	if len(traffic) == 0 {
		return
	}
	var rate, cpu []string
	okRate, okCPU := true, true
	for _, r := range traffic {
		if r.Cells[dpXvs] == nil || r.Cells[dpFloor] == nil {
			continue
		}
		rc, cc := mCPS.ratio(r.Cells[dpXvs], r.Cells[dpFloor]), mCPUConn.ratio(r.Cells[dpXvs], r.Cells[dpFloor])
		rate, cpu = append(rate, fmt.Sprintf("%d: %.2fx", r.N, rc)), append(cpu, fmt.Sprintf("%d: %.2fx", r.N, cc))
		okRate, okCPU = okRate && rc >= goalFloorRatio, okCPU && cc >= goalFloorRatio
	}
	fmt.Fprintf(b, "| real traffic: conn/s through a VIP >= %.1fx the floor at every N | rate %s; CPU view %s | rate %s, CPU %s |\n",
		goalFloorRatio, strings.Join(rate, ", "), strings.Join(cpu, ", "), yesNo(okRate), yesNo(okCPU))
	for _, d := range []datapath{dpNftables, dpIptables} {
		var rate, cpu []string
		okRate, okCPU := true, true
		for _, r := range traffic {
			x, o := r.Cells[dpXvs], r.Cells[d]
			if x == nil || o == nil || len(o.Runs) == 0 {
				continue
			}
			c, q := mCPS.ratio(x, o), mRPS.ratio(x, o)
			cc, cq := mCPUConn.ratio(x, o), mCPUReq.ratio(x, o)
			rate = append(rate, fmt.Sprintf("%d: %.2fx/%.2fx", r.N, c, q))
			cpu = append(cpu, fmt.Sprintf("%d: %.2fx/%.2fx", r.N, cc, cq))
			okRate, okCPU = okRate && c >= 1 && q >= 1, okCPU && cc >= 1 && cq >= 1
		}
		if len(rate) > 0 {
			fmt.Fprintf(b, "| real traffic: never slower than %s (conn/s / req/s) | rate %s; CPU view %s | rate %s, CPU %s |\n",
				d, strings.Join(rate, ", "), strings.Join(cpu, ", "), yesNo(okRate), yesNo(okCPU))
		}
	}
	if bx := traffic[0].Cells[dpXvs]; bx != nil && len(traffic) > 1 {
		var ms []string
		ok := true
		for _, r := range traffic[1:] {
			if x := r.Cells[dpXvs]; x != nil {
				r50, r99 := cellMedian(x, p50)/cellMedian(bx, p50), cellMedian(x, p99)/cellMedian(bx, p99)
				ms = append(ms, fmt.Sprintf("%d: %.2fx/%.2fx", r.N, r50, r99))
				ok = ok && r50 <= flatP50 && r99 <= flatP99
			}
		}
		fmt.Fprintf(b, "| real traffic: xvs connect() time flat in N (p50 <= %.1fx, p99 <= %.1fx of %d) | p50/p99 %s | %s |\n",
			flatP50, flatP99, traffic[0].N, strings.Join(ms, ", "), yesNo(ok))
	}
}

// summaryControl writes the control plane's rows: the reconciler in
// process, then the real agent process of each source.
func summaryControl(b *bytes.Buffer, control []controlResult, agent []agentResult) {
	if len(control) > 0 {
		last := control[len(control)-1]
		fmt.Fprintf(b, "| control plane: full sync of %d Services x %d endpoints <= %v | wall %v, CPU %v | wall %s, CPU %s |\n", last.N, backendsPerService,
			goalSyncTime, last.Total().Round(time.Millisecond), last.CPU.Round(time.Millisecond), yesNo(last.Total() <= goalSyncTime), yesNo(last.CPU <= goalSyncTime))
		fmt.Fprintf(b, "| control plane: RSS at %d Services <= %d MiB | after the sync %.0f MiB, peak %.0f MiB | after %s, peak %s |\n", last.N, goalRSS>>20,
			float64(last.RSS)/(1<<20), float64(last.HWM)/(1<<20), yesNo(last.RSS <= goalRSS), yesNo(last.HWM <= goalRSS))
		if len(last.Changes) > 0 {
			s := slices.Sorted(slices.Values(last.Changes))
			fmt.Fprintf(b, "| control plane: one EndpointSlice change to the maps at %d Services, p99 <= %v | p50 %v, p99 %v | %s |\n", last.N, goalChangeP99,
				percentile(s, 0.5).Round(10*time.Microsecond), percentile(s, 0.99).Round(10*time.Microsecond), yesNo(percentile(s, 0.99) <= goalChangeP99))
		}
	}
	for _, src := range []string{"api", "file"} {
		var a *agentResult
		for i := range agent {
			if agent[i].Source == src {
				a = &agent[i]
			}
		}
		if a != nil {
			change := ""
			if p50, p99, ok := a.changeQuantiles(); ok {
				change = fmt.Sprintf("; one EndpointSlice change through the API server to the maps p50 %v, p99 %v", p50, p99)
			}
			fmt.Fprintf(b, "| control plane: the real agent process (%s source) at %d Services x %d endpoints | ready after %v, peak RSS %.0f MiB%s | RSS %s |\n",
				src, a.N, backendsPerService, a.Ready.Round(time.Millisecond), float64(a.HWM)/(1<<20), change, yesNo(a.HWM <= goalRSS))
		}
	}
}
