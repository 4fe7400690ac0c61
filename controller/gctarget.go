package controller

import "runtime/debug"

// FullSyncGCPercent is the garbage collector's target while a whole world
// is translated and applied: the informers' initial list and the first
// sync, and every later full sync. At Go's default (GOGC=100) the heap may
// grow to twice the live heap before a collection, and that is where the
// agent's peak memory lands at 100k Services; a lower target spends some
// CPU of those rare syncs on a lower peak. Deltas keep the default.
const FullSyncGCPercent = 25

// LowerGCTarget lowers the collector's target to FullSyncGCPercent, unless
// it is lower already or collection is off (GOGC), and returns what puts
// the previous target back.
func LowerGCTarget() (restore func()) {
	prev := debug.SetGCPercent(FullSyncGCPercent)
	if prev < FullSyncGCPercent { // lower already, or off (-1)
		debug.SetGCPercent(prev)
	}
	return func() { debug.SetGCPercent(prev) }
}
