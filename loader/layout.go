package loader

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Map layouts. cilium/ebpf reuses a pinned map when its type, flags and
// key and value sizes match the spec's: a release that reorders a value's
// fields, or gives a field another meaning at the same size, would read the
// previous release's entries wrongly and say nothing. So every pinned map's
// layout (its key and value types from BTF: every field's name, offset and
// type, recursively) is recorded beside the maps, in the pinned map
// xvs_layouts, and a Load whose layout of a pinned map differs from the
// recorded one refuses, naming the map, unless migrate.go converted that
// map first. Maps pinned before layouts were recorded are taken as they
// are (migrate.go knows their history) and recorded from then on.
// testdata/layouts.txt holds this build's layouts: a change to one fails
// TestMapLayoutsKnown until the golden file is updated, which is the moment
// to write the migration.

// layoutsMap is the name of the pinned map of recorded layouts.
const layoutsMap = "xvs_layouts"

// layoutKey is a map name, NUL-padded; layoutValue a layout's SHA-256.
type (
	layoutKey   [32]byte
	layoutValue [32]byte
)

var layoutsSpec = &ebpf.MapSpec{
	Name:       layoutsMap,
	Type:       ebpf.Hash,
	KeySize:    32,
	ValueSize:  32,
	MaxEntries: 128,
	Pinning:    ebpf.PinByName,
}

// MapLayouts describes the layout of every map of spec that is pinned, by
// name: "key <type> value <type>".
func MapLayouts(spec *ebpf.CollectionSpec) map[string]string {
	out := map[string]string{}
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		var b strings.Builder
		b.WriteString("key ")
		describe(&b, ms.Key, ms.KeySize)
		b.WriteString(" value ")
		if in := ms.InnerMap; in != nil {
			// A map of maps holds maps of this shape.
			fmt.Fprintf(&b, "map %s[%d]{key ", in.Type, in.MaxEntries)
			describe(&b, in.Key, in.KeySize)
			b.WriteString(" value ")
			describe(&b, in.Value, in.ValueSize)
			b.WriteString("}")
		} else {
			describe(&b, ms.Value, ms.ValueSize)
		}
		out[name] = b.String()
	}
	return out
}

// describe writes t's layout: what a reader of its bytes depends on.
func describe(b *strings.Builder, t btf.Type, size uint32) {
	if t == nil {
		fmt.Fprintf(b, "bytes[%d]", size)
		return
	}
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Int:
		fmt.Fprintf(b, "int%d", v.Size*8)
		if v.Encoding&btf.Signed != 0 {
			b.WriteString("s")
		}
	case *btf.Enum:
		fmt.Fprintf(b, "enum%d{", v.Size*8)
		for i, e := range v.Values {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(b, "%s=%d", e.Name, e.Value)
		}
		b.WriteString("}")
	case *btf.Array:
		fmt.Fprintf(b, "[%d]", v.Nelems)
		describe(b, v.Type, 0)
	case *btf.Struct:
		describeMembers(b, "struct", v.Size, v.Members)
	case *btf.Union:
		describeMembers(b, "union", v.Size, v.Members)
	case *btf.Pointer:
		b.WriteString("ptr")
	default:
		fmt.Fprintf(b, "%T", v)
	}
}

func describeMembers(b *strings.Builder, kind string, size uint32, ms []btf.Member) {
	fmt.Fprintf(b, "%s%d{", kind, size)
	for i, m := range ms {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(b, "%s@%d", m.Name, m.Offset)
		if m.BitfieldSize > 0 {
			fmt.Fprintf(b, ":%d", m.BitfieldSize)
		}
		b.WriteString(" ")
		describe(b, m.Type, 0)
	}
	b.WriteString("}")
}

// ErrLayoutChanged is a pinned map recorded with another layout than this
// build's.
var ErrLayoutChanged = errors.New("pinned map layout changed")

// checkLayouts compares the recorded layout of every map pinned under
// pinPath with spec's. Maps with no record (pinned before layouts were
// recorded, or not pinned yet) pass, and so do those migrate.go converts
// or replaces.
func checkLayouts(pinPath string, spec *ebpf.CollectionSpec) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, layoutsMap), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open the recorded map layouts: %w", err)
	}
	defer m.Close()
	var changed []string
	for name, layout := range MapLayouts(spec) {
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
		if err != nil {
			continue // not pinned yet (or not a map Load could reuse anyway)
		}
		size := pinned.ValueSize()
		pinned.Close()
		if slices.Contains(retyped, name) || slices.ContainsFunc(migrations, func(mg migration) bool {
			return mg.name == name && mg.from == size
		}) {
			continue // migrate.go replaces or converts it
		}
		var was layoutValue
		if err := m.Lookup(keyOf(name), &was); err != nil {
			continue // pinned before its layout was recorded
		}
		if was != sha256.Sum256([]byte(layout)) {
			changed = append(changed, name)
		}
	}
	if len(changed) > 0 {
		slices.Sort(changed)
		return fmt.Errorf("%w: %s under %s were written by a build whose entries have another layout; this build would misread them. Run the build that wrote them, or `xvs cleanup` to start afresh (open connections through xvs are dropped)",
			ErrLayoutChanged, strings.Join(changed, ", "), pinPath)
	}
	return nil
}

// recordLayouts records the layout of every map of spec pinned under
// pinPath, creating the record when there is none.
func recordLayouts(pinPath string, spec *ebpf.CollectionSpec) error {
	m, err := ebpf.NewMapWithOptions(layoutsSpec, ebpf.MapOptions{PinPath: pinPath})
	if err != nil {
		return fmt.Errorf("record map layouts: %w", err)
	}
	defer m.Close()
	for name, layout := range MapLayouts(spec) {
		if err := m.Put(keyOf(name), layoutValue(sha256.Sum256([]byte(layout)))); err != nil {
			return fmt.Errorf("record the layout of %s: %w", name, err)
		}
	}
	return nil
}

func keyOf(name string) layoutKey {
	var k layoutKey
	copy(k[:], name)
	return k
}
