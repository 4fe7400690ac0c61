package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrivBenchTiny runs the whole benchmark at a tiny size, so that the
// harness cannot rot between the rare real runs. It fails (never skips)
// without root, like the other privileged tests, and asserts nothing about
// timings: only that a complete report and plot come out and no pin is left.
func TestPrivBenchTiny(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF programs and needs root (CAP_BPF, CAP_NET_ADMIN); run it as root")
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	opts := Options{Out: out, Sizes: []int{10, 1}, Samples: 300, Command: "go test ./hack/bench/", Log: testLog{t}}
	if err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Machine", "Kernel:", "CPU:", "## Method", "## Results", "![", "BENCHMARKS.png",
		"### Conntrack hit", "### New flow", "### Goal", "## Control plane: full sync", "## Reproduce",
		"| 1 |", "| 10 |",
	} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if fi, err := os.Stat(filepath.Join(filepath.Dir(out), "BENCHMARKS.png")); err != nil || fi.Size() == 0 {
		t.Errorf("plot missing or empty: %v", err)
	}
	if left, _ := filepath.Glob(fmt.Sprintf("/sys/fs/bpf/xvs-bench-%d-*", os.Getpid())); len(left) > 0 {
		t.Errorf("pin paths left behind: %v", left)
	}
}

// TestBenchOptionsValidate: bad options are refused before anything is
// loaded.
func TestBenchOptionsValidate(t *testing.T) {
	for _, o := range []Options{
		{Out: "", Sizes: []int{1}, Samples: 1},
		{Out: "x.md", Sizes: nil, Samples: 1},
		{Out: "x.md", Sizes: []int{0}, Samples: 1},
		{Out: "x.md", Sizes: []int{1}, Samples: 0},
	} {
		if err := Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) accepted bad options", o)
		}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
