package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/controller/runner"
	"github.com/xvs-lb/xvs/loader"
)

// agentFlags are kube-proxy's flags where one exists, xvs's own otherwise.
type agentFlags struct {
	objects          string
	hostname         string
	devices          string
	pinPath          string
	tcAttach         string
	clusterCIDR      string
	serviceCIDR      string
	nodePortAddrs    string
	nodeIPs          string
	scheduler        string
	minSyncPeriod    time.Duration
	syncPeriod       time.Duration
	masqueradeAll    bool
	verbosity        int
	disableRevNATDbg bool
	mode             modeFlags // --proxy-mode, --fallback, ipvs mode (ipvsmode.go)
}

func (f *agentFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.objects, "objects", "", "directory of Service, EndpointSlice and Node manifests to serve (the file source)")
	fs.StringVar(&f.hostname, "hostname-override", "", "the node's name (default: the host name)")
	fs.StringVar(&f.devices, "devices", "", "comma-separated interface names or globs to attach to (default: every interface but lo, including ones created later)")
	fs.StringVar(&f.pinPath, "pin-path", loader.DefaultPinPath, "bpffs directory for pinned maps, programs and links")
	fs.StringVar(&f.tcAttach, "tc-attach", string(loader.AttachAuto), "tc attach mode: auto (TCX where available), tcx or legacy")
	fs.StringVar(&f.clusterCIDR, "cluster-cidr", "", "pod CIDRs (comma-separated), for local-traffic detection")
	fs.StringVar(&f.serviceCIDR, "service-cluster-ip-range", "", "service CIDRs (comma-separated)")
	fs.StringVar(&f.nodePortAddrs, "nodeport-addresses", "", "NodePort addresses: 'primary' or CIDRs (comma-separated)")
	fs.StringVar(&f.nodeIPs, "node-ip", "", "the node's addresses, primary first (default: from the Node object)")
	fs.StringVar(&f.scheduler, "ipvs-scheduler", "", "default scheduler (IPVS names; empty = random)")
	fs.DurationVar(&f.minSyncPeriod, "min-sync-period", 100*time.Millisecond, "least time between two syncs of the datapath")
	fs.DurationVar(&f.syncPeriod, "sync-period", 30*time.Second, "longest time between two full syncs")
	fs.BoolVar(&f.masqueradeAll, "masquerade-all", false, "SNAT all Service traffic")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity (0 info, 2+ debug)")
	fs.BoolVar(&f.disableRevNATDbg, "debug-disable-rev-nat", false, "fault injection for conformance tests: skip reverse NAT (never in production)")
	f.mode.register(fs)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range splitList(s) {
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, err
		}
		out = append(out, pf.Masked())
	}
	return out, nil
}

func newLogger(v int) *slog.Logger {
	level := slog.LevelInfo
	if v >= 2 {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func runAgent(args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var f agentFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger(f.verbosity)
	if err := f.mode.validate(); err != nil {
		return err
	}
	if f.objects == "" {
		return errors.New("--objects is required (the Kubernetes API source is not built yet)")
	}
	ccfg, err := f.controllerConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return agent(ctx, log, f, ccfg)
}

func (f *agentFlags) controllerConfig() (controller.Config, error) {
	c := controller.Config{
		NodeName:          f.hostname,
		NodePortAddresses: splitList(f.nodePortAddrs),
		Scheduler:         f.scheduler,
		MasqueradeAll:     f.masqueradeAll,
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("host name: %w", err)
		}
		c.NodeName = strings.ToLower(h)
	}
	var err error
	if c.PodCIDRs, err = parsePrefixes(f.clusterCIDR); err != nil {
		return c, fmt.Errorf("--cluster-cidr: %w", err)
	}
	if c.ServiceCIDRs, err = parsePrefixes(f.serviceCIDR); err != nil {
		return c, fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	for _, s := range splitList(f.nodeIPs) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("--node-ip: %w", err)
		}
		c.NodeAddresses = append(c.NodeAddresses, a)
	}
	return c, c.Validate()
}

// agent runs the proxy until ctx ends. It leaves the datapath in place when
// it exits: pinned maps and links keep serving traffic across a restart or
// an upgrade, and `xvs cleanup` is the way to remove them.
func agent(ctx context.Context, log *slog.Logger, f agentFlags, ccfg controller.Config) error {
	sel := loader.DeviceSelector{Patterns: splitList(f.devices)}
	if err := sel.Validate(); err != nil {
		return err
	}
	serveMetrics(ctx, f.mode.metricsAddr, log)
	active, err := startDatapath(log, f, &nodeEvents{node: ccfg.NodeName, file: f.mode.eventFile, log: log})
	if err != nil {
		return err
	}
	defer active.close()
	dp := active.dp
	tracker, err := controller.NewTracker(ccfg)
	if err != nil {
		return err
	}

	reported := map[string]bool{}
	sync := func(ctx context.Context) error {
		start := time.Now()
		s := tracker.Build()
		current := map[string]bool{}
		for _, p := range s.Problems {
			current[p.String()] = true
			if !reported[p.String()] {
				log.Warn("skipping bad input", "problem", p.String())
			}
		}
		reported = current
		if !s.Changed && !s.Full {
			return nil
		}
		if err := dp.Sync(ctx, s.State); err != nil {
			log.Error("datapath sync failed", "err", err)
			tracker.ForceFullSync()
			return err
		}
		for _, p := range dp.Problems() {
			log.Warn("datapath", "problem", p)
		}
		log.Debug("synced", "services", len(s.State.Services), "full", s.Full, "took", time.Since(start))
		return nil
	}
	r := runner.New(runner.Config{MinInterval: f.minSyncPeriod, MaxInterval: f.syncPeriod, RetryInterval: time.Second}, sync)

	src := controller.NewFileSource(f.objects, tracker, log)
	if _, err := src.Load(); err != nil {
		return fmt.Errorf("read %s: %w", f.objects, err)
	}
	if objs := active.objs; objs != nil { // ebpf mode
		mode := loader.AttachMode(f.tcAttach)
		atts, errs, err := objs.WatchDevices(ctx, sel, mode, func(a loader.Attachment, err error) {
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
	go func() {
		if err := src.Run(ctx, r.Run); err != nil && ctx.Err() == nil {
			log.Error("file source stopped", "err", err)
		}
	}()
	log.Info("xvs agent running", "node", ccfg.NodeName, "objects", f.objects, "mode", dp.Mode(), "pinPath", f.pinPath)
	r.Run()
	r.Loop(ctx)
	log.Info("xvs agent stopping; the datapath stays in place")
	return nil
}
