package controller

import (
	"runtime/debug"
	"testing"
)

func TestLowerGCTarget(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	t.Setenv("GOGC", "")
	for _, c := range []struct {
		gogc           string
		before, during int
	}{
		{"", 100, FullSyncGCPercent},    // the default is lowered
		{"10", 10, 10},                  // an operator's lower GOGC stays
		{"200", 200, FullSyncGCPercent}, // an operator's higher one is lowered during the sync only
		{"off", -1, -1},                 // GOGC=off stays off
	} {
		t.Setenv("GOGC", c.gogc)
		debug.SetGCPercent(c.before)
		restore := LowerGCTarget()
		if got := debug.SetGCPercent(c.during); got != c.during {
			t.Errorf("GOGC=%q: target %d during a full sync, want %d", c.gogc, got, c.during)
		}
		restore()
		// This test's heap is small: the operator's target comes back.
		if got := debug.SetGCPercent(c.before); got != c.before {
			t.Errorf("GOGC=%q: target %d after, want %d", c.gogc, got, c.before)
		}
	}
}

func TestSteadyGCPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live uint64
		base int
		want int
	}{
		{32 * mib, 100, 100}, // small: Go's default
		{64 * mib, 100, 100}, // 64 MiB of headroom is 100%
		{128 * mib, 100, 50}, // 64 MiB of headroom
		{400 * mib, 100, 25}, // 100k Services: FullSyncGCPercent, not 16%
		{400 * mib, 10, 10},  // an operator's lower GOGC stays
		{128 * mib, 200, 50}, // a higher one is held to the headroom too
		{400 * mib, -1, -1},  // off stays off
		{0, 100, 100},        // nothing measured yet
	} {
		if got := SteadyGCPercent(c.live, c.base); got != c.want {
			t.Errorf("SteadyGCPercent(%d MiB, %d) = %d, want %d", c.live/mib, c.base, got, c.want)
		}
	}
}
