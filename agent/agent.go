// Package agent is the xvs proxy: it resolves kube-proxy's command line and
// KubeProxyConfiguration (Options), brings up the datapath of the
// configured mode (ebpf, or ipvs as fallback or by choice), and runs the
// sync loop that turns the Services, EndpointSlices and Nodes of its source
// (the Kubernetes API, or a directory of manifests) into datapath state,
// with kube-proxy's health, readiness and metrics servers and its Events.
//
// An Agent has an explicit lifecycle: New brings everything up to serving
// its HTTP endpoints, Run attaches the programs and syncs until its context
// ends, Close releases what New took. The datapath stays in place after
// Close: pinned maps and links keep serving traffic across a restart.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as kube-proxy links it
	"k8s.io/component-base/metrics/prometheus/feature"
	"k8s.io/klog/v2"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/controller/runner"
	"github.com/xvs-lb/xvs/healthcheck"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/loader"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/version"
)

// Options are the agent's resolved command line and configuration file:
// kube-proxy's (config.Options) and the datapath settings (datapath.go).
type Options struct {
	config.Options
	mode modeFlags // --fallback, the ipvs mode's and the ebpf mode's own flags
	// perBackendMetrics exports the per-backend series of the per-Service
	// metrics (--metrics-per-backend).
	perBackendMetrics bool
	// maxMetricSeries bounds the per-Service series of a scrape
	// (--metrics-max-series).
	maxMetricSeries int
	// flags is the parsed command line, for /flagz (nil: no /flagz).
	flags *pflag.FlagSet
	// servicesFile is --services-file (publish.go).
	servicesFile string
}

// settings is what the datapath start-up (datapath.go) reads: the resolved
// configuration's datapath fields and the mode flags.
type settings struct {
	pinPath          string
	scheduler        string
	disableRevNATDbg bool
	mode             modeFlags
}

func (o *Options) settings() settings {
	return settings{pinPath: o.PinPath, scheduler: o.Config.IPVS.Scheduler, disableRevNATDbg: o.DisableRevNATDbg, mode: o.mode}
}

// NewLogger applies the logging configuration as kube-proxy does
// (component-base: --logging-format text, klog's header and key="value"
// pairs, or json; -v and --vmodule; the --log-* options) and returns the
// agent's logger, which writes through klog, so that the agent's lines,
// client-go's and component-base's are one stream in one format. slog's
// levels become klog's severities (Warn a W line, Error an E line) and
// Debug is verbosity 4.
func NewLogger(c *logsapi.LoggingConfiguration) (*slog.Logger, error) {
	if err := logsapi.ValidateAndApply(c, nil); err != nil {
		return nil, err
	}
	log := slog.New(logr.ToSlogHandler(klog.Background()))
	// moby/ipvs logs through logrus (a failed `modprobe -va ip_vs`, as in
	// a container without the host's /lib/modules): its lines join the
	// stream too, not logrus's own text lines on stderr.
	logrus.SetOutput(io.Discard)
	logrus.AddHook(logrusHook{log})
	return log, nil
}

// logrusHook sends logrus's entries to the agent's logger, at the same
// level (Panic, Fatal and Error an error line), with their fields.
type logrusHook struct{ log *slog.Logger }

func (logrusHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h logrusHook) Fire(e *logrus.Entry) error {
	level := slog.LevelInfo
	switch {
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	case e.Level == logrus.WarnLevel:
		level = slog.LevelWarn
	case e.Level >= logrus.DebugLevel:
		level = slog.LevelDebug
	}
	attrs := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		attrs = append(attrs, k, v)
	}
	h.log.Log(context.Background(), level, e.Message, attrs...)
	return nil
}

// defaultMaxMetricSeries bounds a scrape's per-Service series: about 16,000
// frontends with their service series alone, or 2,000 frontends of 5
// backends with the backend series too. A scrape costs the agent about a
// kilobyte of RSS per series (measured: 86,000 series, 47 -> 146 MiB),
// and 100,000 Services of 10 endpoints would make 8.6 million series (a
// 12 GiB agent at one scrape, measured).
const defaultMaxMetricSeries = 100_000

