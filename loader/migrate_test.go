package loader

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// TestPrivMigrateNodeConfigV1: a pin path left by the previous release,
// whose xvs_node_config has the old layout, loads; the configuration
// arrives converted, not refused and not lost.
func TestPrivMigrateNodeConfigV1(t *testing.T) {
	cfg := testConfig(t, "migratetest")
	if err := EnsureBPFFS(filepath.Dir(cfg.PinPath)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.PinPath, 0o755); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "xvs_node_config", Type: ebpf.Array, KeySize: 4, ValueSize: nodeConfigV1Size, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	v := make([]byte, nodeConfigV1Size)
	copy(v[0:4], []byte{192, 168, 50, 2})
	le := binary.LittleEndian
	le.PutUint32(v[32:], uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_NETFILTER|xbpf.XvsXvsConfigFlagsXVS_CFG_DETECT_LOCAL))
	le.PutUint16(v[36:], 32768)
	le.PutUint16(v[38:], 65535)
	le.PutUint16(v[40:], 32768)
	le.PutUint16(v[42:], 60999)
	le.PutUint32(v[44:], 0x4000)
	le.PutUint64(v[48:], 0xfeedface)
	if err := old.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(cfg.PinPath, "xvs_node_config")); err != nil {
		t.Fatal(err)
	}
	old.Close()

	objs, err := Load(cfg)
	if err != nil {
		t.Fatalf("load over the old layout: %v", err)
	}
	var got xbpf.NodeConf
	if err := objs.XvsNodeConfig.Lookup(uint32(0), &got); err != nil {
		t.Fatal(err)
	}
	want := xbpf.NodeConf{
		Flags:    uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_NETFILTER | xbpf.XvsXvsConfigFlagsXVS_CFG_DETECT_LOCAL),
		MasqMark: 0x4000, NetnsCookie: 0xfeedface,
		Ports: xbpf.PortRanges(32768, 65535, 32768, 60999),
	}
	copy(want.SnatAddr4[:], []byte{192, 168, 50, 2})
	if got != want {
		t.Fatalf("migrated config\n%+v\nwant\n%+v", got, want)
	}
	if got.Ports[0].Span != 65535-61000+1 {
		t.Fatalf("masquerade range %+v: want 61000-65535", got.Ports[0])
	}
	// And the pin is the new map now: a second load reuses it as is.
	objs.Close()
	again, err := Load(cfg)
	if err != nil {
		t.Fatalf("second load: %v", err)
	}
	again.Close()
}

// TestPrivMigrateStatsArrays: counters pinned by the build that kept them
// in preallocated per-CPU arrays are replaced by the per-CPU hashes, not
// refused.
func TestPrivMigrateStatsArrays(t *testing.T) {
	cfg := testConfig(t, "migratestats")
	if err := ensurePinPath(cfg.PinPath); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{xbpf.XvsMapXvsSvcStats, xbpf.XvsMapXvsBackendStats} {
		old, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 40, MaxEntries: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Pin(filepath.Join(cfg.PinPath, name)); err != nil {
			t.Fatal(err)
		}
		old.Close()
	}
	objs, err := Load(cfg)
	if err != nil {
		t.Fatalf("load over the per-CPU arrays: %v", err)
	}
	defer objs.Close()
	for _, m := range []*ebpf.Map{objs.XvsSvcStats, objs.XvsBackendStats} {
		if m.Type() != ebpf.PerCPUHash {
			t.Fatalf("%s is a %s, want a per-CPU hash", m, m.Type())
		}
	}
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, xbpf.XvsMapXvsBackendStats), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if pinned.Type() != ebpf.PerCPUHash {
		t.Fatalf("the pin is a %s, want the new per-CPU hash", pinned.Type())
	}
}

// TestPrivMigrateVerdictsGrown: a release that adds a verdict finds the
// previous release's verdict counters pinned with one entry fewer (a size
// cilium/ebpf refuses to reuse): they are replaced, restarting from zero,
// instead of Load refusing the pin path.
func TestPrivMigrateVerdictsGrown(t *testing.T) {
	cfg := testConfig(t, "migrateverdicts")
	if err := ensurePinPath(cfg.PinPath); err != nil {
		t.Fatal(err)
	}
	want := uint32(xbpf.XvsXvsVerdictXVS_V_MAX)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: xbpf.XvsMapXvsVerdicts, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: want - 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(cfg.PinPath, xbpf.XvsMapXvsVerdicts)); err != nil {
		t.Fatal(err)
	}
	old.Close()
	objs, err := Load(cfg)
	if err != nil {
		t.Fatalf("load over the shorter verdict counters: %v", err)
	}
	defer objs.Close()
	if n := objs.XvsVerdicts.MaxEntries(); n != want {
		t.Fatalf("verdict counters of %d entries, want %d", n, want)
	}
}
