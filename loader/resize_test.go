package loader

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// ctFill writes n distinct entries into m, their values derived from
// their keys.
func ctFill(t *testing.T, m *ebpf.Map, n int, tag byte) {
	t.Helper()
	keys := make([]xbpf.CtKey, n)
	vals := make([]xbpf.CtEntry, n)
	for i := range n {
		keys[i].Saddr[0], keys[i].Saddr[1], keys[i].Saddr[2], keys[i].Saddr[3] = tag, byte(i>>16), byte(i>>8), byte(i)
		keys[i].Sport, keys[i].Proto, keys[i].Family = uint16(i), 6, xbpf.FamilyIPv4
		vals[i].Expires, vals[i].BackendId, vals[i].Packets = uint64(i)<<20, uint32(i)*7, uint32(tag)
	}
	if _, err := m.BatchUpdate(keys, vals, nil); err != nil {
		t.Fatal(err)
	}
}

// ctContents reads every entry of m.
func ctContents(t *testing.T, m *ebpf.Map) map[xbpf.CtKey]xbpf.CtEntry {
	t.Helper()
	out := map[xbpf.CtKey]xbpf.CtEntry{}
	var k xbpf.CtKey
	var v xbpf.CtEntry
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// slotID is the ID of the table in slot of m's xvs_ct_tables (0: none).
func slotID(t *testing.T, tables *ebpf.Map, slot uint32) ebpf.MapID {
	t.Helper()
	var id ebpf.MapID
	if err := tables.Lookup(slot, &id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	return id
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// ctTable makes a conntrack table of size entries as the loader does,
// with the entry's BTF (Linux 6.1 puts in the slots only maps alike in it).
func ctTable(t *testing.T, size uint32) (*ebpf.Map, error) {
	t.Helper()
	spec, err := xbpf.LoadXvs()
	if err != nil {
		return nil, err
	}
	ms := spec.Maps[xbpf.XvsMapXvsConntrack].Copy()
	ms.MaxEntries, ms.Pinning = size, ebpf.PinNone
	return ebpf.NewMap(ms)
}

// TestPrivConntrackResize: a new conntrack size (up, then down) takes
// effect at the next Load with every entry kept, in the new tables the
// programs of the earlier Load use as well (they read the same slots);
// no old table stays pinned; an interrupted resize is finished by the
// next Load, and one that is pending with yet another size is refused
// with the way out.
func TestPrivConntrackResize(t *testing.T) {
	cfg := testConfig(t, "resizetest")
	cfg.ConntrackSize = 32768
	first, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	ctFill(t, first.XvsConntrack, 20000, 1)
	ctFill(t, first.XvsCtUnreplied, 3000, 2)
	want := [2]map[xbpf.CtKey]xbpf.CtEntry{ctContents(t, first.XvsConntrack), ctContents(t, first.XvsCtUnreplied)}

	for _, size := range []uint32{131072, 65536} {
		cfg.ConntrackSize = size
		objs, err := Load(cfg)
		if err != nil {
			t.Fatalf("load with %d entries: %v", size, err)
		}
		defer objs.Close()
		tables := [2]*ebpf.Map{objs.XvsConntrack, objs.XvsCtUnreplied}
		if tables[0].MaxEntries() != size || tables[1].MaxEntries() != size/4 {
			t.Fatalf("tables of %d and %d entries, want %d and %d", tables[0].MaxEntries(), tables[1].MaxEntries(), size, size/4)
		}
		for i, m := range tables {
			got := ctContents(t, m)
			if len(got) != len(want[i]) {
				t.Fatalf("%s: %d entries after the resize to %d, want %d", ctTables[i], len(got), m.MaxEntries(), len(want[i]))
			}
			for k, v := range want[i] {
				if got[k] != v {
					t.Fatalf("%s: entry %+v is %+v after the resize, want %+v", ctTables[i], k, got[k], v)
				}
			}
			// The first Load's programs read the new table too, and
			// nothing is left of the old one.
			if id := slotID(t, first.XvsCtTables, uint32(i)); id != mapID(t, m) {
				t.Fatalf("slot %d holds map %d, want the new %s (%d)", i, id, ctTables[i], mapID(t, m))
			}
			if id := slotID(t, first.XvsCtTables, uint32(i)+uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD)); id != 0 {
				t.Fatalf("old slot of %s still holds map %d", ctTables[i], id)
			}
			if _, err := os.Stat(oldTablePin(cfg.PinPath, ctTables[i])); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("old %s still pinned (%v)", ctTables[i], err)
			}
		}
		r := objs.Resized()
		if len(r) != 2 || r[0].Copied != len(want[0]) || r[1].Copied != len(want[1]) || r[0].To != size {
			t.Fatalf("resizes reported: %+v", r)
		}
	}

	// Upgraded from a build whose programs name the tables themselves (no
	// pinned xvs_ct_tables): the old tables stay in the old slots, where
	// the new programs find them, until FinishResize (the device
	// attachment's) copies them.
	if err := os.Remove(filepath.Join(cfg.PinPath, xbpf.XvsMapXvsCtTables)); err != nil {
		t.Fatal(err)
	}
	cfg.ConntrackSize = 32768
	up, err := Load(cfg)
	if err != nil {
		t.Fatalf("load after an upgrade: %v", err)
	}
	defer up.Close()
	if id := slotID(t, up.XvsCtTables, uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD)); id == 0 || len(up.Resized()) != 0 {
		t.Fatalf("upgrade: old slot %d, resizes %+v: want the old table kept until FinishResize", id, up.Resized())
	}
	if err := up.FinishResize(); err != nil {
		t.Fatal(err)
	}
	if n := len(ctContents(t, up.XvsConntrack)); n != len(want[0]) || len(up.Resized()) != 2 {
		t.Fatalf("upgrade: %d entries after FinishResize (want %d), resizes %+v", n, len(want[0]), up.Resized())
	}
	if id := slotID(t, up.XvsCtTables, uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD)); id != 0 {
		t.Fatalf("upgrade: old slot still holds %d after FinishResize", id)
	}

	// Interrupted after the rename: the next Load of the same size
	// copies the old table in.
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, xbpf.XvsMapXvsConntrack), nil)
	if err != nil {
		t.Fatal(err)
	}
	pinned.Close()
	old, err := ctTable(t, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ctFill(t, old, 500, 3)
	if err := old.Pin(oldTablePin(cfg.PinPath, xbpf.XvsMapXvsConntrack)); err != nil {
		t.Fatal(err)
	}
	old.Close()
	objs, err := Load(cfg)
	if err != nil {
		t.Fatalf("load over an interrupted resize: %v", err)
	}
	defer objs.Close()
	if n := len(ctContents(t, objs.XvsConntrack)); n != len(want[0])+500 {
		t.Fatalf("after the interrupted resize: %d entries, want %d", n, len(want[0])+500)
	}
	if _, err := os.Stat(oldTablePin(cfg.PinPath, xbpf.XvsMapXvsConntrack)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old table still pinned after the resumed resize (%v)", err)
	}

	// Pending with another size than asked now: refused, pins untouched.
	old, err = ctTable(t, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(oldTablePin(cfg.PinPath, xbpf.XvsMapXvsConntrack)); err != nil {
		t.Fatal(err)
	}
	cfg.ConntrackSize = 262144
	if _, err := Load(cfg); !errors.Is(err, ErrResizePending) || !strings.Contains(err.Error(), "start the agent once with that size") {
		t.Fatalf("load with a resize pending: %v, want the refusal", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.PinPath, xbpf.XvsMapXvsConntrack)); err != nil {
		t.Fatalf("refused load left no table pinned: %v", err)
	}
}
