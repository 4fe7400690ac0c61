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

func newTestMap(t *testing.T, typ ebpf.MapType, key, value, max uint32) *ebpf.Map {
	t.Helper()
	spec := &ebpf.MapSpec{Type: typ, KeySize: key, ValueSize: value, MaxEntries: max}
	if typ == ebpf.Hash || typ == ebpf.PerCPUHash {
		spec.Flags = 1 // BPF_F_NO_PREALLOC, as the agent's
	}
	m, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestPrivRegrowCopyAndCarry: a resize copies an array's non-zero
// entries that the new size has room for, a per-CPU hash's every entry,
// and keeps what the new map has already; then what the old programs
// counted after the copy is added, per counter and per CPU, and entries
// counted for the first time appear.
func TestPrivRegrowCopyAndCarry(t *testing.T) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}

	// The held connections: an array shrinking from 64 to 16 entries.
	old := newTestMap(t, ebpf.Array, 4, 8, 64)
	cur := newTestMap(t, ebpf.Array, 4, 8, 16)
	for id, c := range map[uint32]xbpf.Conns{1: {Active: 3}, 5: {Active: 1, Inactive: 2}, 40: {Active: 9}} {
		if err := old.Put(id, c); err != nil {
			t.Fatal(err)
		}
	}
	// An interrupted resize's new programs counted ID 5 already.
	if err := cur.Put(uint32(5), xbpf.Conns{Active: 7}); err != nil {
		t.Fatal(err)
	}
	var snap map[string][]byte
	n, err := copyMap(cur, old, true, &snap)
	if err != nil || n != 1 {
		t.Fatalf("copy: %d entries, %v; want 1 (ID 1; ID 5 kept, ID 40 beyond the end)", n, err)
	}
	// The old programs go on: a connection opens on 1, one ends on 5,
	// one opens on 3. Each entry ends as what the new programs counted
	// plus all the old map holds: ID 5, never copied, gets the old
	// count whole.
	for id, c := range map[uint32]xbpf.Conns{1: {Active: 4}, 5: {Active: 0, Inactive: 2}, 3: {Active: 1}} {
		if err := old.Put(id, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := carryCounts(cur, old, snap, 4); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint32]xbpf.Conns{1: {Active: 4}, 3: {Active: 1}, 5: {Active: 7, Inactive: 2}} {
		var got xbpf.Conns
		if err := cur.Lookup(id, &got); err != nil {
			t.Fatal(err)
		}
		if got.Active != want.Active || got.Inactive != want.Inactive {
			t.Errorf("ID %d: %+v, want %+v", id, got, want)
		}
	}

	// The counters: a per-CPU hash.
	oldStats := newTestMap(t, ebpf.PerCPUHash, 4, 40, 64)
	curStats := newTestMap(t, ebpf.PerCPUHash, 4, 40, 128)
	perCPU := func(v uint64) []xbpf.Stats {
		s := make([]xbpf.Stats, ncpu)
		for i := range s {
			s[i] = xbpf.Stats{Conns: v, PacketsIn: v * 10, BytesIn: v * 1000}
		}
		return s
	}
	for id := range uint32(10) {
		if err := oldStats.Put(id, perCPU(uint64(id))); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := copyMap(curStats, oldStats, true, &snap); err != nil || n != 10 {
		t.Fatalf("copy the counters: %d, %v", n, err)
	}
	if err := oldStats.Put(uint32(2), perCPU(5)); err != nil { // 3 more on every CPU
		t.Fatal(err)
	}
	if err := oldStats.Put(uint32(20), perCPU(4)); err != nil { // first counted after the copy
		t.Fatal(err)
	}
	if err := carryCounts(curStats, oldStats, snap, 8); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint32]uint64{0: 0, 2: 5, 7: 7, 20: 4} {
		var got []xbpf.Stats
		if err := curStats.Lookup(id, &got); err != nil {
			t.Fatalf("ID %d: %v", id, err)
		}
		for cpu, s := range got {
			if s.Conns != want || s.PacketsIn != want*10 || s.BytesIn != want*1000 {
				t.Errorf("ID %d CPU %d: %+v, want %d connections", id, cpu, s, want)
			}
		}
	}
}

