// Package loader loads the xvs BPF objects, pins them under the bpffs pin
// path, attaches the tc program to the node's devices and removes it all
// again. It never logs: every failure is a wrapped error.
//
// Pinned paths (PinPath defaults to /sys/fs/bpf/xvs):
//
//	PinPath/xvs_services       service slots: (frontend, scope, slot) -> count/flags or backend ID
//	PinPath/xvs_backends       backend ID -> address, port, flags
//	PinPath/xvs_conntrack      LRU conntrack, one entry per flow direction
//	PinPath/xvs_ct_unreplied   LRU conntrack of flows without a reply yet
//	PinPath/xvs_ct_tables      the conntrack tables the programs use, by slot (resize.go)
//	PinPath/<map>_resizing     the old map of a resize to a new size, until it is copied (resize.go, regrow.go)
//	PinPath/xvs_fragments      IPv4 fragment tracking (first fragment's ports)
//	PinPath/xvs_svc_stats      per-CPU counters by service (frontend) ID
//	PinPath/xvs_backend_stats  per-CPU counters by backend ID
//	PinPath/xvs_verdicts       per-CPU counters by verdict
//	PinPath/xvs_events         drop and reject events for xvs monitor (ring buffer)
//	PinPath/xvs_monitor_*      the monitor's switch and per-CPU rate limiter
//	PinPath/progs/tc_ingress   the running tc program (for bpftool and legacy tc)
//	PinPath/links/<ifname>     the TCX link of each attached device
package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

// DefaultPinPath is where xvs keeps its pinned state.
const DefaultPinPath = "/sys/fs/bpf/xvs"

// Config sizes the maps and sets the program's load-time knobs.
type Config struct {
	// PinPath is the bpffs directory for maps, programs and links.
	PinPath string
	// MaxServiceSlots bounds the service map: one entry per frontend and
	// scope for slot 0 plus one per backend slot.
	MaxServiceSlots uint32
	// MaxServices bounds service (frontend) IDs, the size of the per-service
	// counter array.
	MaxServices uint32
	// MaxBackends bounds backend IDs.
	MaxBackends uint32
	// ConntrackSize is the number of conntrack entries (two per flow) of
	// flows that have seen a reply; flows that have not live in a table a
	// quarter of its size (at least 4096 entries), so that they can never
	// evict an established flow.
	ConntrackSize uint32
	// Timeouts are the conntrack timeouts kube-proxy's configuration
	// sets (conntrack.*); zero fields keep the programs' defaults.
	Timeouts CTTimeouts
	// DisableRevNAT is a fault-injection knob for conformance tests that
	// show a broken datapath gets caught. Never set it in production.
	DisableRevNAT bool
}

// CTTimeouts are the conntrack timeouts of KubeProxyConfiguration's
// conntrack section, which xvs applies to its own conntrack (defaults: 24h,
// 1h, 30s, 120s, as kube-proxy and netfilter have them).
type CTTimeouts struct {
	TCPEstablished, TCPCloseWait, UDP, UDPStream time.Duration
}

// unrepliedSize is the size of the unreplied-flow table: a quarter of the
// established one, and at least 4096 entries (2048 flows).
func (c Config) unrepliedSize() uint32 {
	return max(c.ConntrackSize/4, 4096)
}

// DefaultConfig returns sizes fit for a node with tens of thousands of
// Services.
func DefaultConfig() Config {
	return Config{
		PinPath:         DefaultPinPath,
		MaxServiceSlots: 1 << 18,
		MaxServices:     1 << 16,
		MaxBackends:     1 << 18,
		ConntrackSize:   1 << 19,
	}
}

func (c Config) validate() error {
	if c.PinPath == "" {
		return errors.New("pin path is empty")
	}
	for name, v := range map[string]uint32{
		"max service slots": c.MaxServiceSlots, "max services": c.MaxServices,
		"max backends": c.MaxBackends, "conntrack size": c.ConntrackSize,
	} {
		if v < 2 {
			return fmt.Errorf("%s must be at least 2, got %d", name, v)
		}
	}
	return nil
}