// AddFlags registers the agent's flags on fs: kube-proxy's and xvs's
// (config.Options), then the datapath's (datapath.go).
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs)
	o.mode.register(fs)
	fs.StringVar(&o.servicesFile, "services-file", "", "where to publish the Service names and endpoint states of what the datapath serves, for xvs list (default /run/xvs/services-<netns inode>.json; \"none\": not published)")
	fs.BoolVar(&o.perBackendMetrics, "metrics-per-backend", true, "export the per-Service metrics per backend too (xvs_backend_*: one series per frontend and backend; turn off on nodes with very many endpoints, docs/metrics.md)")
	fs.IntVar(&o.maxMetricSeries, "metrics-max-series", defaultMaxMetricSeries, "most per-Service and per-backend series one scrape exports: over it the backend series are left out, then all of them (xvs_service_metrics_series_dropped; 0: no bound; docs/metrics.md)")
}

// Complete resolves the parsed fs and the --config file into the
// configuration and the datapath settings, and validates them.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.flags = fs
	if err := o.Options.Complete(); err != nil {
		return err
	}
	c := &o.Config
	o.mode.proxyMode = string(c.Mode)
	ipvsFromConfig(&o.mode, &o.Options)
	conntrackFromConfig(&o.mode, &o.Options)
	if err := o.mode.validate(); err != nil {
		return err
	}
	if !o.Cleanup && o.Objects != "" && (c.ClientConnection.Kubeconfig != "" || o.Master != "") {
		return errors.New("--objects and --kubeconfig/--master are alternative sources: give one")
	}
	return nil
}

// ipvsFromConfig takes the configuration's ipvs.* fields (from the file,
// or from kube-proxy's --ipvs-* flags) into the ipvs mode's settings.
func ipvsFromConfig(m *modeFlags, o *config.Options) {
	v := &o.Config.IPVS
	m.ipvsStrictARP, m.ipvsExclude = v.StrictARP, strings.Join(v.ExcludeCIDRs, ",")
	m.ipvsTCP, m.ipvsTCPFin, m.ipvsUDP = v.TCPTimeout.Duration, v.TCPFinTimeout.Duration, v.UDPTimeout.Duration
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

// Cleanup is --cleanup: remove both modes' state, as kube-proxy --cleanup
// removes every mode's rules.
func Cleanup(log *slog.Logger, o *Options) error {
	err := CleanupPins(o.PinPath)
	if f := o.servicesFilePath(); f != "" {
		err = errors.Join(err, RemoveServicesFile(f))
	}
	icfg, cerr := o.mode.ipvsConfig("", log)
	if cerr == nil && ipvs.HasState(icfg) {
		err = errors.Join(err, ipvs.Cleanup(icfg))
	}
	if err == nil {
		log.Info("Removed the xvs datapath", "pinPath", o.PinPath)
	}
	return errors.Join(err, cerr)
}

// InitOnly is --init-only: the node settings that need full root, then
// exit, as kube-proxy --init-only. For xvs that is the host's conntrack
// sysctls, a bpffs under the pin path (mounted on the host: the init
// container's mount propagates, the agent's need not), and for ipvs mode
// (or its fallback) the ip_vs module and IPVS sysctls. The agent that runs
// next needs capabilities only (deploy/daemonset.yaml): it finds these
// done and writes nothing to the read-only /proc/sys of its container.
func InitOnly(log *slog.Logger, o *Options) error {
	if err := applyConntrackSysctls(log, "/proc/sys", o.Config.Conntrack); err != nil {
		return fmt.Errorf("conntrack sysctls: %w", err)
	}
	done := []string{"conntrack sysctls"}
	if o.mode.proxyMode != modeIPVS {
		if err := loader.EnsureBPFFS(filepath.Dir(o.PinPath)); err != nil {
			return fmt.Errorf("bpffs for %s: %w", o.PinPath, err)
		}
		done = append(done, "bpffs at "+filepath.Dir(o.PinPath))
	}
	if o.mode.proxyMode == modeIPVS || o.mode.fallback == modeIPVS {
		err := ipvs.PrepareNode(o.mode.ipvsStrictARP, log)
		switch {
		case err != nil && o.mode.proxyMode == modeIPVS:
			return fmt.Errorf("ipvs mode: %w", err)
		case err != nil:
			// The fallback is for kernels that cannot run BPF; one without
			// IPVS either is reported when the agent needs it.
			log.Warn("IPVS not prepared for the fallback", "err", err)
		default:
			done = append(done, "ip_vs and IPVS sysctls")
		}
	}
	log.Info("Node initialised; exiting (--init-only)", "done", strings.Join(done, ", "))
	return nil
}

// adjustOOMScore writes oomScoreAdj to /proc/self/oom_score_adj, as
// kube-proxy does so that the kernel kills workloads before the proxy. A
// failure (lowering it takes CAP_SYS_RESOURCE, which the DaemonSet's agent
// does not hold) is logged, not fatal; under a kubelet a
// system-node-critical Pod starts at -997 already, and that is said as
// such rather than warned about.
func adjustOOMScore(log *slog.Logger, v int32) {
	err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0)
	if err == nil {
		log.Debug("OOM score adjusted", "oomScoreAdj", v)
		return
	}
	b, _ := os.ReadFile("/proc/self/oom_score_adj")
	cur, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if perr == nil && cur <= -900 {
		log.Info("OOM score adjustment left as the kubelet set it", "oomScoreAdj", cur, "wanted", v, "err", err)
		return
	}
	log.Warn("Cannot set the OOM score adjustment", "oomScoreAdj", v, "err", err)
}

