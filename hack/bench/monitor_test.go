package main

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestPrivMonitorBenchTiny runs the monitor benchmark at a tiny size: the
// three cases measure, the default rate suppresses most of the flood and
// lets its burst through, taking every event reads them, and the report
// renders. Nothing about timings.
func TestPrivMonitorBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF programs and needs root (CAP_BPF, CAP_NET_ADMIN); run it as root")
	}
	const rounds, repeat = 2, 2000
	res, err := measureMonitor(context.Background(), rounds, repeat)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d cases", len(res))
	}
	off, flood, every := res[0], res[1], res[2]
	if off.events != 0 || off.suppressed != 0 || flood.events == 0 || flood.suppressed == 0 ||
		flood.events+flood.suppressed != rounds*repeat || every.suppressed != 0 || every.events+every.lost != rounds*repeat {
		t.Errorf("cases: %+v", res)
	}
	report := string(monitorReport(res, rounds, repeat, "bin/bench monitor"))
	for _, want := range []string{"| off (no monitor) |", "| monitor taking every event |", "Goal:"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}
