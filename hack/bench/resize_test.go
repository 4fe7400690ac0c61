package main

import (
	"os"
	"strings"
	"testing"
)

// TestPrivResizeBenchTiny runs the resize benchmark at a tiny size, so
// that it cannot rot; it asserts nothing about timings, only that every
// entry arrived (measureResize checks) and the report has its table.
func TestPrivResizeBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the benchmark loads BPF objects and needs root")
	}
	r, err := measureResize(5000, 2)
	if err != nil {
		t.Fatal(err)
	}
	report := string(resizeReport([]resizeResult{r}, 2, "x.png", "bin/bench resize"))
	if !strings.Contains(report, "| 5000 | 10000 -> 20000 |") {
		t.Fatalf("report:\n%s", report)
	}
}
