package config

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/loader"
)

// Options are the agent's command line: kube-proxy's flags (which set
// KubeProxyConfiguration fields) and xvs's own.
type Options struct {
	// ConfigFile is --config.
	ConfigFile string
	// Config is the effective KubeProxyConfiguration after Complete: the
	// file, then every flag given on the command line, then defaults.
	Config kpv1.KubeProxyConfiguration
	// Master is --master, the API server URL (overrides the kubeconfig's).
	Master string
	// Cleanup is --cleanup: remove the datapath and exit.
	Cleanup bool

	// xvs's own.
	Objects          string
	Devices          string
	XDPDevices       string
	PinPath          string
	TCAttach         string
	ServiceCIDR      string
	NodeIPs          string
	ServiceProxyName string
	DisableRevNATDbg bool

	// Flag values kept apart until Complete decides whether they override
	// the file (only when given on the command line, as kube-proxy does).
	flags struct {
		kubeconfig, hostname, mode, clusterCIDR, nodePortAddrs string
		healthz, metrics, scheduler                            string
		oomScoreAdj                                            int
		verbosity                                              uint
		minSync, sync, configSync                              time.Duration
		masqueradeAll                                          bool
	}
	fs *flag.FlagSet
}

// AddFlags registers every flag on fs. Defaults shown in --help are xvs's
// defaults; a flag overrides the config file only when it is given.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.fs = fs
	f := &o.flags
	fs.StringVar(&o.ConfigFile, "config", "", "KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file; flags given on the command line override its fields")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (clientConnection.kubeconfig); in-cluster configuration when neither it, --master nor --objects is given")
	fs.StringVar(&o.Master, "master", "", "API server address (overrides the kubeconfig's)")
	fs.StringVar(&f.hostname, "hostname-override", "", "the node's name (hostnameOverride; default: $NODE_NAME, else the host name)")
	fs.StringVar(&f.mode, "proxy-mode", "", "datapath (mode): ebpf (default) or ipvs")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "remove every xvs program, link and map (and, in ipvs mode, IPVS state) and exit")
	fs.StringVar(&f.clusterCIDR, "cluster-cidr", "", "pod CIDRs, comma-separated (clusterCIDR), for local-traffic detection")
	fs.StringVar(&f.nodePortAddrs, "nodeport-addresses", "", "NodePort addresses: 'primary' or CIDRs, comma-separated (nodePortAddresses)")
	fs.StringVar(&f.healthz, "healthz-bind-address", DefaultHealthzBindAddress, "/healthz and /livez address (healthzBindAddress); empty disables")
	fs.StringVar(&f.metrics, "metrics-bind-address", DefaultMetricsBindAddress, "/metrics and /proxyMode address (metricsBindAddress); empty disables")
	fs.IntVar(&f.oomScoreAdj, "oom-score-adj", DefaultOOMScoreAdj, "oom_score_adj of the agent (oomScoreAdj), in [-1000, 1000]")
	fs.UintVar(&f.verbosity, "v", 0, "log verbosity (logging.verbosity; 0 info, 2+ debug)")
	fs.StringVar(&f.scheduler, "ipvs-scheduler", "", "default scheduler (ipvs.scheduler; IPVS names; empty = random)")
	fs.DurationVar(&f.minSync, "min-sync-period", DefaultMinSyncPeriod, "least time between two syncs of the datapath (ipvs.minSyncPeriod)")
	fs.DurationVar(&f.sync, "sync-period", DefaultSyncPeriod, "longest time between two full syncs (ipvs.syncPeriod)")
	fs.DurationVar(&f.configSync, "config-sync-period", DefaultConfigSyncPeriod, "informer resync period (configSyncPeriod)")
	fs.BoolVar(&f.masqueradeAll, "masquerade-all", false, "SNAT all Service traffic (iptables.masqueradeAll, which kube-proxy's IPVS mode reads too)")

	fs.StringVar(&o.Objects, "objects", "", "directory of Service, EndpointSlice and Node manifests to serve instead of the API server (the file source)")
	fs.StringVar(&o.Devices, "devices", "", "comma-separated interface names or globs to attach to (default: every interface but lo, including ones created later)")
	fs.StringVar(&o.XDPDevices, "xdp-devices", "", "comma-separated external interface names or globs that also get the XDP fast path for NodePort, ExternalIP and LB traffic (default: none)")
	fs.StringVar(&o.PinPath, "pin-path", loader.DefaultPinPath, "bpffs directory for pinned maps, programs and links")
	fs.StringVar(&o.TCAttach, "tc-attach", string(loader.AttachAuto), "tc attach mode: auto (TCX where available), tcx or legacy")
	fs.StringVar(&o.ServiceCIDR, "service-cluster-ip-range", "", "service CIDRs (comma-separated)")
	fs.StringVar(&o.NodeIPs, "node-ip", "", "the node's addresses, primary first (default: bindAddress, else from the Node object)")
	fs.StringVar(&o.ServiceProxyName, "service-proxy-name", "", "handle only Services labelled service.kubernetes.io/service-proxy-name=NAME (default: only unlabelled ones)")
	fs.BoolVar(&o.DisableRevNATDbg, "debug-disable-rev-nat", false, "fault injection for conformance tests: skip reverse NAT (never in production)")
}

