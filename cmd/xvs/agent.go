package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/controller/runner"
	"github.com/xvs-lb/xvs/healthcheck"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/loader"
	xmetrics "github.com/xvs-lb/xvs/metrics"
)

// agentFlags is what the datapath start-up (ipvsmode.go) reads: the
// resolved configuration's datapath fields and the mode flags.
type agentFlags struct {
	pinPath          string
	scheduler        string
	disableRevNATDbg bool
	mode             modeFlags // --fallback and the ipvs mode's own flags (ipvsmode.go)
}

func splitList(s string) []string { return config.SplitList(s) }

func parsePrefixes(s string) ([]netip.Prefix, error) { return config.ParseCIDRs(s) }

// newLogger is a text logger at verbosity v (0 info, 2+ debug).
func newLogger(v int) *slog.Logger { return newFormatLogger("text", v) }

func newFormatLogger(format string, v int) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if v >= 2 {
		opts.Level = slog.LevelDebug
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// routeKlog sends client-go's klog output through log, at verbosity v, so
// that the agent has one log stream in one format.
func routeKlog(log *slog.Logger, v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", strconv.Itoa(v))
	klog.SetSlogLogger(log)
}

// adoptFlags registers on fs the flags register defines, except those fs
// already has: the ipvs mode's flag set (ipvsmode.go) also defines
// --proxy-mode and --metrics-bind-address, which the agent takes from the
// KubeProxyConfiguration flags instead.
func adoptFlags(fs *flag.FlagSet, register func(*flag.FlagSet)) {
	tmp := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	register(tmp)
	tmp.VisitAll(func(fl *flag.Flag) {
		if fs.Lookup(fl.Name) == nil {
			fs.Var(fl.Value, fl.Name, fl.Usage)
		}
	})
}

func runAgent(args []string) error {
	o, f, err := parseAgentArgs(args)
	if err != nil {
		return err
	}
	c := &o.Config
	log := newFormatLogger(c.Logging.Format, int(c.Logging.Verbosity))
	slog.SetDefault(log)
	routeKlog(log, int(c.Logging.Verbosity))
	if o.Cleanup {
		return cleanupAll(log, &f)
	}
	ccfg, err := o.ControllerConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent(ctx, log, o, f, ccfg)
}

// parseAgentArgs resolves the command line and the --config file into the
// configuration and the datapath settings.
func parseAgentArgs(args []string) (*config.Options, agentFlags, error) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	o := &config.Options{}
	o.AddFlags(fs)
	var f agentFlags
	adoptFlags(fs, f.mode.register)
	if err := fs.Parse(args); err != nil {
		return nil, f, err
	}
	if fs.NArg() > 0 {
		return nil, f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := o.Complete(); err != nil {
		return nil, f, err
	}
	c := &o.Config
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	f.pinPath, f.scheduler, f.disableRevNATDbg = o.PinPath, c.IPVS.Scheduler, o.DisableRevNATDbg
	f.mode.proxyMode = string(c.Mode)
	f.mode.metricsAddr = "" // served with the kube-proxy metrics (agent_http.go)
	ipvsFromConfig(&f.mode, o, set)
	conntrackFromConfig(&f.mode, o)
	if err := f.mode.validate(); err != nil {
		return nil, f, err
	}
	if !o.Cleanup && o.Objects != "" && (c.ClientConnection.Kubeconfig != "" || o.Master != "") {
		return nil, f, errors.New("--objects and --kubeconfig/--master are alternative sources: give one")
	}
	return o, f, nil
}

// ipvsFromConfig takes the ipvs.* fields of the configuration file into
// the ipvs mode's settings, unless their own flags were given.
func ipvsFromConfig(m *modeFlags, o *config.Options, set map[string]bool) {
	v := &o.Config.IPVS
	if !set["ipvs-strict-arp"] && v.StrictARP {
		m.ipvsStrictARP = true
	}
	if !set["ipvs-exclude-cidrs"] && len(v.ExcludeCIDRs) > 0 {
		m.ipvsExclude = strings.Join(v.ExcludeCIDRs, ",")
	}
	for _, d := range []struct {
		flag string
		dst  *time.Duration
		v    time.Duration
	}{
		{"ipvs-tcp-timeout", &m.ipvsTCP, v.TCPTimeout.Duration},
		{"ipvs-tcpfin-timeout", &m.ipvsTCPFin, v.TCPFinTimeout.Duration},
		{"ipvs-udp-timeout", &m.ipvsUDP, v.UDPTimeout.Duration},
	} {
		if !set[d.flag] && d.v != 0 {
			*d.dst = d.v
		}
	}
}

// conntrackFromConfig takes the conntrack timeouts of the configuration
// (or of kube-proxy's --conntrack-* flags) into the ebpf mode's own
// conntrack.
func conntrackFromConfig(m *modeFlags, o *config.Options) {
	ct := &o.Config.Conntrack
	if ct.TCPEstablishedTimeout != nil {
		m.timeouts.TCPEstablished = ct.TCPEstablishedTimeout.Duration
	}
	if ct.TCPCloseWaitTimeout != nil {
		m.timeouts.TCPCloseWait = ct.TCPCloseWaitTimeout.Duration
	}
	m.timeouts.UDP, m.timeouts.UDPStream = ct.UDPTimeout.Duration, ct.UDPStreamTimeout.Duration
}

// cleanupAll is --cleanup: remove both modes' state and exit, as
// kube-proxy --cleanup removes every mode's rules.
func cleanupAll(log *slog.Logger, f *agentFlags) error {
	err := cleanupPins(f.pinPath)
	icfg, cerr := f.mode.ipvsConfig("", log)
	if cerr == nil && ipvs.HasState(icfg) {
		err = errors.Join(err, ipvs.Cleanup(icfg))
	}
	if err == nil {
		log.Info("Removed the xvs datapath", "pinPath", f.pinPath)
	}
	return errors.Join(err, cerr)
}

// adjustOOMScore writes oomScoreAdj to /proc/self/oom_score_adj, as
// kube-proxy does so that the kernel kills workloads before the proxy. A
// failure (no privilege to lower it) is logged, not fatal.
func adjustOOMScore(log *slog.Logger, v int32) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0); err != nil {
		log.Warn("Cannot set the OOM score adjustment", "oomScoreAdj", v, "err", err)
		return
	}
	log.Debug("OOM score adjusted", "oomScoreAdj", v)
}

