package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrivStagesBenchTiny runs the stage breakdown with a few samples, so
// that the stage programs keep loading over the datapath's maps and reach
// their stages as bpf/lib changes (measureStages checks every return code
// and the real program's verdicts). Nothing about timings is asserted;
// the report and its plot must come out, and no pin or link is left.
func TestPrivStagesBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the benchmark loads BPF programs and needs root")
	}
	r, err := measureStages(200)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stageSteps {
		if r.cold[s.name].Median <= 0 || r.warm[s.name].Median <= 0 {
			t.Errorf("%s: no time measured (cold %v, warm %v)", s.name, r.cold[s.name], r.warm[s.name])
		}
	}
	png := filepath.Join(t.TempDir(), "stages.png")
	if err := stagesPlot(png, r); err != nil {
		t.Fatal(err)
	}
	report := string(stagesReport(r, "stages.png", "bin/bench stages", "0 0 0"))
	for _, want := range []string{"| `stage_lookup` |", "| `xvs_tc_ingress` |", "The real program above the floor"} {
		if !strings.Contains(report, want) {
			t.Fatalf("report lacks %q:\n%s", want, report)
		}
	}
	if _, err := os.Stat(privatePinPath("stages")); !os.IsNotExist(err) {
		t.Errorf("pin path %s left behind (%v)", privatePinPath("stages"), err)
	}
}