// Complete builds Config: the --config file if any, overridden by each
// kube-proxy flag given on the command line, then defaulted and validated.
// Call it after fs.Parse.
func (o *Options) Complete() error {
	if o.ConfigFile != "" {
		c, err := Load(o.ConfigFile)
		if err != nil {
			return err
		}
		o.Config = *c
	} else {
		// Without a file, every flag applies, defaults included.
		o.Config = kpv1.KubeProxyConfiguration{}
	}
	set := map[string]bool{}
	o.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	apply := func(name string) bool { return set[name] || o.ConfigFile == "" }

	c, f := &o.Config, &o.flags
	if apply("kubeconfig") && f.kubeconfig != "" {
		c.ClientConnection.Kubeconfig = f.kubeconfig
	}
	if apply("hostname-override") && f.hostname != "" {
		c.HostnameOverride = f.hostname
	}
	if apply("proxy-mode") && f.mode != "" {
		c.Mode = kpv1.ProxyMode(f.mode)
	}
	if apply("cluster-cidr") && f.clusterCIDR != "" {
		c.ClusterCIDR = f.clusterCIDR
	}
	if apply("nodeport-addresses") && f.nodePortAddrs != "" {
		c.NodePortAddresses = SplitList(f.nodePortAddrs)
	}
	if apply("healthz-bind-address") {
		c.HealthzBindAddress = f.healthz
	}
	if apply("metrics-bind-address") {
		c.MetricsBindAddress = f.metrics
	}
	if apply("oom-score-adj") {
		v := int32(f.oomScoreAdj)
		c.OOMScoreAdj = &v
	}
	if apply("v") {
		c.Logging.Verbosity = logVerbosity(f.verbosity)
	}
	if apply("ipvs-scheduler") && f.scheduler != "" {
		c.IPVS.Scheduler = f.scheduler
	}
	if apply("min-sync-period") {
		c.IPVS.MinSyncPeriod = duration(f.minSync)
	}
	if apply("sync-period") {
		c.IPVS.SyncPeriod = duration(f.sync)
	}
	if apply("config-sync-period") {
		c.ConfigSyncPeriod = duration(f.configSync)
	}
	if apply("masquerade-all") && f.masqueradeAll {
		c.IPTables.MasqueradeAll = true
	}
	if set["masquerade-all"] && !f.masqueradeAll {
		c.IPTables.MasqueradeAll = false
	}
	// The healthz and metrics flags default to kube-proxy's addresses,
	// so "given empty" must stay empty (disabled) while "absent from the
	// file" gets the default: SetDefaults fills only what the file left
	// empty and no flag set.
	healthzOff := set["healthz-bind-address"] && f.healthz == ""
	metricsOff := set["metrics-bind-address"] && f.metrics == ""
	SetDefaults(c)
	if healthzOff {
		c.HealthzBindAddress = ""
	}
	if metricsOff {
		c.MetricsBindAddress = ""
	}
	return Validate(c)
}

// NodeName resolves hostnameOverride as kube-proxy does, with the
// DaemonSet's NODE_NAME (downward API) before the host name.
func (o *Options) NodeName() (string, error) {
	if n := strings.TrimSpace(o.Config.HostnameOverride); n != "" {
		return strings.ToLower(n), nil
	}
	if n := strings.TrimSpace(os.Getenv("NODE_NAME")); n != "" {
		return strings.ToLower(n), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("host name: %w", err)
	}
	return strings.ToLower(h), nil
}

// ControllerConfig maps the configuration onto the translation's Config.
func (o *Options) ControllerConfig() (controller.Config, error) {
	c := &o.Config
	cc := controller.Config{
		NodePortAddresses: c.NodePortAddresses,
		Scheduler:         c.IPVS.Scheduler,
		MasqueradeAll:     c.IPTables.MasqueradeAll,
		ServiceProxyName:  o.ServiceProxyName,
	}
	var err error
	if cc.NodeName, err = o.NodeName(); err != nil {
		return cc, err
	}
	if cc.PodCIDRs, err = ParseCIDRs(c.ClusterCIDR); err != nil {
		return cc, fmt.Errorf("clusterCIDR: %w", err)
	}
	if cc.ServiceCIDRs, err = ParseCIDRs(o.ServiceCIDR); err != nil {
		return cc, fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	for _, s := range SplitList(o.NodeIPs) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return cc, fmt.Errorf("--node-ip: %w", err)
		}
		cc.NodeAddresses = append(cc.NodeAddresses, a)
	}
	// bindAddress: kube-proxy uses a non-wildcard value as the primary
	// node IP instead of the Node object's.
	if len(cc.NodeAddresses) == 0 && c.BindAddress != "" {
		if a, err := netip.ParseAddr(c.BindAddress); err == nil && !a.IsUnspecified() {
			cc.NodeAddresses = []netip.Addr{a}
		}
	}
	return cc, cc.Validate()
}

func logVerbosity(v uint) logsapi.VerbosityLevel { return logsapi.VerbosityLevel(v) }
