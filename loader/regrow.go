package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	xbpf "github.com/xvs-lb/xvs/bpf"
)

// Resize of the maps sized by --bpf-max-services, --bpf-max-backends and
// --bpf-max-service-slots. The programs name these maps directly (not
// through slots, as the conntrack tables), and this build's programs are
// attached only after Load, so a new size takes effect in one restart
// without dropping a flow:
//
//  1. Load finds the map pinned with another size, checks that what it
//     holds fits the new size, and renames its pin to <name>_resizing.
//     The running programs, of the agent before, hold the map itself.
//  2. The new map is created and pinned under the name.
//  3. Every entry of the old map is copied into the new one, before the
//     agent reads the maps back (its IDs, the slots' counts) and before
//     this build's programs are attached: they see what the old ones saw,
//     and the flows' conntrack entries keep pointing at the same IDs.
//  4. Once this build's programs are attached everywhere (FinishResize),
//     what the old programs counted in between (connections held per
//     backend, the Service and backend counters) is added to the new maps
//     and the old pin is removed: the old map is freed with its last
//     reference.
//
// A map whose entries do not fit the new size (more entries than it
// takes, or IDs beyond a smaller ID space) is refused before any pin is
// touched (ErrResizeRefused): the operator keeps the size or runs
// `xvs cleanup`. An interrupted resize is finished by the next Load,
// which copies what the new map does not have yet; counts the old
// programs made after the interrupted copy are lost then.

// ErrResizeRefused is a map size too small for what the pinned map holds:
// a configuration to correct, not a kernel that cannot run the datapath.
var ErrResizeRefused = errors.New("map resize refused")

// regrown are the maps Config sizes besides the conntrack tables.
var regrown = slices.DeleteFunc(slices.Clone(sized), func(name string) bool { return slices.Contains(ctTables[:], name) })

// idKeyed are the maps whose key is an ID below their size (backend or
// Service ID): their IDs must stay below a smaller size.
var idKeyed = map[string]bool{
	xbpf.XvsMapXvsBackends: true, xbpf.XvsMapXvsBackendStats: true, xbpf.XvsMapXvsSvcStats: true,
}

// counted are the maps the programs add to, with the width of their
// counters: what the old programs add between the copy and the swap is
// carried over in step 4.
var counted = map[string]int{
	xbpf.XvsMapXvsBackendHeld: 4, xbpf.XvsMapXvsBackendStats: 8, xbpf.XvsMapXvsSvcStats: 8,
}

// MapResize reports the resize of one of the maps besides conntrack.
type MapResize struct {
	Map      string
	From, To uint32
	// Copied entries; Took is the copy's time.
	Copied int
	Took   time.Duration
}

// regrowing is a resize in progress: the old map, and the counters it held
// when they were copied.
type regrowing struct {
	name string
	old  *ebpf.Map
	snap map[string][]byte
	r    MapResize
}

// prepareRegrow checks and renames the pins of the maps pinned with
// another size than spec's (step 1). A map whose earlier resize was
// interrupted resumes it, unless its size changed once more.
func prepareRegrow(pinPath string, spec *ebpf.CollectionSpec) (moves [][2]string, err error) {
	for _, name := range regrown {
		path := filepath.Join(pinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned %s: %w", name, err)
		}
		size, want := m.MaxEntries(), spec.Maps[name].MaxEntries
		if size == want {
			m.Close()
			continue
		}
		old := oldTablePin(pinPath, name)
		if _, err := os.Stat(old); err == nil {
			m.Close()
			return nil, fmt.Errorf("%w: %s: a resize to %d entries is still to be finished (pinned %s): start the agent once with that size, then with %d",
				ErrResizePending, name, size, old, want)
		}
		err = fits(m, name, want)
		if err == nil && name == xbpf.XvsMapXvsSvcStats && want < size {
			err = serviceIDsBelow(pinPath, want)
		}
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: %s from %d to %d entries: %v (keep the size, or run `xvs cleanup` first, which drops every connection)",
				ErrResizeRefused, name, size, want, err)
		}
		moves = append(moves, [2]string{path, old})
	}
	// Only once every map is known to fit: a refusal leaves every pin.
	for i, mv := range moves {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			undoRegrow(moves[:i])
			return nil, fmt.Errorf("resize %s: %w", filepath.Base(mv[0]), err)
		}
	}
	return moves, nil
}

// undoRegrow puts the old maps' pins back when the load that was to
// resize them failed: a new map pinned meanwhile was never attached.
func undoRegrow(moves [][2]string) {
	for _, mv := range moves {
		if _, err := os.Stat(mv[1]); err != nil {
			continue
		}
		_ = os.Remove(mv[0])
		_ = os.Rename(mv[1], mv[0])
	}
}