// Objects are the loaded programs and maps. The programs only some nodes
// need stay nil until first used (lazyPrograms): the XDP program (XvsXdp)
// until a device gets the XDP fast path, the programs for devices without a
// link-layer header (XvsTcIngressL3, XvsTcEgressL3) until such a device is
// attached. Each costs the verifier as much as the tc program, seconds on a
// small node, and most nodes have neither.
type Objects struct {
	xbpf.XvsObjects
	cfg Config
	// spec is what was loaded (sizes and knobs set), for the L3 programs.
	spec *ebpf.CollectionSpec
	opts ebpf.CollectionOptions
	// lazyMu serializes loadLazy and FinishResize.
	lazyMu sync.Mutex
	// resizing are the old conntrack tables of a resize not finished
	// yet, by slot; resized the resizes done (resize.go).
	resizing [len(ctTables)]*ebpf.Map
	resized  []Resize
	// regrowing are the other maps' resizes not finished yet, mapsResized
	// those done (regrow.go).
	regrowing   []*regrowing
	mapsResized []MapResize
	// watch is WatchDevices' watch, for DeviceBacklog.
	watchMu sync.Mutex
	watch   *deviceWatch
}

// Close releases the objects (the pinned ones stay pinned).
func (o *Objects) Close() error {
	for _, g := range o.regrowing {
		g.old.Close()
	}
	o.regrowing = nil
	for i, m := range o.resizing {
		if m != nil {
			m.Close()
			o.resizing[i] = nil
		}
	}
	return o.XvsObjects.Close()
}

// The groups of programs loaded on first use (loadLazy).
var (
	l3Programs  = []string{"xvs_tc_ingress_l3", "xvs_tc_egress_l3"}
	xdpPrograms = []string{"xvs_xdp"}
	// toolPrograms are never the agent's: xvs explain loads them over
	// copies of the maps (maps.Explainer).
	toolPrograms = []string{"xvs_explain_sock"}
	// lazyPrograms are every group's, and the tools'.
	lazyPrograms = slices.Concat(l3Programs, xdpPrograms, toolPrograms)
)

// Load loads the BPF objects, reusing maps already pinned at cfg.PinPath so
// that services, backends and conntrack survive agent restarts and program
// upgrades. A pinned map of another size than cfg's is resized without
// dropping a flow (resize.go for conntrack, regrow.go for the others); a
// pinned map in an old layout this build knows is converted (migrate.go);
// one whose layout no longer matches otherwise is an error:
// the operator decides (xvs cleanup) rather than the agent silently
// dropping every connection.
func Load(cfg Config) (_ *Objects, err error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("loader config: %w", err)
	}
	if err := ensurePinPath(cfg.PinPath); err != nil {
		return nil, err
	}
	spec, err := xbpf.LoadXvs()
	if err != nil {
		return nil, fmt.Errorf("load spec: %w", err)
	}
	if err := configure(spec, cfg); err != nil {
		return nil, err
	}

	// Before anything is converted or unpinned: a refusal leaves the pins
	// as they were.
	if err := checkLayouts(cfg.PinPath, spec); err != nil {
		return nil, err
	}
	pending, err := prepareMigrations(cfg.PinPath, spec)
	if err != nil {
		return nil, fmt.Errorf("migrate pinned maps: %w", err)
	}
	slotsShared, err := prepareResize(cfg.PinPath, spec)
	if err != nil {
		return nil, err
	}
	regrowing, err := prepareRegrow(cfg.PinPath, spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			// A load that fails leaves the pins as they were: the maps
			// it was to resize stay the running programs'.
			undoRegrow(regrowing)
		}
	}()
	dropped, err := dropRetyped(cfg.PinPath, spec)
	for _, d := range dropped {
		slog.Warn("pinned map of an older build replaced; its counters start again from zero", "map", d)
	}
	if err != nil {
		return nil, fmt.Errorf("migrate pinned maps: %w", err)
	}
	objs := Objects{spec: spec, opts: ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinPath}}}
	if err := objs.loadEager(); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load programs: %+v", verr)
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("pinned maps under %s do not match this build (run `xvs cleanup` to start afresh): %w", cfg.PinPath, err)
		}
		if name, size, ok := oversized(spec, err); ok {
			return nil, fmt.Errorf("%w: the kernel cannot create %s with %d entries (%v): choose a smaller --bpf-* size", ErrMapSize, name, size, err)
		}
		return nil, fmt.Errorf("load objects: %w", err)
	}
	objs.cfg = cfg
	if err := objs.fillCTSlots(slotsShared); err != nil {
		objs.Close()
		return nil, err
	}
	if err := objs.regrow(); err != nil {
		objs.Close()
		return nil, err
	}
	for _, p := range pending {
		if err := p.apply(&objs); err != nil {
			objs.Close()
			return nil, err
		}
	}
	if err := objs.pinProgram(); err != nil {
		objs.Close()
		return nil, err
	}
	if err := recordLayouts(cfg.PinPath, spec); err != nil {
		objs.Close()
		return nil, err
	}
	return &objs, nil
}

