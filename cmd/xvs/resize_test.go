package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// TestPrivConntrackResizeLive: the agent restarted with another
// --bpf-conntrack-size (up, then down) resizes its conntrack tables
// without dropping a flow: three TCP streams (data both ways, every byte
// checked) carry on on their backends, a UDP client that keeps its port
// keeps its backend, new connections work, the pinned tables have the new
// sizes and no old table is left pinned. Plain and masqueraded (the
// masquerade port of each flow lives in conntrack). Without the old
// tables' entries (not copied, no old slot) the streams stall.
func TestPrivConntrackResizeLive(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"plain", nil},
		{"masquerade-all", []string{"--masquerade-all"}},
		// xvs masquerades itself: the port of each flow is only in
		// its conntrack.
		{"bypass-masquerade-all", []string{"--netfilter-mode", "bypass", "--masquerade-all"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, append([]string{"--bpf-conntrack-size", "32768"}, tc.args...)...)
			flows := startMigrationFlows(t, w, nil)
			for _, h := range flows.streams {
				if masqueraded := h.Server.Peer.Addr() != harness.DemoClientIP; masqueraded != (len(tc.args) > 0) {
					t.Fatalf("stream %s: the backend saw %s (masqueraded %v)", h.Local, h.Server.Peer, masqueraded)
				}
			}
			for _, size := range []int{131072, 65536} {
				// A TCG guest can take seconds to stop an agent.
				if err := w.Agent.Stop(20 * time.Second); err != nil {
					t.Fatal(err)
				}
				if err := w.StartAgent(append([]string{"--bpf-conntrack-size", strconv.Itoa(size)}, tc.args...)...); err != nil {
					t.Fatal(err)
				}
				// The old agent's maps are programmed already: wait for
				// the new one's word that it resized and that its programs
				// are attached (it runs), then for its sync.
				resized := regexp.MustCompile(`Conntrack table resized [^\n]*table="?xvs_conntrack"? [^\n]*to=` + strconv.Itoa(size) + ` `)
				running := regexp.MustCompile(`xvs agent running`)
				var log []byte
				for deadline := time.Now().Add(90 * time.Second); !resized.Match(log) || !running.Match(log); time.Sleep(100 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the agent did not resize to %d and run:\n%s", size, log)
					}
					log, _ = os.ReadFile(w.Agent.Log)
				}
				t.Logf("%s", resized.Find(log))
				if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
					t.Fatal(err)
				}
				for name, want := range map[string]uint32{xbpf.XvsMapXvsConntrack: uint32(size), xbpf.XvsMapXvsCtUnreplied: uint32(size / 4)} {
					m, err := ebpf.LoadPinnedMap(filepath.Join(w.PinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
					if err != nil {
						t.Fatal(err)
					}
					got := m.MaxEntries()
					m.Close()
					if got != want {
						t.Fatalf("pinned %s has %d entries after the resize to %d, want %d", name, got, size, want)
					}
					if _, err := os.Stat(filepath.Join(w.PinPath, name+"_resizing")); !os.IsNotExist(err) {
						t.Fatalf("old %s still pinned (%v)", name, err)
					}
				}
				switched := time.Now()
				for _, h := range flows.streams {
					st, err := h.Check(10 * time.Second)
					if err != nil {
						t.Fatalf("after the resize to %d: %v", size, err)
					}
					t.Logf("stream %s -> %s: %d bytes intact (sha256 %s...)", h.Local, h.Server.Local, st.Bytes, st.SHA256[:12])
				}
				if _, err := flows.udp.Await(switched, 10*time.Second, flows.first.Server.Local); err != nil {
					t.Fatalf("the UDP client after the resize to %d: %v", size, err)
				}
				if _, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80),
					lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20}); err != nil {
					t.Fatalf("a new connection after the resize to %d: %v", size, err)
				}
			}
		})
	}
}