// fits says whether m's entries fit a map of want entries: a hash map's
// count (and, keyed by ID, every key below want); an array's entries
// beyond want are dropped, unless they are counters of an ID in use,
// which the ID-keyed maps' check has ruled out.
func fits(m *ebpf.Map, name string, want uint32) error {
	if want >= m.MaxEntries() || isArray(m) {
		return nil
	}
	n := 0
	var key, next []byte
	for {
		var prev any
		if key != nil {
			prev = key
		}
		err := m.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		key, next = next, nil
		n++
		if id := binary.NativeEndian.Uint32(key); idKeyed[name] && id >= want {
			return fmt.Errorf("ID %d is in use", id)
		}
	}
	if uint32(n) > want {
		return fmt.Errorf("it holds %d entries", n)
	}
	return nil
}

// serviceIDsBelow checks that every frontend's Service ID in the pinned
// services map is below max (a smaller --bpf-max-services).
func serviceIDsBelow(pinPath string, max uint32) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, xbpf.XvsMapXvsServices), nil)
	if errors.Is(err, os.ErrNotExist) {
		m, err = ebpf.LoadPinnedMap(oldTablePin(pinPath, xbpf.XvsMapXvsServices), nil)
	}
	if err != nil {
		return fmt.Errorf("read the services map: %w", err)
	}
	defer m.Close()
	var k xbpf.SvcKey
	var v xbpf.SvcValue
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 && v.SvcId >= max {
			return fmt.Errorf("Service ID %d is in use", v.SvcId)
		}
	}
	return it.Err()
}

func isArray(m *ebpf.Map) bool {
	return m.Type() == ebpf.Array || m.Type() == ebpf.PerCPUArray
}

