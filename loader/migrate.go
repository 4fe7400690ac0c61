package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// A pinned map whose layout changed between releases cannot be reused
// (cilium/ebpf refuses it, and Load says to run `xvs cleanup`, which drops
// every connection). For maps whose old layouts are known, an upgrade
// instead converts the pinned content: the old map is read and unpinned,
// the new one created, and the converted entries written into it before
// any program of this build is attached. The programs of the old build
// keep the old map (their reference holds it) until they are replaced.
type migration struct {
	name string
	// from is the old layout's value size; convert turns one old value
	// into the new layout.
	from    uint32
	convert func(old []byte) (any, error)
}

var migrations = []migration{
	{name: xbpf.XvsMapXvsNodeConfig, from: nodeConfigV1Size, convert: nodeConfigFromV1},
}

// retyped are the counter maps whose kind or size changed between releases
// and whose content is not converted: counters restart from zero, as
// Prometheus reads a counter reset. xvs_svc_stats and xvs_backend_stats
// were preallocated per-CPU arrays of every possible ID until 2026-12;
// xvs_verdicts has an entry per verdict, and grows with a new one. The old
// pin is removed so that Load creates the new map; the Datapath then
// creates the entries of the IDs in use.
var retyped = []string{xbpf.XvsMapXvsSvcStats, xbpf.XvsMapXvsBackendStats, xbpf.XvsMapXvsVerdicts}

// dropRetyped unpins the maps of retyped pinned under pinPath with another
// type than spec's, and returns their names.
func dropRetyped(pinPath string, spec *ebpf.CollectionSpec) ([]string, error) {
	var out []string
	for _, name := range retyped {
		ms, ok := spec.Maps[name]
		if !ok {
			continue
		}
		path := filepath.Join(pinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("open pinned %s: %w", name, err)
		}
		typ, size := m.Type(), m.MaxEntries()
		m.Close()
		// A map of IDs is sized by configuration (--bpf-max-*), which
		// cilium/ebpf checks; one of verdicts by this build.
		sized := name == xbpf.XvsMapXvsVerdicts && size != ms.MaxEntries
		if typ == ms.Type && !sized {
			continue
		}
		if err := os.Remove(path); err != nil {
			return out, fmt.Errorf("unpin the old %s: %w", name, err)
		}
		out = append(out, fmt.Sprintf("%s (was %s of %d, now %s of %d)", name, typ, size, ms.Type, ms.MaxEntries))
	}
	return out, nil
}

// pendingMigration is a converted map content waiting for the new map.
type pendingMigration struct {
	name   string
	values map[uint32]any
}

// prepareMigrations reads and unpins every pinned map under pinPath whose
// layout is a known old one, and returns the converted content.
func prepareMigrations(pinPath string, spec *ebpf.CollectionSpec) ([]pendingMigration, error) {
	var out []pendingMigration
	for _, mg := range migrations {
		ms, ok := spec.Maps[mg.name]
		if !ok {
			continue
		}
		path := filepath.Join(pinPath, mg.name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned %s: %w", mg.name, err)
		}
		if m.ValueSize() == ms.ValueSize || m.ValueSize() != mg.from || m.Type() != ebpf.Array || m.KeySize() != 4 {
			m.Close() // current, or a layout this build cannot read: Load decides
			continue
		}
		p := pendingMigration{name: mg.name, values: map[uint32]any{}}
		for k := range m.MaxEntries() {
			old := make([]byte, m.ValueSize())
			if err := m.Lookup(k, &old); err != nil {
				m.Close()
				return nil, fmt.Errorf("read pinned %s[%d]: %w", mg.name, k, err)
			}
			v, err := mg.convert(old)
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("convert pinned %s[%d]: %w", mg.name, k, err)
			}
			p.values[k] = v
		}
		m.Close()
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("unpin the old %s: %w", mg.name, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// apply writes converted content into the new maps.
func (p pendingMigration) apply(o *Objects) error {
	var m *ebpf.Map
	switch p.name {
	case xbpf.XvsMapXvsNodeConfig:
		m = o.XvsNodeConfig
	default:
		return fmt.Errorf("no map %s to migrate into", p.name)
	}
	for k, v := range p.values {
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write migrated %s[%d]: %w", p.name, k, err)
		}
	}
	return nil
}

// The node configuration before the port ranges (xvs_config up to
// 2026-12): addresses, flags, the masquerade range and the skip as
// min/max pairs, the netfilter mark, the netns cookie.
const nodeConfigV1Size = 56

func nodeConfigFromV1(old []byte) (any, error) {
	if len(old) != nodeConfigV1Size {
		return nil, fmt.Errorf("value of %d bytes, want %d", len(old), nodeConfigV1Size)
	}
	le := binary.LittleEndian
	var c xbpf.NodeConf
	copy(c.SnatAddr4[:], old[0:16])
	copy(c.SnatAddr6[:], old[16:32])
	c.Flags = le.Uint32(old[32:])
	lo, hi := le.Uint16(old[36:]), le.Uint16(old[38:])
	skipLo, skipHi := le.Uint16(old[40:]), le.Uint16(old[42:])
	c.MasqMark = le.Uint32(old[44:])
	c.NetnsCookie = le.Uint64(old[48:])
	// The old skip was the ephemeral range clipped to the masquerade
	// range; the agent's first sync writes the ranges from the ephemeral
	// range itself.
	c.Ports = xbpf.PortRanges(lo, hi, skipLo, skipHi)
	return &c, nil
}