// setMemoryLimit gives the Go garbage collector a soft limit of 90% of the
// container's memory limit (cgroup memory.max) less reserved, so that a
// large cluster's full sync collects harder instead of being OOM-killed.
// reserved is the kernel memory of the BPF maps the agent created, which
// the kernel charges to the same cgroup (Linux 5.11 and later): a Go heap
// allowed the whole limit would leave the maps no room. GOMEMLIMIT (or
// AUTOMEMLIMIT=off) in the environment takes precedence; without a limit
// it changes nothing.
func setMemoryLimit(log *slog.Logger, reserved uint64) {
	limit, err := memlimit.Set(memlimit.WithProvider(beside(memlimit.FromCgroup, reserved)), memlimit.WithRatio(0.9))
	switch {
	case errors.Is(err, memlimit.ErrNoLimit) || (err == nil && limit == math.MaxInt64):
		log.Debug("No memory limit: the Go garbage collector runs with its defaults")
	case err != nil:
		log.Warn("Cannot set the Go memory limit from the container's; the Go garbage collector runs with its defaults", "err", err)
	default:
		log.Info("Go memory limit set from the container's", "bytes", limit, "bpfMapBytes", reserved)
	}
}

// beside is the memory limit provider p less reserved bytes. A limit
// that reserved fills (or nearly: less than 64 MiB left) is an error, not
// a soft limit the collector could never meet.
func beside(p memlimit.Provider, reserved uint64) memlimit.Provider {
	return func() (uint64, error) {
		limit, err := p()
		if err != nil || reserved == 0 || limit == math.MaxInt64 {
			return limit, err
		}
		if limit < reserved+64<<20 {
			return 0, fmt.Errorf("the container's memory limit (%d MiB) barely holds the BPF maps (%d MiB): raise it, or lower the --bpf-* sizes", limit>>20, reserved>>20)
		}
		return limit - reserved, nil
	}
}

// Agent is one running proxy: its datapath, its source's Tracker, the sync
// loop and the HTTP servers.
type Agent struct {
	log     *slog.Logger
	o       *Options
	ccfg    controller.Config
	metrics *xmetrics.Metrics
	kube    *kubeClient // nil with the file source
	active  *activeDatapath
	tracker *controller.Tracker
	syncer  *syncer
	runner  *runner.Runner
	// closers undo New's steps, last first.
	closers []func()
}

