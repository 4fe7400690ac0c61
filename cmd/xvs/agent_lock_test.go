package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// TestPrivOneAgentPerPinPath: while an agent runs, a second agent on the
// same --pin-path waits, then exits naming the first one's pid, without
// touching the maps; `xvs cleanup` refuses too. The first agent's traffic
// is undisturbed; once it stops, cleanup works.
func TestPrivOneAgentPerPinPath(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	start := time.Now()
	// Under timeout(1): a second agent that did start would run until
	// killed, and the test fail on its output rather than hang.
	out, err := lab.Run(w.Node.NS, "timeout", "30", w.Bin, "agent", "--objects", w.Dir, "--hostname-override", "node",
		"--pin-path", w.PinPath, "--node-ip", harness.DemoNodeIP.String(), "--pin-lock-wait", "2s")
	if err == nil {
		t.Fatalf("a second agent on %s ran:\n%s", w.PinPath, out)
	}
	if want := fmt.Sprintf("pid %d", w.Agent.Pid()); !strings.Contains(string(out), "another xvs agent uses this --pin-path") || !strings.Contains(string(out), want) {
		t.Errorf("second agent's error does not name the first (%s):\n%s", want, out)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("second agent gave up after %v, before --pin-lock-wait", d)
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "cleanup", "--pin-path", w.PinPath); err == nil || !strings.Contains(string(out), "stop that agent first") {
		t.Errorf("xvs cleanup beside a running agent: %v\n%s", err, out)
	}
	for range 20 {
		if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second); r.Verdict != lab.OK {
			t.Fatalf("traffic after the second agent and the refused cleanup: %v", r)
		}
	}
	if err := w.WaitProgrammed(len(harness.DemoPodIPs), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := lab.Run(w.Node.NS, w.Bin, "cleanup", "--pin-path", w.PinPath); err != nil {
		t.Fatalf("xvs cleanup after the agent stopped: %v\n%s", err, out)
	}
}
