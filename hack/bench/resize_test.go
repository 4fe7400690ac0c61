package main

import (
	"os"
	"strings"
	"testing"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// TestPrivResizeBenchTiny runs the resize benchmark at a tiny size, so
// that it cannot rot; it asserts nothing about timings, only that every
// entry arrived (measureResize checks) and the report has its table.
func TestPrivResizeBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the benchmark loads BPF objects and needs root")
	}
	var rs []resizeResult
	for _, table := range []string{xbpf.XvsMapXvsConntrack, xbpf.XvsMapXvsServices} {
		r, err := measureResize(table, 5000, 2)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	report := string(resizeReport(rs, 2, "x.png", "bin/bench resize"))
	for _, row := range []string{"| xvs_conntrack | 5000 | 10000 -> 20000 |", "| xvs_services | 5000 | 10000 -> 20000 |"} {
		if !strings.Contains(report, row) {
			t.Fatalf("no row %q in the report:\n%s", row, report)
		}
	}
}