// New brings the agent up to serving: the process settings kube-proxy
// makes (OOM score, conntrack sysctls), the API client, the datapath of
// the configured mode (with its fallback), the sync loop and the HTTP
// servers. Nothing is synced before Run. On error, what was brought up is
// released again.
func New(ctx context.Context, log *slog.Logger, o *Options) (_ *Agent, err error) {
	c := &o.Config
	a := &Agent{log: log, o: o, metrics: xmetrics.New()}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.ccfg, err = o.ControllerConfig(); err != nil {
		return nil, err
	}
	adjustOOMScore(log, *c.OOMScoreAdj)
	setMemoryLimit(log, 0)
	if err := applyConntrackSysctls(log, "/proc/sys", c.Conntrack); err != nil {
		// kube-proxy fails here only for nf_conntrack_max it cannot
		// raise; xvs serves on, as its own conntrack does not need them.
		log.Warn("Cannot set the host's conntrack sysctls", "err", err)
	}
	if err := a.devices().Validate(); err != nil {
		return nil, err
	}
	// kubernetes_feature_enabled for the gates whose behaviour xvs has
	// (all GA: stage "").
	for name, on := range config.KnownFeatureGates {
		feature.RecordFeatureInfo(ctx, name, "", on)
	}
	for name, g := range config.SwitchableFeatureGates {
		feature.RecordFeatureInfo(ctx, name, g.Stage, config.FeatureEnabled(c, name))
	}
	for _, fd := range config.Unsupported(c) {
		log.Warn("Configuration field not supported by xvs; it has no effect", "field", fd.Field, "value", fd.Value, "reason", fd.Reason)
		a.metrics.UnsupportedConfig.WithLabelValues(fd.Field).Set(1)
	}
	if o.Objects == "" {
		if a.kube, err = newKubeClient(ctx, log, &o.Options, a.ccfg.NodeName, a.metrics.EventsDropped); err != nil {
			return nil, err
		}
		a.closers = append(a.closers, a.kube.shutdown)
	}
	events := &nodeEvents{node: a.ccfg.NodeName, file: o.mode.eventFile, log: log}
	if a.kube != nil {
		events.api = a.kube.nodeEvent
	}
	if a.active, err = startDatapath(log, o.settings(), events, a.metrics); err != nil {
		return nil, err
	}
	a.closers = append(a.closers, a.active.close)
	if a.active.objs != nil {
		setMemoryLimit(log, a.active.objs.MapMemory())
	}
	if err := a.registerDatapathMetrics(); err != nil {
		return nil, err
	}
	if a.tracker, err = controller.NewTracker(a.ccfg); err != nil {
		return nil, err
	}
	a.syncer = newSyncer(syncerConfig{
		log: log, tracker: a.tracker, dp: a.active.dp, metrics: a.metrics,
		syncPeriod: c.IPVS.SyncPeriod.Duration, ccfg: a.ccfg, kube: a.kube, servicesFile: o.servicesFilePath(),
		adopt: o.mode.adopt && a.active.dp.Mode() == modeEBPF, firstSyncMaxRemoved: o.FirstSyncMaxRemoved,
	})
	a.closers = append(a.closers, a.syncer.svcHealth.Close)
	if read := frontendSamples(a.active.dp, a.syncer.summary.names); read != nil {
		if err := a.metrics.RegisterServices(read, xmetrics.ServiceOptions{PerBackend: o.perBackendMetrics,
			MaxSeries: o.maxMetricSeries, Size: a.syncer.summary.names.size, Log: log}); err != nil {
			return nil, err
		}
	}
	a.runner = runner.New(runner.Config{MinInterval: c.IPVS.MinSyncPeriod.Duration, MaxInterval: c.IPVS.SyncPeriod.Duration,
		RetryInterval: time.Second}, a.syncer.sync)
	a.syncer.trigger = a.runner.Run
	stopHTTP, err := serveHTTP(log, c, o.flags, a.syncer, a.active.dp.Mode(), a.metrics)
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, stopHTTP) // closed before the datapath: /metrics reads the maps
	return a, nil
}

// Close releases what New brought up, last first. The datapath stays in
// place: `xvs cleanup` (or --cleanup) is the way to remove it.
func (a *Agent) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

func (a *Agent) devices() loader.DeviceSelector {
	return loader.DeviceSelector{Patterns: config.SplitList(a.o.Devices), XDP: config.SplitList(a.o.XDPDevices)}
}

// registerDatapathMetrics adds the datapath's own gauges to the registry:
// the BPF programs' verdict counters, the conntrack tables' occupancy.
func (a *Agent) registerDatapathMetrics() error {
	if a.active.objs != nil {
		if err := a.metrics.RegisterVerdicts(verdictReader(a.active.objs)); err != nil {
			return err
		}
	}
	if mo, ok := a.active.dp.(mapOccupancy); ok {
		if err := a.metrics.RegisterMapOccupancy(mo.MapOccupancy); err != nil {
			return err
		}
	}
	ct, ok := a.active.dp.(conntrackOccupancy)
	if !ok {
		return nil
	}
	return a.metrics.RegisterConntrack(func() map[string]xmetrics.ConntrackTable {
		out := map[string]xmetrics.ConntrackTable{}
		for table, v := range ct.ConntrackOccupancy() {
			out[table] = xmetrics.ConntrackTable{Entries: v[0], Capacity: v[1]}
		}
		return out
	})
}

