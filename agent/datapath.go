package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/pflag"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// Proxy modes (KubeProxyConfiguration mode, --proxy-mode).
const (
	modeEBPF = string(model.ModeEBPF)
	modeIPVS = string(model.ModeIPVS)
)

// Netfilter modes of the ebpf datapath (--netfilter-mode).
const (
	netfilterPass   = "pass"
	netfilterBypass = "bypass"
)

// envFailBPFLoad is the fault-injection knob that makes the BPF load fail,
// for the fallback tests; only binaries with config.DebugSwitches read it.
const envFailBPFLoad = "XVS_DEBUG_FAIL_BPF_LOAD"

// modeFlags select and configure the datapath: xvs's own flags (register)
// and, from the resolved configuration (Options.Complete), the mode and
// kube-proxy's ipvs.* settings.
type modeFlags struct {
	proxyMode      string
	fallback       string
	ipvsStrictARP  bool
	ipvsExclude    string
	ipvsTCP        time.Duration
	ipvsTCPFin     time.Duration
	ipvsUDP        time.Duration
	ipvsStateFile  string
	ipvsDrain      time.Duration
	ipvsNoRules    bool
	eventFile      string
	debugFailBPF   bool
	ipvsDeviceName string
	// ebpf mode's own.
	masqPorts  string
	netfilter  string
	masqAddrs  string
	maglevSize uint
	lockWait   time.Duration
	adopt      bool
	mapSizes   loader.Config // the Max* and ConntrackSize fields
	timeouts   loader.CTTimeouts
}

func (f *modeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.fallback, "fallback", "", "mode to serve with when the BPF datapath cannot load on this kernel: '' (none: fail) or ipvs")
	fs.StringVar(&f.ipvsStateFile, "ipvs-state-file", "", "ipvs mode: record of the virtual servers xvs created (default /run/xvs/ipvs-state-<netns>.json)")
	fs.DurationVar(&f.ipvsDrain, "ipvs-drain-interval", ipvs.DefaultDrainInterval, "ipvs mode: how often removed TCP real servers are checked for remaining connections")
	fs.StringVar(&f.ipvsDeviceName, "ipvs-device", ipvs.DefaultDevice, "ipvs mode: dummy interface holding the VIPs")
	fs.BoolVar(&f.ipvsNoRules, "ipvs-no-rules", false, "ipvs mode: do not install the nftables masquerade and filter rules")
	fs.StringVar(&f.eventFile, "event-file", "", "also append the Node Events xvs emits to this file, one JSON object per line")
	fs.StringVar(&f.masqAddrs, "masquerade-address", "", "ebpf mode: comma-separated addresses (one per family) masqueraded connections leave from, instead of the egress interface's primary address")
	fs.StringVar(&f.masqPorts, "masquerade-port-range", "", fmt.Sprintf("ebpf mode: source ports of masqueraded connections (default: %d-%d with --netfilter-mode=pass, where they must not hold a NodePort; %d-%d with bypass, where the node's ephemeral range, net.ipv4.ip_local_port_range, is skipped)", loader.DefaultNetfilterPortMin, loader.DefaultNetfilterPortMax, reconcile.DefaultSNATPortMin, reconcile.DefaultSNATPortMax))
	fs.StringVar(&f.netfilter, "netfilter-mode", netfilterPass, "ebpf mode: pass (Service traffic, once translated, goes through the node's routing and netfilter FORWARD/INPUT/POSTROUTING hooks, and netfilter masquerades it by kube-proxy's mark 0x4000) or bypass (the programs forward and masquerade it themselves, past netfilter: faster, but the node's firewall and NetworkPolicy rules never see it); see docs/nodes.md")
	fs.UintVar(&f.maglevSize, "maglev-table-size", reconcile.DefaultMaglevSize, "ebpf mode: Maglev (mh) lookup table size, a prime")
	fs.DurationVar(&f.lockWait, "pin-lock-wait", 60*time.Second, "ebpf mode: how long a starting agent waits for another process holding the --pin-path lock (an agent still exiting) before it gives up; one agent per pin path")
	fs.BoolVar(&f.adopt, "adopt-connections", true, "ebpf mode: after the first sync, take over the connections kube-proxy (IPVS with net.ipv4.vs.conntrack=1, iptables or nftables) translated to the Services xvs now serves, from netfilter's conntrack, so that they carry on through xvs on the same backend (docs/migration.md)")
	def := loader.DefaultConfig()
	f.mapSizes = def
	fs.Func("bpf-max-services", fmt.Sprintf("ebpf mode: most frontends (Service address:port:protocol), sizing the per-frontend maps (default %d)", def.MaxServices), uint32Flag(&f.mapSizes.MaxServices))
	fs.Func("bpf-max-backends", fmt.Sprintf("ebpf mode: most distinct backends (endpoint address:port:protocol) (default %d)", def.MaxBackends), uint32Flag(&f.mapSizes.MaxBackends))
	fs.Func("bpf-max-service-slots", fmt.Sprintf("ebpf mode: service map entries: one per frontend plus one per endpoint of each (default %d)", def.MaxServiceSlots), uint32Flag(&f.mapSizes.MaxServiceSlots))
	fs.Func("bpf-conntrack-size", fmt.Sprintf("ebpf mode: conntrack entries, two per flow (default %d)", def.ConntrackSize), uint32Flag(&f.mapSizes.ConntrackSize))
	if config.DebugSwitches() {
		fs.BoolVar(&f.debugFailBPF, "debug-fail-bpf-load", false, "fault injection for the fallback tests: fail the BPF load (also "+envFailBPFLoad+"=1)")
	}
}

