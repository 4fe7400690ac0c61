package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/ipvs"
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
				waitResized(t, w, `Conntrack table resized [^\n]*table="?xvs_conntrack"? [^\n]*to=`+strconv.Itoa(size)+` `)
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

// TestPrivMapResizeLive: the agent restarted with other --bpf-max-services,
// --bpf-max-backends and --bpf-max-service-slots (up, then down to sizes
// that still hold what is there) resizes every map they size without
// dropping a flow: TCP streams (bytes both ways, checked) carry on on
// their backends, a UDP client that keeps its port keeps its backend, new
// connections work, the pinned maps have the new sizes and no old map is
// left pinned; the per-backend counters do not go back and each backend
// is still counted as holding its streams (the least-connection count,
// which an empty new map would lose: the streams' ends would then drive
// it below zero). A size too small for what the maps hold is refused before
// any pin is touched (the agent exits and says so), and the flows still
// carry on through the maps the agent before left.
func TestPrivMapResizeLive(t *testing.T) {
	sizes := func(svcs, backends, slots int) []string {
		// lc: the datapath counts the connections each backend holds.
		return []string{"--ipvs-scheduler", "lc", "--bpf-max-services", strconv.Itoa(svcs), "--bpf-max-backends", strconv.Itoa(backends),
			"--bpf-max-service-slots", strconv.Itoa(slots)}
	}
	w := newWorld(t, sizes(1024, 1024, 4096)...)
	flows := startMigrationFlows(t, w, nil)
	check := func(when string, since time.Time) {
		t.Helper()
		for _, h := range flows.streams {
			st, err := h.Check(10 * time.Second)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			t.Logf("%s: stream %s -> %s: %d bytes intact (sha256 %s...)", when, h.Local, h.Server.Local, st.Bytes, st.SHA256[:12])
		}
		if _, err := flows.udp.Await(since, 10*time.Second, flows.first.Server.Local); err != nil {
			t.Fatalf("%s: the UDP client: %v", when, err)
		}
		if _, err := lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), netip.AddrPortFrom(harness.DemoVIP, 80),
			lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20}); err != nil {
			t.Fatalf("%s: a new connection: %v", when, err)
		}
	}
	for _, s := range [][3]int{{8192, 8192, 32768}, {2048, 4096, 8192}} {
		before := vipCounters(t, w.PinPath)
		if err := w.Agent.Stop(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := w.StartAgent(sizes(s[0], s[1], s[2])...); err != nil {
			t.Fatal(err)
		}
		want := map[string]uint32{
			xbpf.XvsMapXvsServices: uint32(s[2]), xbpf.XvsMapXvsMembers: uint32(s[2]),
			xbpf.XvsMapXvsBackends: uint32(s[1]), xbpf.XvsMapXvsBackendHeld: uint32(s[1]), xbpf.XvsMapXvsBackendStats: uint32(s[1]),
			xbpf.XvsMapXvsSvcStats: uint32(s[0]), xbpf.XvsMapXvsClusterIps: uint32(s[0]), xbpf.XvsMapXvsRrCursors: uint32(2 * s[0]),
			xbpf.XvsMapXvsSchedTables: uint32(2 * s[0]),
		}
		waitResized(t, w, `BPF map resized [^\n]*map="?xvs_services"? [^\n]*to=`+strconv.Itoa(s[2])+` `)
		for name, size := range want {
			if got := pinnedSize(t, w.PinPath, name); got != size {
				t.Fatalf("pinned %s has %d entries after the resize to %v, want %d", name, got, s, size)
			}
			if _, err := os.Stat(filepath.Join(w.PinPath, name+"_resizing")); !os.IsNotExist(err) {
				t.Fatalf("old %s still pinned (%v)", name, err)
			}
		}
		// The counters came along: every backend's counters did not go
		// back, and each stream is still counted as a connection its
		// backend holds (the least-connection schedulers' count).
		after := vipCounters(t, w.PinPath)
		for addr, b := range before {
			a := after[addr]
			if a.stats.Conns < b.stats.Conns || a.stats.PacketsIn < b.stats.PacketsIn || a.stats.BytesOut < b.stats.BytesOut {
				t.Fatalf("after the resize to %v, %s's counters went back: %+v, before %+v", s, addr, a.stats, b.stats)
			}
			if a.held < b.streams {
				t.Fatalf("after the resize to %v, %s holds %d active connections for its %d streams", s, addr, a.held, b.streams)
			}
		}
		check(fmt.Sprintf("after the resize to %v", s), time.Now())
	}

	// Too small: the demo's frontends and backends take more than 4 slots.
	if err := w.Agent.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.StartAgent(sizes(2048, 4096, 4)...); err != nil {
		t.Fatal(err)
	}
	if err := w.Agent.Wait(60 * time.Second); err == nil {
		t.Fatal("the agent ran with 4 service slots for more entries than that")
	}
	log, _ := os.ReadFile(w.Agent.Log)
	if !regexp.MustCompile(`map resize refused: xvs_services from 8192 to 4 entries: it holds \d+ entries`).Match(log) {
		t.Fatalf("the refusal does not say why:\n%s", log)
	}
	if got := pinnedSize(t, w.PinPath, xbpf.XvsMapXvsServices); got != 8192 {
		t.Fatalf("the refused resize left the services map with %d entries, want 8192", got)
	}
	check("after the refused resize, with no agent", time.Now())
}

// backendCounters are one backend's counters of the demo VIP, the active
// connections the datapath counts it holds, and the live streams on it.
type backendCounters struct {
	stats   xbpf.Stats
	held    uint32
	streams uint32
}

// vipCounters reads the demo VIP's backends' counters from the pinned maps.
func vipCounters(t *testing.T, pinPath string) map[netip.AddrPort]backendCounters {
	t.Helper()
	snap, err := readSnapshot("ebpf", pinPath, true, ipvs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, xbpf.XvsMapXvsBackendHeld), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	out := map[netip.AddrPort]backendCounters{}
	for _, sv := range snap.Services {
		if sv.Address != netip.AddrPortFrom(harness.DemoVIP, 80) || sv.Protocol != "TCP" {
			continue
		}
		for _, b := range sv.Backends {
			var c xbpf.Conns
			if err := held.Lookup(b.ID, &c); err != nil {
				t.Fatal(err)
			}
			out[b.Address] = backendCounters{stats: b.Stats, held: c.Active, streams: uint32(b.ActiveConns)}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no backends of %s in the pinned maps", harness.DemoVIP)
	}
	return out
}

// waitResized waits for the restarted agent's word that it resized
// (resized matches its log line) and that its programs are attached (it
// runs), then for its sync: the old agent's maps are programmed already.
func waitResized(t *testing.T, w *harness.Single, resized string) {
	t.Helper()
	re, running := regexp.MustCompile(resized), regexp.MustCompile(`xvs agent running`)
	var log []byte
	for deadline := time.Now().Add(90 * time.Second); !re.Match(log) || !running.Match(log); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not resize (%s) and run:\n%s", resized, log)
		}
		log, _ = os.ReadFile(w.Agent.Log)
	}
	t.Logf("%s", re.Find(log))
	if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

func pinnedSize(t *testing.T, pinPath, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.MaxEntries()
}