// Run attaches the programs (ebpf mode), starts the source and syncs until
// ctx ends. The first sync happens once the source holds the whole world:
// informers synced, or the directory read.
func (a *Agent) Run(ctx context.Context) error {
	c, o, log := &a.o.Config, a.o, a.log
	if a.active.objs != nil {
		if err := a.attach(ctx); err != nil {
			return err
		}
	}
	// The initial list and the first sync hold the whole world at once:
	// collect harder until it is applied (syncer.raiseGC).
	a.syncer.lowerGC()
	if a.kube != nil {
		if err := a.kube.startInformers(ctx, a.tracker, c.ConfigSyncPeriod.Duration, o.ServiceProxyName, a.syncer.onEvent); err != nil {
			if ctx.Err() != nil { // stopped while waiting for the API server
				log.Info("xvs agent stopping before the first sync; the datapath stays in place")
				return nil
			}
			return err
		}
		a.kube.birthCry(string(c.Mode))
	} else {
		src := controller.NewFileSource(o.Objects, nodeHealthHandler{Handler: a.tracker, health: a.syncer.health, node: a.ccfg.NodeName}, log)
		if _, err := src.Load(); err != nil {
			return fmt.Errorf("read %s: %w", o.Objects, err)
		}
		go func() {
			if err := src.Run(ctx, a.syncer.onFileChange); err != nil && ctx.Err() == nil {
				log.Error("file source stopped", "err", err)
			}
		}()
	}
	// One line with what an operator asks first: which build, kernel,
	// mode, attach mode and map sizes this node runs with.
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	attrs := []any{"node", a.ccfg.NodeName, "source", sourceName(&o.Options), "mode", a.active.dp.Mode(),
		"version", version.Version(), "kernel", unix.ByteSliceToString(uts.Release[:])}
	if a.active.objs != nil {
		ms := o.mode.mapSizes
		attrs = append(attrs, "tcAttach", o.TCAttach, "pinPath", o.PinPath, "maxServices", ms.MaxServices,
			"maxBackends", ms.MaxBackends, "maxServiceSlots", ms.MaxServiceSlots, "conntrackSize", ms.ConntrackSize)
	}
	log.Info("xvs agent running", attrs...)
	if pub := a.syncer.summary.pub; pub != nil {
		done := make(chan struct{})
		go func() { pub.run(ctx, time.Second); close(done) }()
		defer func() { <-done }() // it removes the file once ctx ends
	}
	a.runner.Run()
	a.runner.Loop(ctx)
	log.Info("xvs agent stopping; the datapath stays in place")
	return nil
}

// servicesFilePath resolves --services-file.
func (o *Options) servicesFilePath() string {
	switch o.servicesFile {
	case "none":
		return ""
	case "":
		return DefaultServicesFile()
	}
	return o.servicesFile
}

// attach puts the programs on the selected devices, and on devices that
// appear later.
func (a *Agent) attach(ctx context.Context) error {
	report := attachReporter(a.log, a.metrics)
	atts, errs, err := a.active.objs.WatchDevices(ctx, a.devices(), loader.AttachMode(a.o.TCAttach), report)
	if err != nil {
		return err
	}
	for _, at := range atts {
		report(at, nil)
	}
	for _, e := range errs {
		report(loader.Attachment{}, e)
	}
	a.syncer.health.AddBehind(devicesBehind(a.log, a.active.objs.DeviceBacklog))
	return nil
}

// devicesBehind is the device watch's part of the proxy's health: since
// when the longest-waiting new device has waited for the programs. It says
// so in the log when devices start and stop waiting longer than a few
// seconds.
func devicesBehind(log *slog.Logger, backlog func() (int, time.Time)) func() time.Time {
	var mu sync.Mutex
	warned := false
	return func() time.Time {
		n, since := backlog()
		mu.Lock()
		defer mu.Unlock()
		switch late := !since.IsZero() && time.Since(since) > 5*time.Second; {
		case late && !warned:
			log.Warn("New devices wait for the programs; pods behind them reach no Service yet", "devices", n, "since", since)
			warned = true
		case !late && warned:
			log.Info("Every device has the programs again")
			warned = false
		}
		return since
	}
}

// attachReporter logs each attachment and each failure, and counts the
// failures (xvs_device_attach_failures_total).
func attachReporter(log *slog.Logger, m *xmetrics.Metrics) func(loader.Attachment, error) {
	return func(at loader.Attachment, err error) {
		if err != nil {
			// A kernel that cannot run the XDP program is said once per
			// device, and tc serves it: not a failure to alert on.
			if !errors.Is(err, loader.ErrXDPUnsupported) {
				m.AttachFailures.Inc()
			}
			log.Warn("attach failed", "err", err)
			return
		}
		log.Info("attached", "device", at.Device, "mode", at.Mode)
	}
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