// setMemoryLimit gives the Go garbage collector a soft limit of 90% of the
// container's memory limit (cgroup memory.max), so that a large cluster's
// full sync collects harder instead of being OOM-killed. GOMEMLIMIT (or
// AUTOMEMLIMIT=off) in the environment takes precedence; without a limit
// it changes nothing.
func setMemoryLimit(log *slog.Logger) {
	limit, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup), memlimit.WithRatio(0.9))
	switch {
	case errors.Is(err, memlimit.ErrNoLimit) || (err == nil && limit == math.MaxInt64):
		log.Debug("No memory limit: the Go garbage collector runs with its defaults")
	case err != nil:
		log.Warn("Cannot read the container's memory limit; the Go garbage collector runs with its defaults", "err", err)
	default:
		log.Info("Go memory limit set from the container's", "bytes", limit)
	}
}

// agent runs the proxy until ctx ends. It leaves the datapath in place when
// it exits: pinned maps and links keep serving traffic across a restart or
// an upgrade, and `xvs cleanup` (or --cleanup) is the way to remove them.
func agent(ctx context.Context, log *slog.Logger, o *config.Options, f agentFlags, ccfg controller.Config) error {
	c := &o.Config
	adjustOOMScore(log, *c.OOMScoreAdj)
	setMemoryLimit(log)
	if err := applyConntrackSysctls(log, "/proc/sys", c.Conntrack); err != nil {
		// kube-proxy fails here only for nf_conntrack_max it cannot
		// raise; xvs serves on, as its own conntrack does not need them.
		log.Warn("Cannot set the host's conntrack sysctls", "err", err)
	}
	sel := loader.DeviceSelector{Patterns: splitList(o.Devices), XDP: splitList(o.XDPDevices)}
	if err := sel.Validate(); err != nil {
		return err
	}

	m := xmetrics.New()
	findings := config.Unsupported(c)
	for _, fd := range findings {
		log.Warn("Configuration field not supported by xvs; it has no effect", "field", fd.Field, "value", fd.Value, "reason", fd.Reason)
		m.UnsupportedConfig.WithLabelValues(fd.Field).Set(1)
	}

	var kube *kubeClient
	if o.Objects == "" {
		var err error
		if kube, err = newKubeClient(ctx, log, o, ccfg.NodeName, m.EventsDropped); err != nil {
			return err
		}
		defer kube.shutdown()
	}
	events := &nodeEvents{node: ccfg.NodeName, file: f.mode.eventFile, log: log}
	if kube != nil {
		events.api = kube.nodeEvent
	}
	active, err := startDatapath(log, f, events)
	if err != nil {
		return err
	}
	defer active.close()
	if active.objs != nil {
		if err := m.RegisterVerdicts(verdictReader(active.objs)); err != nil {
			return err
		}
	}
	if ct, ok := active.dp.(interface{ ConntrackOccupancy() map[string][2]uint64 }); ok {
		err := m.RegisterConntrack(func() map[string]xmetrics.ConntrackTable {
			out := map[string]xmetrics.ConntrackTable{}
			for table, v := range ct.ConntrackOccupancy() {
				out[table] = xmetrics.ConntrackTable{Entries: v[0], Capacity: v[1]}
			}
			return out
		})
		if err != nil {
			return err
		}
	}
	tracker, err := controller.NewTracker(ccfg)
	if err != nil {
		return err
	}

	s := newSyncer(syncerConfig{
		log: log, tracker: tracker, dp: active.dp, metrics: m,
		syncPeriod: c.IPVS.SyncPeriod.Duration, ccfg: ccfg, kube: kube,
	})
	defer s.svcHealth.Close()
	r := runner.New(runner.Config{MinInterval: c.IPVS.MinSyncPeriod.Duration, MaxInterval: c.IPVS.SyncPeriod.Duration,
		RetryInterval: time.Second}, s.sync)
	s.trigger = r.Run

	stopHTTP, err := serveHTTP(log, c, s, active.dp.Mode(), m)
	if err != nil {
		return err
	}
	defer stopHTTP() // before active.close: /metrics reads the maps

	if active.objs != nil { // ebpf mode
		atts, errs, err := active.objs.WatchDevices(ctx, sel, loader.AttachMode(o.TCAttach), func(a loader.Attachment, err error) {
			if err != nil {
				log.Warn("attach failed", "err", err)
				return
			}
			log.Info("attached", "device", a.Device, "mode", a.Mode)
		})
		if err != nil {
			return err
		}
		for _, a := range atts {
			log.Info("attached", "device", a.Device, "mode", a.Mode)
		}
		for _, e := range errs {
			log.Warn("attach failed", "err", e)
		}
	}

	if kube != nil {
		if err := kube.startInformers(ctx, tracker, c.ConfigSyncPeriod.Duration, o.ServiceProxyName, s.onEvent); err != nil {
			if ctx.Err() != nil { // stopped while waiting for the API server
				log.Info("xvs agent stopping before the first sync; the datapath stays in place")
				return nil
			}
			return err
		}
		kube.birthCry(string(c.Mode))
	} else {
		src := controller.NewFileSource(o.Objects, nodeHealthHandler{Handler: tracker, health: s.health, node: ccfg.NodeName}, log)
		if _, err := src.Load(); err != nil {
			return fmt.Errorf("read %s: %w", o.Objects, err)
		}
		go func() {
			if err := src.Run(ctx, s.onFileChange); err != nil && ctx.Err() == nil {
				log.Error("file source stopped", "err", err)
			}
		}()
	}
	log.Info("xvs agent running", "node", ccfg.NodeName, "source", sourceName(o), "mode", active.dp.Mode(), "pinPath", o.PinPath)
	// The first sync happens only now that the source holds the whole
	// world: informers synced, or the directory read.
	r.Run()
	r.Loop(ctx)
	log.Info("xvs agent stopping; the datapath stays in place")
	return nil
}

func sourceName(o *config.Options) string {
	if o.Objects != "" {
		return "objects:" + o.Objects
	}
	return "kubernetes"
}

// nodeHealthHandler hands this node's Node from the file source to
// /healthz as well as to the Tracker, as the informer source's events do:
// a Node being deleted, or tainted ToBeDeletedByClusterAutoscaler, makes
// the node ineligible.
type nodeHealthHandler struct {
	controller.Handler
	health *healthcheck.ProxyHealth
	node   string
}

func (h nodeHealthHandler) syncNode(n *v1.Node, deleted bool) {
	if n == nil || n.Name != h.node {
		return
	}
	if deleted {
		n = nil
	}
	h.health.SyncNode(n)
}

func (h nodeHealthHandler) OnNodeAdd(n *v1.Node) bool {
	h.syncNode(n, false)
	return h.Handler.OnNodeAdd(n)
}

func (h nodeHealthHandler) OnNodeUpdate(old, n *v1.Node) bool {
	h.syncNode(n, false)
	return h.Handler.OnNodeUpdate(old, n)
}

func (h nodeHealthHandler) OnNodeDelete(n *v1.Node) bool {
	h.syncNode(n, true)
	return h.Handler.OnNodeDelete(n)
}
