package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/loader"
)

// TestPrivDeviceBurst: pod veths appear long after the agent starts, and
// a node that starts many pods at once creates them in a burst (a netlink
// storm that can overflow the agent's link subscription). 120 veth pairs
// created in one batch while the agent runs all get the programs, and
// when they are deleted in one batch every pin goes with them.
func TestPrivDeviceBurst(t *testing.T) {
	// auto: TCX where the kernel has it; legacy: clsact filters.
	for _, mode := range []string{"auto", "legacy"} {
		t.Run(mode, func(t *testing.T) { testDeviceBurst(t, mode) })
	}
}

func testDeviceBurst(t *testing.T, mode string) {
	w := newWorld(t, "--tc-attach", mode)
	const pairs = 120
	var add, del strings.Builder
	var names []string
	for i := range pairs {
		a, b := fmt.Sprintf("brst%d", i), fmt.Sprintf("brsp%d", i)
		names = append(names, a, b)
		fmt.Fprintf(&add, "link add %s type veth peer name %s\nlink set %s up\nlink set %s up\n", a, b, a, b)
		fmt.Fprintf(&del, "link del %s\n", a)
	}
	batch := func(script string) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "batch")
		if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := lab.Run(w.Node.NS, "ip", "-batch", f); err != nil {
			t.Fatalf("ip -batch: %v: %s", err, out)
		}
	}
	t.Cleanup(func() {
		_, _ = lab.Run(w.Node.NS, "sh", "-c", "for i in $(seq 0 119); do ip link del brst$i 2>/dev/null; done")
	})
	// The devices carrying the programs: pinned TCX links, or clsact
	// filters of ours on a kernel without TCX (the 6.1 guest).
	carrying := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		err := w.Node.NS.Do(func() error {
			atts, err := loader.Attached(w.PinPath)
			for _, a := range atts {
				out[a.Device] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	wait := func(what string, want bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			have := carrying()
			var left []string
			for _, n := range names {
				if have[n] != want {
					left = append(left, n)
				}
			}
			if len(left) == 0 {
				return time.Since(start)
			}
			// The watch's rescan (every 30 s) is the backstop for a
			// subscription that overflowed.
			if time.Since(start) > 75*time.Second {
				t.Fatalf("%s: %d of %d devices not done, e.g. %v", what, len(left), len(names), left[:min(5, len(left))])
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	batch(add.String())
	took := wait("attach", true)
	t.Logf("%d new devices got the programs in %v", len(names), took)
	batch(del.String())
	took = wait("detach", false)
	t.Logf("their links and pins went within %v of their deletion", took)
	if exited, err := w.Agent.Exited(); exited {
		t.Fatalf("the agent exited: %v", err)
	}
}