func (f *modeFlags) validate() error {
	if _, ok := model.ParseMode(f.proxyMode); !ok {
		return fmt.Errorf("--proxy-mode %q: want ebpf or ipvs", f.proxyMode)
	}
	switch f.netfilter {
	case netfilterPass, netfilterBypass:
	default:
		return fmt.Errorf("--netfilter-mode %q: want %s or %s", f.netfilter, netfilterPass, netfilterBypass)
	}
	switch f.fallback {
	case "", modeIPVS:
	default:
		return fmt.Errorf("--fallback %q: want '' or ipvs", f.fallback)
	}
	return nil
}

func (f *modeFlags) ipvsConfig(scheduler string, log *slog.Logger) (ipvs.Config, error) {
	excl, err := config.ParseCIDRs(f.ipvsExclude)
	if err != nil {
		return ipvs.Config{}, fmt.Errorf("--ipvs-exclude-cidrs: %w", err)
	}
	return ipvs.Config{
		Scheduler: scheduler, StrictARP: f.ipvsStrictARP, ExcludeCIDRs: excl,
		TCPTimeout: f.ipvsTCP, TCPFinTimeout: f.ipvsTCPFin, UDPTimeout: f.ipvsUDP,
		Device: f.ipvsDeviceName, StateFile: f.ipvsStateFile, DrainInterval: f.ipvsDrain,
		NoRules: f.ipvsNoRules, Log: log.With("datapath", modeIPVS),
	}, nil
}

// nodeEvents emits Events about this node. Without an API client the
// agent logs them and, with --event-file, appends them as core/v1 Event
// shaped JSON; an API-backed sink can be put in front (seam for the
// Kubernetes source).
type nodeEvents struct {
	node string
	file string
	log  *slog.Logger
	// api, when set, posts the Event to the API server.
	api func(eventType, reason, message string) error
}