// TestPrivRegrowInnerMaps: a hash of maps (the weighted schedulers'
// tables) is copied as the maps themselves: the new outer map holds the
// same inner maps, whose contents the programs go on reading.
func TestPrivRegrowInnerMaps(t *testing.T) {
	inner := &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 8}
	outer := func(max uint32) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.HashOfMaps, KeySize: 8, ValueSize: 4, MaxEntries: max, InnerMap: inner})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	old, cur := outer(4), outer(16)
	ids := map[uint64]ebpf.MapID{}
	for k := range uint64(3) {
		m, err := ebpf.NewMap(inner)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Put(uint32(1), uint32(100+k)); err != nil {
			t.Fatal(err)
		}
		if err := old.Put(k, m); err != nil {
			t.Fatal(err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids[k], _ = info.ID()
		m.Close()
	}
	if n, err := copyMap(cur, old, false, nil); err != nil || n != 3 {
		t.Fatalf("copy: %d, %v", n, err)
	}
	for k, id := range ids {
		var m *ebpf.Map
		if err := cur.Lookup(k, &m); err != nil {
			t.Fatalf("key %d: %v", k, err)
		}
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		var v uint32
		err = m.Lookup(uint32(1), &v)
		m.Close()
		if got, _ := info.ID(); got != id || err != nil || v != uint32(100+k) {
			t.Errorf("key %d: map %d (%v, value %d), want map %d with %d", k, got, err, v, id, 100+k)
		}
	}
}

// TestPrivRegrowFits: a hash map shrinks only to a size that holds its
// entries, an ID-keyed one only below its IDs; an array always (its
// entries beyond the end are IDs the ID-keyed maps vouch for).
func TestPrivRegrowFits(t *testing.T) {
	h := newTestMap(t, ebpf.Hash, 4, 8, 64)
	for _, id := range []uint32{3, 9, 30} {
		if err := h.Put(id, uint64(id)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		want uint32
		ok   bool
	}{
		{xbpf.XvsMapXvsMembers, 3, true},
		{xbpf.XvsMapXvsMembers, 2, false},
		{xbpf.XvsMapXvsBackends, 31, true},
		{xbpf.XvsMapXvsBackends, 30, false},
		{xbpf.XvsMapXvsBackends, 128, true},
	} {
		if err := fits(h, c.name, c.want); (err == nil) != c.ok {
			t.Errorf("%s of 3 entries (IDs 3, 9, 30) into %d: %v, want ok %v", c.name, c.want, err, c.ok)
		}
	}
	a := newTestMap(t, ebpf.Array, 4, 8, 64)
	if err := a.Put(uint32(60), uint64(1)); err != nil {
		t.Fatal(err)
	}
	if err := fits(a, xbpf.XvsMapXvsBackendHeld, 8); err != nil {
		t.Errorf("array: %v", err)
	}
}

// TestPrivLoadTooLarge: a size the kernel cannot create is ErrMapSize (a
// configuration error, which the agent does not answer by falling back
// to IPVS and removing the maps), naming the map; the pinned maps stay
// as they were, and the next load with a size that works resizes them.
func TestPrivLoadTooLarge(t *testing.T) {
	cfg := testConfig(t, "toolarge")
	cfg.MaxServiceSlots = 4096
	first, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.XvsServices.Put(xbpf.SvcKey{Port: 80, Proto: 6, Family: xbpf.FamilyIPv4}, xbpf.SvcValue{SvcId: 7, Count: 1}); err != nil {
		t.Fatal(err)
	}
	first.Close()

	cfg.MaxServiceSlots = 1 << 31
	if objs, err := Load(cfg); err == nil {
		objs.Close()
		t.Fatal("a 2^31-entry services map loaded")
	} else if !errors.Is(err, ErrMapSize) || !strings.Contains(err.Error(), "xvs_") {
		t.Fatalf("load with 2^31 service slots: %v, want ErrMapSize naming the map", err)
	}
	for _, name := range []string{xbpf.XvsMapXvsServices, xbpf.XvsMapXvsMembers} {
		if _, err := os.Stat(oldTablePin(cfg.PinPath, name)); !os.IsNotExist(err) {
			t.Errorf("%s left renamed for a resize that failed (%v)", name, err)
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() != 4096 {
			t.Errorf("%s pinned with %d entries after the failed load, want 4096", name, m.MaxEntries())
		}
		m.Close()
	}

	cfg.MaxServiceSlots = 8192
	objs, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	var v xbpf.SvcValue
	if err := objs.XvsServices.Lookup(xbpf.SvcKey{Port: 80, Proto: 6, Family: xbpf.FamilyIPv4}, &v); err != nil || v.SvcId != 7 {
		t.Fatalf("the entry after the resize: %+v, %v", v, err)
	}
}
