package controller

import (
	"runtime/debug"
	"testing"
)

func TestLowerGCTarget(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	for _, c := range []struct{ before, during int }{
		{100, FullSyncGCPercent}, // the default is lowered
		{10, 10},                 // an operator's lower GOGC stays
		{-1, -1},                 // GOGC=off stays off
	} {
		debug.SetGCPercent(c.before)
		restore := LowerGCTarget()
		if got := debug.SetGCPercent(c.during); got != c.during {
			t.Errorf("GOGC=%d: target %d during a full sync, want %d", c.before, got, c.during)
		}
		restore()
		if got := debug.SetGCPercent(c.before); got != c.before {
			t.Errorf("GOGC=%d: target %d after, want it back", c.before, got)
		}
	}
}