// EventRecord is an --event-file line: the fields of a core/v1 Event that
// matter here.
type EventRecord struct {
	InvolvedObject struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
	} `json:"involvedObject"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Source  string    `json:"source"`
	Time    time.Time `json:"time"`
}

func (e *nodeEvents) emit(eventType, reason, message string) {
	e.log.Info("node event", "type", eventType, "reason", reason, "message", message, "node", e.node)
	if e.api != nil {
		if err := e.api(eventType, reason, message); err != nil {
			e.log.Warn("post node event", "err", err)
		}
	}
	if e.file == "" {
		return
	}
	var r EventRecord
	r.InvolvedObject.Kind, r.InvolvedObject.Name = "Node", e.node
	r.Type, r.Reason, r.Message, r.Source, r.Time = eventType, reason, message, "xvs", time.Now().UTC()
	b, _ := json.Marshal(r)
	fh, err := os.OpenFile(e.file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		e.log.Warn("event file", "err", err)
		return
	}
	defer fh.Close()
	if _, err := fh.Write(append(b, '\n')); err != nil {
		e.log.Warn("event file", "err", err)
	}
}

// Datapath is what the agent needs of either mode's datapath: the model's
// Sync and Close, and the inputs it could not program, for Events and
// xvs_problems. What only one mode has is found by type assertion on the
// optional interfaces below.
type Datapath interface {
	model.Datapath
	Problems() []string
}

// Optional capabilities of a Datapath.
type (
	// fullSyncForcer rewrites every entry on its next Sync (after a
	// failed one, and periodically).
	fullSyncForcer interface{ ForceFullSync() }
	// staleFlowCounter counts the flows to removed UDP endpoints it
	// deleted, by family (the conntrack reconciler's counter).
	staleFlowCounter interface{ StaleFlowsDeleted() [2]uint64 }
	// conntrackOccupancy reports each conntrack table's entries and
	// capacity.
	conntrackOccupancy interface {
		ConntrackOccupancy() map[string][2]uint64
	}
	// serviceProblems are the Problems by the ServicePort they are about.
	serviceProblems interface {
		ServiceProblems() map[model.ServicePortName][]string
	}
	// mapOccupancy reports the fill and size of the maps the datapath
	// accounts for, by map name.
	mapOccupancy interface{ MapOccupancy() map[string][2]uint64 }
	// recoveredDatapath tells how many frontends it found programmed when
	// it started (the first-sync guard).
	recoveredDatapath interface{ RecoveredFrontends() int }
	// conntrackReconciler times the last sync's deletion of removed UDP
	// (and SCTP) endpoints' flows.
	conntrackReconciler interface{ ConntrackReconcileTime() time.Duration }
	// ruleWriter counts failed writes of its netfilter rules.
	ruleWriter interface{ RuleWriteFailures() uint64 }
)

// Both modes' datapaths are Datapaths, with the optional capabilities
// each has.
var (
	_ Datapath            = (*ipvs.Datapath)(nil)
	_ Datapath            = (*reconcile.Datapath)(nil)
	_ fullSyncForcer      = (*reconcile.Datapath)(nil)
	_ staleFlowCounter    = (*reconcile.Datapath)(nil)
	_ conntrackOccupancy  = (*reconcile.Datapath)(nil)
	_ mapOccupancy        = (*reconcile.Datapath)(nil)
	_ serviceProblems     = (*reconcile.Datapath)(nil)
	_ recoveredDatapath   = (*reconcile.Datapath)(nil)
	_ conntrackReconciler = (*reconcile.Datapath)(nil)
	_ conntrackReconciler = (*ipvs.Datapath)(nil)
	_ ruleWriter          = (*ipvs.Datapath)(nil)
)

// activeDatapath is the datapath the agent runs with.
type activeDatapath struct {
	dp Datapath
	// objs is set in ebpf mode: the loaded programs, to attach to devices.
	objs  *loader.Objects
	close func()
}

// startDatapath brings up the datapath of --proxy-mode, falling back to
// IPVS when the BPF datapath cannot load and --fallback=ipvs. Whichever
// mode runs, the other mode's state is removed: a stale tc program would
// take packets before IPVS sees them, and stale virtual servers and VIPs
// would answer for Services the BPF datapath serves.
func startDatapath(log *slog.Logger, f settings, ev *nodeEvents, m *xmetrics.Metrics) (*activeDatapath, error) {
	mf := f.mode
	icfg, err := mf.ipvsConfig(f.scheduler, log)
	if err != nil {
		return nil, err
	}
	if mf.proxyMode == modeIPVS {
		return startIPVS(log, f, icfg, m)
	}
	a, bpfErr := startEBPF(f)
	if bpfErr == nil {
		if ipvs.HasState(icfg) {
			log.Info("removing the IPVS mode's state: running with the BPF datapath")
			if err := ipvs.Cleanup(icfg); err != nil {
				log.Warn("IPVS cleanup", "err", err)
			}
		}
		m.SetDatapathMode(model.ModeEBPF)
		return a, nil
	}
	if mf.fallback != modeIPVS {
		return nil, bpfErr
	}
	if !errors.As(bpfErr, new(kernelError)) {
		log.Error("not falling back to IPVS: the BPF datapath failed for a reason IPVS would not fix, and falling back would remove its maps and connections", "err", bpfErr)
		return nil, bpfErr
	}
	reason := "BPFLoadFailed"
	log.Error("the BPF datapath cannot run on this kernel; falling back to IPVS", "reason", reason, "err", bpfErr)
	m.DatapathFallbacks.WithLabelValues(modeIPVS, reason).Inc()
	a, err = startIPVS(log, f, icfg, m)
	if err != nil {
		ev.emit("Warning", "DatapathFallbackFailed", fmt.Sprintf("BPF datapath failed (%v) and the IPVS fallback failed too: %v", bpfErr, err))
		return nil, fmt.Errorf("BPF datapath: %v; IPVS fallback: %w", bpfErr, err)
	}
	ev.emit("Warning", "DatapathFallback", fmt.Sprintf("serving Services with IPVS: the BPF datapath cannot run on this kernel: %v", bpfErr))
	return a, nil
}

// kernelError is a failure of the BPF datapath to load on this kernel
// (a verifier rejection, a missing map type or helper): the one reason
// --fallback=ipvs serves with IPVS instead. A configuration error, pinned
// maps this build must not reuse, or another agent holding them are not:
// falling back would remove the BPF datapath's maps, and with them every
// connection, for a typo.
type kernelError struct{ error }

func (e kernelError) Unwrap() error { return e.error }

// ebpfParams are startEBPF's settings parsed and checked before anything
// is loaded.
type ebpfParams struct {
	lcfg           loader.Config
	ports          string
	portLo, portHi uint16
	masq           []netip.Addr
}

func parseEBPF(f settings) (ebpfParams, error) {
	p := ebpfParams{lcfg: loader.DefaultConfig()}
	p.lcfg.MaxServices, p.lcfg.MaxBackends = f.mode.mapSizes.MaxServices, f.mode.mapSizes.MaxBackends
	p.lcfg.MaxServiceSlots, p.lcfg.ConntrackSize = f.mode.mapSizes.MaxServiceSlots, f.mode.mapSizes.ConntrackSize
	p.lcfg.PinPath = f.pinPath
	p.lcfg.DisableRevNAT = f.disableRevNATDbg
	p.lcfg.Timeouts = f.mode.timeouts
	p.ports = f.mode.masqPorts
	if p.ports == "" {
		p.ports = fmt.Sprintf("%d-%d", reconcile.DefaultSNATPortMin, reconcile.DefaultSNATPortMax)
		if f.mode.netfilter == netfilterPass {
			p.ports = fmt.Sprintf("%d-%d", loader.DefaultNetfilterPortMin, loader.DefaultNetfilterPortMax)
		}
	}
	var err error
	if p.portLo, p.portHi, err = parsePortRange(p.ports); err != nil {
		return p, fmt.Errorf("--masquerade-port-range: %w", err)
	}
	if p.masq, err = parseAddrList(f.mode.masqAddrs); err != nil {
		return p, fmt.Errorf("--masquerade-address: %w", err)
	}
	return p, nil
}

func startEBPF(f settings) (*activeDatapath, error) {
	p, err := parseEBPF(f)
	if err != nil {
		return nil, err
	}
	if f.mode.debugFailBPF || (config.DebugSwitches() && os.Getenv(envFailBPFLoad) == "1") {
		return nil, kernelError{errors.New("load objects: injected failure (" + envFailBPFLoad + ")")}
	}
	// One agent per set of maps: a second one (a manual run, an
	// overlapping canary) would allocate IDs over the first one's.
	lock, err := loader.LockPinPath(f.pinPath, f.mode.lockWait, func(holder int) {
		slog.Warn("waiting for the process holding the pin path to exit", "pinPath", f.pinPath, "pid", holder, "wait", f.mode.lockWait)
	})
	if err != nil {
		return nil, fmt.Errorf("another xvs agent uses this --pin-path: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			lock.Close()
		}
	}()
	objs, err := loader.Load(p.lcfg)
	if err != nil {
		return nil, loadError(err)
	}
	var nfMark uint32
	if f.mode.netfilter == netfilterPass {
		// The masquerade rule first: the first flow marked for it may
		// come as soon as the maps are written.
		nfMark = loader.DefaultMasqueradeMark
		if err := loader.InstallNetfilter(loader.Netfilter{Mark: nfMark, PortMin: p.portLo, PortMax: p.portHi}); err != nil {
			objs.Close()
			return nil, fmt.Errorf("--netfilter-mode=pass: %w", err)
		}
		slog.Info("Service traffic passes the node's netfilter hooks once translated; netfilter masquerades it",
			"table", loader.NetfilterTable, "mark", fmt.Sprintf("%#x", nfMark), "ports", p.ports)
	} else {
		if err := loader.RemoveNetfilter(); err != nil {
			slog.Warn("cannot remove the netfilter mode's table", "table", loader.NetfilterTable, "err", err)
		}
		slog.Info("Service traffic bypasses the node's netfilter hooks (--netfilter-mode=bypass): firewall and NetworkPolicy rules there do not see it")
	}
	dp, err := reconcile.NewDatapath(maps.FromObjects(objs), reconcile.Config{
		MaxServices: p.lcfg.MaxServices, MaxBackends: p.lcfg.MaxBackends,
		SNATPortMin: p.portLo, SNATPortMax: p.portHi, MaglevSize: uint32(f.mode.maglevSize),
		MasqueradeAddrs: p.masq, NetfilterMark: nfMark,
	})
	if err != nil {
		objs.Close()
		return nil, err
	}
	// Host processes reach Services through the socket-level balancer.
	if err := objs.AttachSockets(""); err != nil {
		slog.Warn("socket-level load balancing for the node's own traffic is off", "err", err)
	}
	// The reaper returns the connections of silently expired flows to
	// the least-connection schedulers and frees their conntrack entries.
	ctx, stop := context.WithCancel(context.Background())
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		dp.RunReaper(ctx, 10*time.Second, func(err error) { slog.Warn("conntrack reaper", "err", err) })
	}()
	// The reaper must be done with the maps before they are closed.
	ok = true
	return &activeDatapath{dp: dp, objs: objs, close: func() { stop(); <-reaped; objs.Close(); lock.Close() }}, nil
}

// loadError classifies a loader.Load error: pinned maps this build must
// not reuse, a resize still to finish or refused, and a map size the
// kernel cannot create are for the operator to settle (a fallback to IPVS
// would remove the maps and every connection through them); anything
// else is the kernel's (kernelError: --fallback applies).
func loadError(err error) error {
	for _, operators := range []error{loader.ErrLayoutChanged, ebpf.ErrMapIncompatible, loader.ErrResizePending,
		loader.ErrResizeRefused, loader.ErrMapSize} {
		if errors.Is(err, operators) {
			return err
		}
	}
	return kernelError{err}
}

func startIPVS(log *slog.Logger, f settings, icfg ipvs.Config, m *xmetrics.Metrics) (*activeDatapath, error) {
	dp, err := ipvs.New(icfg)
	if err != nil {
		return nil, fmt.Errorf("ipvs mode: %w", err)
	}
	if _, err := os.Stat(f.pinPath); err == nil {
		log.Info("removing the BPF datapath's programs, links and maps: running with IPVS", "pinPath", f.pinPath)
		if err := CleanupPins(f.pinPath); err != nil {
			dp.Close()
			return nil, fmt.Errorf("remove the BPF datapath under %s: %w", f.pinPath, err)
		}
	}
	m.SetDatapathMode(model.ModeIPVS)
	return &activeDatapath{dp: dp, close: dp.Close}, nil
}

// parsePortRange reads "LO-HI" (1 <= LO <= HI <= 65535).
func parsePortRange(s string) (uint16, uint16, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if !ok || err1 != nil || err2 != nil || lo == 0 || hi < lo {
		return 0, 0, fmt.Errorf("%q is not LO-HI with 1 <= LO <= HI <= 65535", s)
	}
	return uint16(lo), uint16(hi), nil
}

// uint32Flag parses a map size: a positive number below 2^31 (the kernel
// bounds map sizes; an ID must fit the maps' 32-bit fields).
func uint32Flag(dst *uint32) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 || n >= 1<<31 {
			return fmt.Errorf("%q: want a size between 1 and %d", v, 1<<31-1)
		}
		*dst = uint32(n)
		return nil
	}
}

// parseAddrList parses comma-separated addresses, at most one per family.
func parseAddrList(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	seen := map[bool]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		a = a.Unmap()
		if seen[a.Is4()] {
			return nil, fmt.Errorf("%s: one address per family", a)
		}
		seen[a.Is4()] = true
		out = append(out, a)
	}
	return out, nil
}

// DrainPins is `xvs cleanup --drain`: the way back to another Service
// proxy without cutting what xvs serves. With the agent stopped (its pin
// path lock taken, and held, so none starts meanwhile), the pinned
// programs are told to leave new flows to the node's netfilter, where the
// other proxy (kube-proxy) now has its rules, while they carry on with
// their own; once none of those is open, or wait is up, the BPF datapath
// is removed. Flows still open then are cut, and said so. An interrupted
// drain leaves the programs draining; a starting agent clears it.
func DrainPins(ctx context.Context, log *slog.Logger, pinPath string, wait time.Duration) error {
	if _, err := os.Stat(pinPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lock, err := loader.LockPinPath(pinPath, 0, nil)
	if err != nil {
		return fmt.Errorf("not draining the BPF datapath: %w; stop that agent first", err)
	}
	defer lock.Close()
	if err := maps.SetDraining(pinPath, true); err != nil {
		return err
	}
	m, err := maps.OpenPinned(pinPath)
	if err != nil {
		return err
	}
	defer m.Close()
	start := time.Now()
	var lastLog time.Time
	for {
		open, err := m.OpenFlows()
		if err != nil {
			return err
		}
		if open == 0 {
			log.Info("Drained: no flow of xvs's is open; removing the BPF datapath", "took", time.Since(start).Round(time.Second))
			break
		}
		if time.Since(start) >= wait {
			log.Warn("Drain time is up; removing the BPF datapath cuts the flows still open", "open", open, "wait", wait)
			break
		}
		if time.Since(lastLog) >= 5*time.Second {
			log.Info("Draining: new flows go to the node's netfilter rules; waiting for xvs's own to end", "open", open, "left", (wait - time.Since(start)).Round(time.Second))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain interrupted (%w): the programs stay in place and keep draining", ctx.Err())
		case <-time.After(time.Second):
		}
	}
	return loader.Cleanup(pinPath)
}

// CleanupPins removes the BPF datapath under pinPath, unless an agent is
// using it (it holds the pin path's lock): pulling the maps from under a
// running agent would leave it writing to nothing.
func CleanupPins(pinPath string) error {
	if _, err := os.Stat(pinPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	lock, err := loader.LockPinPath(pinPath, 0, nil)
	if err != nil {
		return fmt.Errorf("not removing the BPF datapath: %w; stop that agent first", err)
	}
	defer lock.Close()
	return loader.Cleanup(pinPath)
}
