package controller

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
)

// FullSyncGCPercent is the garbage collector's target while a whole world
// is translated and applied: the informers' initial list and the first
// sync, and every later full sync. At Go's default (GOGC=100) the heap may
// grow to twice the live heap before a collection, and that is where the
// agent's peak memory lands at 100k Services; a lower target spends some
// CPU of those rare syncs on a lower peak.
const FullSyncGCPercent = 25

// SteadyGCHeadroom is the heap growth between collections that the target
// after a full sync allows at least (SteadyGCPercent).
const SteadyGCHeadroom = 64 << 20

// LowerGCTarget lowers the collector's target to FullSyncGCPercent, unless
// it is lower already or collection is off (GOGC), and returns what sets
// the target for the time until the next full sync: SteadyGCPercent of
// the live heap then (call it after the sync, once a collection has run),
// or the operator's GOGC when one is set.
func LowerGCTarget() (restore func()) {
	prev := debug.SetGCPercent(FullSyncGCPercent)
	if prev < FullSyncGCPercent { // lower already, or off (-1)
		debug.SetGCPercent(prev)
	}
	return func() {
		target, set := operatorGCPercent()
		if !set {
			target = SteadyGCPercent(liveHeap(), target)
		}
		debug.SetGCPercent(target)
	}
}

// SteadyGCPercent is the collector's target between full syncs for a live
// heap of live bytes, given the operator's target base (GOGC; 100 by
// default, -1 off). Go's target lets the heap grow by base% of the live
// heap before the next collection: at 100,000 Services (about 400 MiB
// live) the default doubles the agent's RSS, for garbage that between
// syncs comes only from changes. So the growth is held to
// SteadyGCHeadroom, or FullSyncGCPercent of the live heap when that is
// more; never above base (small clusters keep Go's default). The cost is
// more frequent collections of a large heap while Services change.
func SteadyGCPercent(live uint64, base int) int {
	if base < 0 || live == 0 {
		return base
	}
	return min(base, max(FullSyncGCPercent, int(100*SteadyGCHeadroom/live)))
}

// operatorGCPercent is the target GOGC asks for, and whether it is set
// (100 and false without it).
func operatorGCPercent() (int, bool) {
	v := strings.TrimSpace(os.Getenv("GOGC"))
	if strings.EqualFold(v, "off") {
		return -1, true
	}
	if n, err := strconv.Atoi(v); err == nil {
		return n, true
	}
	return 100, false
}

// liveHeap is the heap the last collection marked live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