// regrow copies the old maps of the resizes prepareRegrow began into the
// loaded ones (step 3).
func (o *Objects) regrow() error {
	for _, name := range regrown {
		old, err := ebpf.LoadPinnedMap(oldTablePin(o.cfg.PinPath, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open the old %s: %w", name, err)
		}
		cur, err := o.mapNamed(name)
		if err != nil {
			old.Close()
			return err
		}
		g := &regrowing{name: name, old: old, r: MapResize{Map: name, From: old.MaxEntries(), To: cur.MaxEntries()}}
		start := time.Now()
		if g.r.Copied, err = copyMap(cur, old, counted[name] > 0, &g.snap); err != nil {
			old.Close()
			return fmt.Errorf("resize %s: copy: %w", name, err)
		}
		g.r.Took = time.Since(start)
		o.regrowing = append(o.regrowing, g)
	}
	return nil
}

// mapNamed is the loaded map of that name.
func (o *Objects) mapNamed(name string) (*ebpf.Map, error) {
	v := reflect.ValueOf(&o.XvsMaps).Elem()
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("ebpf") == name {
			if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("map %s is not loaded", name)
}

// copyMap writes every entry of src that dst lacks into dst (dst's own
// entries, of an interrupted resize's new programs, are kept; an array's
// zero entries are left out, and so are its indices beyond dst's end) and,
// when keep is set, snap keeps the values copied by key. A per-CPU value
// is read and written as every CPU's value; an inner map as the map.
func copyMap(dst, src *ebpf.Map, keep bool, snap *map[string][]byte) (int, error) {
	if keep {
		*snap = map[string][]byte{}
	}
	n := 0
	var key, val []byte
	var inner *ebpf.Map
	defer func() { inner.Close() }()
	it := src.Iterate()
	for {
		var ok bool
		var v any
		if src.Type() == ebpf.HashOfMaps || src.Type() == ebpf.ArrayOfMaps {
			ok = it.Next(&key, &inner)
			v = inner
		} else {
			val, v, ok = nextRaw(it, src, &key)
		}
		if !ok {
			break
		}
		if !inRange(dst, key) || (val != nil && isArray(src) && allZero(val)) {
			continue
		}
		flags := ebpf.UpdateNoExist
		if isArray(dst) {
			// An array has every key: copy over zeros only.
			have, err := lookupRaw(dst, key)
			if err != nil {
				return n, fmt.Errorf("read %s: %w", dst, err)
			}
			if !allZero(have) {
				continue
			}
			flags = ebpf.UpdateAny
		}
		switch err := dst.Update(key, v, flags); {
		case errors.Is(err, ebpf.ErrKeyExist):
			continue
		case err != nil:
			return n, fmt.Errorf("write %s: %w", dst, err)
		}
		if keep {
			(*snap)[string(key)] = slices.Clone(val)
		}
		n++
	}
	return n, it.Err()
}

func isPerCPU(m *ebpf.Map) bool {
	return m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.PerCPUArray
}

// nextRaw advances it over m and returns the entry's value as bytes (a
// per-CPU value as every CPU's side by side) and as m takes it back.
func nextRaw(it *ebpf.MapIterator, m *ebpf.Map, key *[]byte) (val []byte, v any, ok bool) {
	if isPerCPU(m) {
		var vals [][]byte
		ok = it.Next(key, &vals)
		return joined(vals), vals, ok
	}
	ok = it.Next(key, &val)
	return val, val, ok
}

// lookupRaw reads m's value for key as bytes, as nextRaw does.
func lookupRaw(m *ebpf.Map, key []byte) ([]byte, error) {
	if isPerCPU(m) {
		var vals [][]byte
		err := m.Lookup(key, &vals)
		return joined(vals), err
	}
	var val []byte
	err := m.Lookup(key, &val)
	return val, err
}

// inRange is false for an array index beyond dst's end.
func inRange(dst *ebpf.Map, key []byte) bool {
	return !isArray(dst) || binary.NativeEndian.Uint32(key) < dst.MaxEntries()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func joined(vals [][]byte) []byte {
	var out []byte
	for _, v := range vals {
		out = append(out, v...)
	}
	return out
}

// finishRegrow carries over what the old programs counted since the copy
// and frees the old maps (step 4). Called with every attached program of
// this build.
func (o *Objects) finishRegrow() error {
	for len(o.regrowing) > 0 {
		g := o.regrowing[0]
		if w := counted[g.name]; w > 0 && g.snap != nil {
			cur, err := o.mapNamed(g.name)
			if err != nil {
				return err
			}
			if err := carryCounts(cur, g.old, g.snap, w); err != nil {
				return fmt.Errorf("resize %s: carry the counts: %w", g.name, err)
			}
		}
		if err := os.Remove(oldTablePin(o.cfg.PinPath, g.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("resize %s: unpin the old map: %w", g.name, err)
		}
		g.old.Close()
		o.regrowing = o.regrowing[1:]
		o.mapsResized = append(o.mapsResized, g.r)
		slog.Info("BPF map resized without dropping a flow", "map", g.name, "from", g.r.From, "to", g.r.To,
			"copied", g.r.Copied, "took", g.r.Took)
	}
	return nil
}

// carryCounts adds to cur what old counted since snap, counter by counter
// (w bytes wide, wrapping as the programs' atomic adds do).
func carryCounts(cur, old *ebpf.Map, snap map[string][]byte, w int) error {
	var key []byte
	it := old.Iterate()
	for {
		val, v, ok := nextRaw(it, old, &key)
		if !ok {
			break
		}
		before := snap[string(key)]
		if before == nil {
			before = make([]byte, len(val))
		}
		delta := sub(val, before, w)
		if allZero(delta) || !inRange(cur, key) {
			continue
		}
		now, err := lookupRaw(cur, key)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			now = make([]byte, len(val))
		case err != nil:
			return err
		}
		sum := add(now, delta, w)
		if vals, ok := v.([][]byte); ok {
			v = split(sum, len(vals))
		} else {
			v = sum
		}
		if err := cur.Update(key, v, ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return it.Err()
}

// sub and add work counter by counter, w bytes each, in host order.
func sub(a, b []byte, w int) []byte { return wordwise(a, b, w, false) }
func add(a, b []byte, w int) []byte { return wordwise(a, b, w, true) }

func wordwise(a, b []byte, w int, plus bool) []byte {
	out := make([]byte, len(a))
	for i := 0; i+w <= len(a) && i+w <= len(b); i += w {
		switch w {
		case 4:
			x, y := binary.NativeEndian.Uint32(a[i:]), binary.NativeEndian.Uint32(b[i:])
			if !plus {
				y = -y
			}
			binary.NativeEndian.PutUint32(out[i:], x+y)
		default:
			x, y := binary.NativeEndian.Uint64(a[i:]), binary.NativeEndian.Uint64(b[i:])
			if !plus {
				y = -y
			}
			binary.NativeEndian.PutUint64(out[i:], x+y)
		}
	}
	return out
}

// split cuts b into n equal values, one per CPU.
func split(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	w := len(b) / n
	for i := range out {
		out[i] = b[i*w : (i+1)*w]
	}
	return out
}

// MapsResized reports the resizes of the maps besides conntrack done so far.
func (o *Objects) MapsResized() []MapResize { return o.mapsResized }
