package main

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// The test binary doubles as the xvs binary: the agents the tests start
// are this executable with XVS_TEST_AS_MAIN=1, so no separate build step
// can go stale.
func TestMain(m *testing.M) {
	if os.Getenv("XVS_TEST_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Setenv("XVS_TEST_AS_MAIN", "1")
	code := m.Run()
	os.Unsetenv("XVS_TEST_AS_MAIN")
	os.Exit(code)
}

// newWorld builds the single-node world and starts the agent with every
// pod as an endpoint. It fails (never skips) without root.
func newWorld(t *testing.T, agentArgs ...string) *harness.Single {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("namespace tests need root (network namespaces, BPF); run them as root")
	}
	w := startWorld(t, "t", agentArgs...)
	// The first sync waits for the programs' verification: ~10 s per
	// agent in the rig's emulated 6.1 guest, more on a busy host.
	if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return w
}

// startWorld builds the single-node world (namespaces under tag), writes
// the demo Service with every pod and starts the agent; the world goes
// away with the test, and the agent's log is shown when the test failed.
func startWorld(t *testing.T, tag string, agentArgs ...string) *harness.Single {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return harness.StartSingle(t, tag, bin, agentArgs...)
}

func podAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(harness.DemoPodIPs[i], harness.DemoBackendPort)
}

// TestPrivNamespaceTraffic: real TCP and UDP from a client namespace through
// the node to three backend namespaces.
func TestPrivNamespaceTraffic(t *testing.T) {
	w := newWorld(t)
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)

	for name, probe := range map[string]func() lab.Result{
		"TCP": func() lab.Result { return lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second) },
		// The probe's socket is connected to the VIP: a reply from any
		// other source (no reverse NAT) would never reach it.
		"UDP": func() lab.Result { return lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 2*time.Second) },
	} {
		got, err := harness.Spread(60, probe)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 3 {
			t.Fatalf("%s: 60 connections reached %v, want all 3 backends", name, got)
		}
	}

	// Long-lived connections stay on their backend and see the VIP as
	// their peer all along.
	for range 3 {
		reply, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.RemoteAddr().(*net.TCPAddr).AddrPort() != tcp {
			t.Fatalf("connected to %s, want the VIP", c.RemoteAddr())
		}
		for range 20 {
			if err := lab.EchoCheck(c, 2*time.Second); err != nil {
				t.Fatalf("connection to %s broke: %v", reply.Local, err)
			}
		}
		c.Close()
	}

	// A pod created after the agent started: its veth gets the program
	// (the agent watches for new links), so the pod reaches the VIP, and
	// the backend sees the pod's own address.
	late := netip.MustParseAddr("10.244.0.50")
	pod, err := w.Lab.AddPod(w.Node, "late", late)
	if err != nil {
		t.Fatal(err)
	}
	var r lab.Result
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if r = lab.ProbeTCP(pod, late, tcp, time.Second); r.Verdict == lab.OK {
			break
		}
	}
	if r.Verdict != lab.OK || r.Reply.Peer.Addr() != late {
		t.Fatalf("pod created after start: %v", r)
	}

	// Removing an endpoint from the manifests stops new connections to it
	// within a second.
	start := time.Now()
	if err := w.WriteService(harness.DemoPodIPs[:2]); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitProgrammed(2, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("endpoint removal programmed in %v", time.Since(start))
	for i := range 40 {
		r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
		if r.Verdict != lab.OK || r.Reply.Local == podAddr(2) {
			t.Fatalf("connection %d after removal: %v", i, r)
		}
	}
}

// TestPrivContinuity: a long-lived TCP connection keeps exchanging data
// while the agent restarts (which also replaces the program under the live
// attachment), with TCX and with legacy tc.
func TestPrivContinuity(t *testing.T) {
	for _, mode := range []string{"tcx", "legacy"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "tcx" && kernelOlderThan(6, 6) {
				t.Skip("no TCX before Linux 6.6 (the VM's 6.1): the legacy subtest covers this kernel")
			}
			w := newWorld(t, "--tc-attach", mode)
			tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
			_, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()

			stop := make(chan struct{})
			var wg sync.WaitGroup
			var echoes int
			var echoErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					if err := lab.EchoCheck(c, 2*time.Second); err != nil {
						echoErr = err
						return
					}
					echoes++
				}
			}()

			for i := range 3 {
				if err := w.Agent.Stop(5 * time.Second); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // no agent at all for a while
				if err := w.StartAgent("--tc-attach", mode); err != nil {
					t.Fatal(err)
				}
				if err := w.WaitProgrammed(3, 10*time.Second); err != nil {
					t.Fatalf("restart %d: %v", i, err)
				}
				if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, 2*time.Second); r.Verdict != lab.OK {
					t.Fatalf("new connection after restart %d: %v", i, r)
				}
			}
			close(stop)
			wg.Wait()
			if echoErr != nil {
				t.Fatalf("held connection broke after %d echoes: %v", echoes, echoErr)
			}
			if echoes < 10 {
				t.Fatalf("only %d echoes over three restarts", echoes)
			}
			t.Logf("%d echoes across three agent restarts", echoes)
		})
	}
}