// ErrMapSize is a map the configuration sizes beyond what the kernel
// creates (E2BIG, or ENOMEM for a table allocated up front): a size to
// correct, not a kernel that cannot run the datapath.
var ErrMapSize = errors.New("map too large")

// oversized reports the map, of those configure sizes, whose creation
// failed for its size in a load error.
func oversized(spec *ebpf.CollectionSpec, err error) (string, uint32, bool) {
	if !errors.Is(err, unix.E2BIG) && !errors.Is(err, unix.ENOMEM) {
		return "", 0, false
	}
	for _, name := range sized {
		// cilium/ebpf names the map it could not create ("map NAME: ...").
		if strings.Contains(err.Error(), "map "+name+":") {
			return name, spec.Maps[name].MaxEntries, true
		}
	}
	return "", 0, false
}

// mapSizes are the sizes of the maps Config sizes, by name.
func mapSizes(cfg Config) map[string]uint32 {
	return map[string]uint32{
		xbpf.XvsMapXvsServices:      cfg.MaxServiceSlots,
		xbpf.XvsMapXvsBackends:      cfg.MaxBackends,
		xbpf.XvsMapXvsBackendStats:  cfg.MaxBackends,
		xbpf.XvsMapXvsSvcStats:      cfg.MaxServices,
		xbpf.XvsMapXvsConntrack:     cfg.ConntrackSize,
		xbpf.XvsMapXvsCtUnreplied:   cfg.unrepliedSize(),
		xbpf.XvsMapXvsSchedTables:   cfg.MaxServices * 2,
		xbpf.XvsMapXvsRrCursors:     cfg.MaxServices * 2,
		xbpf.XvsMapXvsBackendHeld:   cfg.MaxBackends,
		xbpf.XvsMapXvsBackendReaped: cfg.MaxBackends,
		xbpf.XvsMapXvsMembers:       cfg.MaxServiceSlots,
		xbpf.XvsMapXvsSourceRanges:  cfg.MaxServices,
		xbpf.XvsMapXvsClusterIps:    cfg.MaxServices,
	}
}

// sized are the names of the maps Config sizes, in name order.
var sized = slices.Sorted(maps.Keys(mapSizes(DefaultConfig())))

