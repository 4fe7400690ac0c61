package loader

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

var updateLayouts = flag.Bool("update", false, "rewrite testdata/layouts.txt from this build")

// TestMapLayoutsKnown: the pinned maps' layouts are those of
// testdata/layouts.txt. A change to a key or value struct fails here:
// pinned maps of the previous release would be misread (Load refuses them,
// and users must run `xvs cleanup`) unless loader/migrate.go converts the
// old layout. Write that migration, then rerun with -update.
func TestMapLayoutsKnown(t *testing.T) {
	spec, err := xbpf.LoadXvs()
	if err != nil {
		t.Fatal(err)
	}
	layouts := MapLayouts(spec)
	var lines []string
	for name, l := range layouts {
		lines = append(lines, name+": "+l)
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	golden := filepath.Join("testdata", "layouts.txt")
	if *updateLayouts {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		wl := strings.Split(string(want), "\n")
		var diff []string
		for _, l := range lines {
			if !slices.Contains(wl, l) {
				diff = append(diff, "now:  "+l)
			}
		}
		for _, l := range wl {
			if l != "" && !slices.Contains(lines, l) {
				diff = append(diff, "was:  "+l)
			}
		}
		t.Fatalf("pinned map layouts changed (an agent upgraded over pinned maps would refuse them):\n%s\n"+
			"write a migration of the old layout (loader/migrate.go), then: go test ./loader -run TestMapLayoutsKnown -update",
			strings.Join(diff, "\n"))
	}
	// The description sees fields, not only sizes: two structs of one
	// size with their fields swapped differ.
	for name, l := range layouts {
		if strings.Contains(strings.ReplaceAll(l, "bytes[0]", ""), "bytes[") {
			t.Errorf("%s: %s: a map without BTF types, whose layout only its size describes", name, l)
		}
	}
}

// TestPrivLayoutChecked: Load records the layouts of the maps it pins; a
// later Load whose layout of a pinned map differs from the record (a build
// that changed a struct) refuses, names the map, and leaves every pin as it
// was; a map pinned without a record (by a build before records) is
// accepted and recorded.
func TestPrivLayoutChecked(t *testing.T) {
	cfg := testConfig(t, "layouttest")
	objs, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	objs.Close()
	rec, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, layoutsMap), nil)
	if err != nil {
		t.Fatalf("no layout record after Load: %v", err)
	}
	defer rec.Close()
	spec, err := xbpf.LoadXvs()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(MapLayouts(spec)); n == 0 || countEntries(t, rec) != n {
		t.Fatalf("%d layouts recorded, want the %d pinned maps'", countEntries(t, rec), n)
	}

	// A build with another layout of the services map wrote them.
	name := xbpf.XvsMapXvsServices
	var other layoutValue
	copy(other[:], "another build's layout")
	if err := rec.Put(keyOf(name), other); err != nil {
		t.Fatal(err)
	}
	before := pins(t, cfg.PinPath)
	_, err = Load(cfg)
	if !errors.Is(err, ErrLayoutChanged) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "xvs cleanup") {
		t.Fatalf("Load over a changed layout: %v, want ErrLayoutChanged naming %s and the way out", err, name)
	}
	if after := pins(t, cfg.PinPath); !slices.Equal(before, after) {
		t.Fatalf("the refused Load changed the pins: %v, then %v", before, after)
	}

	// Maps pinned before layouts were recorded: no record, accepted.
	if err := rec.Delete(keyOf(name)); err != nil {
		t.Fatal(err)
	}
	objs, err = Load(cfg)
	if err != nil {
		t.Fatalf("Load over maps without a record: %v", err)
	}
	objs.Close()
	var v layoutValue
	if err := rec.Lookup(keyOf(name), &v); err != nil {
		t.Fatalf("%s not recorded by the Load that accepted it: %v", name, err)
	}
}

func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var k layoutKey
	var v layoutValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// pins lists what is pinned under dir, with each pin's inode: an unpinned
// and recreated map shows as changed.
func pins(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s@%d", p, info.Sys().(*syscall.Stat_t).Ino))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