// configure sizes spec's maps and sets its load-time constants from cfg.
func configure(spec *ebpf.CollectionSpec, cfg Config) error {
	for name, size := range mapSizes(cfg) {
		spec.Maps[name].MaxEntries = size
	}
	for name, d := range map[string]time.Duration{
		xbpf.XvsVarCfgCtTcpEstablishedS: cfg.Timeouts.TCPEstablished,
		xbpf.XvsVarCfgCtTcpCloseWaitS:   cfg.Timeouts.TCPCloseWait,
		xbpf.XvsVarCfgCtUdpS:            cfg.Timeouts.UDP,
		xbpf.XvsVarCfgCtUdpStreamS:      cfg.Timeouts.UDPStream,
	} {
		if d <= 0 {
			continue
		}
		if err := spec.Variables[name].Set(uint32(max(d/time.Second, 1))); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if cfg.DisableRevNAT {
		if err := spec.Variables[xbpf.XvsVarCfgRevNat].Set(uint8(0)); err != nil {
			return fmt.Errorf("set rev nat knob: %w", err)
		}
	}
	return nil
}

// loadEager loads the maps and every program but the lazy ones, and assigns
// them to o.XvsObjects by their names.
func (o *Objects) loadEager() error {
	s := o.spec.Copy()
	for _, name := range lazyPrograms {
		delete(s.Programs, name)
	}
	coll, err := ebpf.NewCollectionWithOptions(s, o.opts)
	if err != nil {
		return err
	}
	defer coll.Close()
	return assignByName(coll, &o.XvsMaps, &o.XvsPrograms)
}

// assignByName moves the collection's maps and programs into the fields
// (tagged `ebpf:"name"`) of the structs that have them; fields without one in
// the collection stay as they are.
func assignByName(coll *ebpf.Collection, dsts ...any) error {
	for _, dst := range dsts {
		v := reflect.ValueOf(dst).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Tag.Get("ebpf")
			switch f := v.Field(i); f.Interface().(type) {
			case *ebpf.Map:
				if m := coll.DetachMap(name); m != nil {
					f.Set(reflect.ValueOf(m))
				}
			case *ebpf.Program:
				if p := coll.DetachProgram(name); p != nil {
					f.Set(reflect.ValueOf(p))
				}
			default:
				return fmt.Errorf("assign %s: unexpected field type %s", name, f.Type())
			}
		}
	}
	return nil
}

// loadLazy loads the named programs once, sharing every map of the loaded
// objects, and assigns them to o.XvsPrograms. what names them in errors.
func (o *Objects) loadLazy(what string, names []string) error {
	o.lazyMu.Lock()
	defer o.lazyMu.Unlock()
	if o.loaded(names) {
		return nil
	}
	s := o.spec.Copy()
	for name := range s.Programs {
		if !slices.Contains(names, name) {
			delete(s.Programs, name)
		}
	}
	opts := o.opts
	opts.MapReplacements = map[string]*ebpf.Map{}
	v := reflect.ValueOf(&o.XvsMaps).Elem()
	for i := range v.NumField() {
		if m, _ := v.Field(i).Interface().(*ebpf.Map); m != nil {
			opts.MapReplacements[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(s, opts)
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("load %s: %+v", what, verr)
		}
		return fmt.Errorf("load %s: %w", what, err)
	}
	defer coll.Close()
	return assignByName(coll, &o.XvsPrograms)
}

// loaded reports whether every named program is loaded.
func (o *Objects) loaded(names []string) bool {
	v := reflect.ValueOf(&o.XvsPrograms).Elem()
	for i := range v.NumField() {
		if slices.Contains(names, v.Type().Field(i).Tag.Get("ebpf")) && v.Field(i).IsNil() {
			return false
		}
	}
	return true
}

// XDPProgram is the XDP program, loaded on first use (ErrXDPUnsupported
// where the kernel cannot run it).
func (o *Objects) XDPProgram() (*ebpf.Program, error) {
	if err := XDPSupported(); err != nil {
		return nil, err
	}
	if err := o.loadLazy("the XDP program", xdpPrograms); err != nil {
		return nil, err
	}
	return o.XvsXdp, nil
}

// pinProgram replaces the pinned program with the one just loaded, so that
// bpftool and legacy tc always see the running version.
func (o *Objects) pinProgram() error {
	dir := filepath.Join(o.cfg.PinPath, "progs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, "tc_ingress")
	tmp := path + "_new" // bpffs reserves names with dots
	_ = os.Remove(tmp)
	if err := o.XvsTcIngress.Pin(tmp); err != nil {
		return fmt.Errorf("pin program: %w", err)
	}
	// rename(2) on bpffs is atomic, so the path never goes missing.
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pin program: %w", err)
	}
	return nil
}

// Config returns the configuration the objects were loaded with.
func (o *Objects) Config() Config { return o.cfg }

// ensurePinPath creates the pin directory, on a bpffs mounted at its
// parent if none is there yet.
func ensurePinPath(path string) error {
	if err := EnsureBPFFS(filepath.Dir(path)); err != nil {
		return err
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("create pin path: %w", err)
	}
	return nil
}

// EnsureBPFFS mounts bpffs at dir unless one is already there.
func EnsureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
