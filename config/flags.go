package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/loader"
)

// Options are the agent's command line: every flag of kube-proxy v1.37,
// bound to a KubeProxyConfiguration as kube-proxy binds them, and xvs's
// own.
//
// Precedence is kube-proxy's: without --config the flags (and their
// defaults) are the configuration; with --config the file is, and of the
// flags that set configuration fields only the logging flags and
// --hostname-override still apply. The others given with --config are
// listed in Ignored, for the agent to log, since kube-proxy drops them
// without a word. xvs's own flags (--objects, --pin-path, ...) are not
// configuration fields and always apply.
type Options struct {
	// ConfigFile is --config.
	ConfigFile string
	// WriteConfigTo is --write-config-to: write the effective
	// configuration there and exit.
	WriteConfigTo string
	// Config is the effective KubeProxyConfiguration after Complete.
	Config kpv1.KubeProxyConfiguration
	// Master is --master, the API server URL (overrides the kubeconfig's).
	Master string
	// Cleanup is --cleanup: remove the datapath and exit.
	Cleanup bool
	// InitOnly is --init-only: the privileged set-up, then exit.
	InitOnly bool
	// Version is --version: "" (run), "true" or "raw" (print and exit).
	Version string
	// Ignored are the configuration flags given beside --config.
	Ignored []string

	// xvs's own.
	Objects          string
	Devices          string
	XDPDevices       string
	PinPath          string
	TCAttach         string
	ServiceCIDR      string
	NodeIPs          string
	ServiceProxyName string
	// MaxFrontendsPerService is --max-frontends-per-service.
	MaxFrontendsPerService int
	// FirstSyncMaxRemoved is --first-sync-max-removed.
	FirstSyncMaxRemoved float64
	// AllowExternalIPsInServiceCIDRs is --allow-external-ips-in-service-cidrs.
	AllowExternalIPsInServiceCIDRs bool
	DisableRevNATDbg               bool

	// flagConfig is what the configuration flags say, kube-proxy's
	// defaults included; Complete uses it without --config.
	flagConfig kpv1.KubeProxyConfiguration
	// Flags that are not plain configuration fields: pointer fields set
	// only when given (unset, they take kube-proxy's defaults where xvs
	// reads them), and the deprecated ports.
	hostnameOverride              string
	masqueradeBit, oomScoreAdj    int32
	ctMaxPerCore, ctMin           int32
	ctEstablished, ctCloseWait    time.Duration
	localhostNodePorts            bool
	iptablesSync, iptablesMinSync time.Duration
	healthzPort, metricsPort      int32
	fs                            *pflag.FlagSet
	// configNames are the configuration flags (AddFlags).
	configNames map[string]bool
}

// Flags that are not configuration fields: they apply with --config too.
var optionFlags = []string{
	"config", "write-config-to", "cleanup", "init-only", "master", "hostname-override", "version", "help",
	"objects", "devices", "xdp-devices", "pin-path", "tc-attach", "service-cluster-ip-range", "node-ip",
	"service-proxy-name", "debug-disable-rev-nat",
}

// AddFlags registers every flag on fs. The defaults shown in --help are
// the ones that apply without --config. Long by design: one line per flag,
// in kube-proxy's order, then xvs's own.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.fs = fs
	had := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { had[f.Name] = true })
	defer func() {
		o.configNames = map[string]bool{}
		fs.VisitAll(func(f *pflag.Flag) {
			if !had[f.Name] && !slices.Contains(optionFlags, f.Name) {
				o.configNames[f.Name] = true
			}
		})
	}()
	fc := &o.flagConfig
	fc.HealthzBindAddress, fc.MetricsBindAddress = DefaultHealthzBindAddress, DefaultMetricsBindAddress
	fc.BindAddress = "0.0.0.0"
	fc.ClientConnection.ContentType, fc.ClientConnection.QPS, fc.ClientConnection.Burst = DefaultContentType, DefaultQPS, DefaultBurst
	fc.ConfigSyncPeriod.Duration = DefaultConfigSyncPeriod
	fc.IPVS.SyncPeriod.Duration, fc.IPVS.MinSyncPeriod.Duration = DefaultSyncPeriod, DefaultMinSyncPeriod
	fc.Logging.Format = "text"
	fc.Logging.FlushFrequency.Duration.Duration = 5 * time.Second

	fs.StringVar(&o.ConfigFile, "config", "", "KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file. As with kube-proxy, the file then replaces every configuration flag but the logging flags and --hostname-override (the agent logs the ones it ignores)")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", "", "write the effective configuration (defaults included) to this file and exit")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "remove every xvs program, link and map (and, in ipvs mode, the IPVS state xvs created) and exit")
	fs.BoolVar(&o.InitOnly, "init-only", false, "apply the privileged node settings (conntrack sysctls) and exit")
	fs.Var(versionValue{&o.Version}, "version", "--version, --version=raw prints version information and quits")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.Var(cliflag.NewMapStringBool(&fc.FeatureGates), "feature-gates", "key=value pairs of kube-proxy feature gates (featureGates); xvs reports gates whose behaviour it does not have")

	fs.StringVar(&fc.ClientConnection.Kubeconfig, "kubeconfig", "", "kubeconfig file (clientConnection.kubeconfig); in-cluster configuration when neither it, --master nor --objects is given")
	fs.StringVar(&o.Master, "master", "", "API server address (overrides the kubeconfig's)")
	fs.StringVar(&fc.ClientConnection.ContentType, "kube-api-content-type", fc.ClientConnection.ContentType, "content type of requests to the API server (clientConnection.contentType)")
	fs.Int32Var(&fc.ClientConnection.Burst, "kube-api-burst", fc.ClientConnection.Burst, "burst of requests to the API server (clientConnection.burst)")
	fs.Float32Var(&fc.ClientConnection.QPS, "kube-api-qps", fc.ClientConnection.QPS, "queries per second to the API server (clientConnection.qps)")

	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "the node's name (hostnameOverride; default: $NODE_NAME, else the host name); applies with --config too")
	fs.Var(ipValue{&fc.BindAddress}, "bind-address", "the node's primary IP when not the unspecified address (bindAddress)")
	fs.Var(ipPortValue{&fc.HealthzBindAddress, 10256}, "healthz-bind-address", "/healthz and /livez address (healthzBindAddress; a bare IP takes port 10256); empty disables")
	fs.Var(ipPortValue{&fc.MetricsBindAddress, 10249}, "metrics-bind-address", "/metrics and /proxyMode address (metricsBindAddress; a bare IP takes port 10249); empty disables")
	fs.BoolVar(&fc.BindAddressHardFail, "bind-address-hard-fail", false, "exit when the healthz or metrics server cannot listen (bindAddressHardFail)")
	fs.BoolVar(&fc.EnableProfiling, "profiling", false, "serve /debug/pprof on the metrics address (enableProfiling)")
	fs.StringVar(&fc.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", "showHiddenMetricsForVersion (xvs hides no metrics)")
	fs.Var(modeValue{&fc.Mode}, "proxy-mode", "datapath (mode): ebpf (default) or ipvs")

	fs.Int32Var(&o.masqueradeBit, "iptables-masquerade-bit", 14, "iptables.masqueradeBit (xvs marks with bit 14)")
	fs.BoolVar(&fc.IPTables.MasqueradeAll, "masquerade-all", false, "SNAT all Service traffic (iptables.masqueradeAll, which kube-proxy's IPVS mode reads too)")
	fs.BoolVar(&o.localhostNodePorts, "iptables-localhost-nodeports", true, "iptables.localhostNodePorts (iptables mode only: xvs never serves NodePorts on localhost)")
	fs.DurationVar(&o.iptablesSync, "iptables-sync-period", 30*time.Second, "iptables.syncPeriod (iptables mode only: xvs reads ipvs.syncPeriod)")
	fs.DurationVar(&o.iptablesMinSync, "iptables-min-sync-period", time.Second, "iptables.minSyncPeriod (iptables mode only: xvs reads ipvs.minSyncPeriod)")
	fs.DurationVar(&fc.IPVS.SyncPeriod.Duration, "ipvs-sync-period", DefaultSyncPeriod, "longest time between two full syncs of the datapath (ipvs.syncPeriod, in every mode)")
	fs.DurationVar(&fc.IPVS.MinSyncPeriod.Duration, "ipvs-min-sync-period", DefaultMinSyncPeriod, "least time between two syncs of the datapath (ipvs.minSyncPeriod, in every mode)")
	fs.DurationVar(&fc.IPVS.SyncPeriod.Duration, "sync-period", DefaultSyncPeriod, "same as --ipvs-sync-period")
	fs.DurationVar(&fc.IPVS.MinSyncPeriod.Duration, "min-sync-period", DefaultMinSyncPeriod, "same as --ipvs-min-sync-period")
	fs.StringVar(&fc.IPVS.Scheduler, "ipvs-scheduler", "", "default scheduler (ipvs.scheduler; IPVS names; empty = random)")
	fs.StringSliceVar(&fc.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", nil, "ipvs mode: CIDRs whose virtual servers are never cleaned up (ipvs.excludeCIDRs)")
	fs.BoolVar(&fc.IPVS.StrictARP, "ipvs-strict-arp", false, "ipvs mode: arp_ignore=1, arp_announce=2 (ipvs.strictARP)")
	fs.DurationVar(&fc.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "ipvs mode: idle timeout of TCP sessions, 0 keeps the kernel's (ipvs.tcpTimeout)")
	fs.DurationVar(&fc.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "ipvs mode: timeout of TCP sessions after FIN, 0 keeps the kernel's (ipvs.tcpFinTimeout)")
	fs.DurationVar(&fc.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "ipvs mode: timeout of UDP sessions, 0 keeps the kernel's (ipvs.udpTimeout)")

	fs.Var(localModeValue{&fc.DetectLocalMode}, "detect-local-mode", "how local traffic is detected (detectLocalMode; xvs implements ClusterCIDR)")
	fs.StringVar(&fc.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "detectLocal.bridgeInterface (detectLocalMode BridgeInterface)")
	fs.StringVar(&fc.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "detectLocal.interfaceNamePrefix (detectLocalMode InterfaceNamePrefix)")
	fs.StringVar(&fc.ClusterCIDR, "cluster-cidr", "", "pod CIDRs, comma-separated (clusterCIDR), for local-traffic detection")
	fs.StringSliceVar(&fc.NodePortAddresses, "nodeport-addresses", nil, "NodePort addresses: 'primary', 'all' or CIDRs, comma-separated (nodePortAddresses)")
	fs.Int32Var(&o.oomScoreAdj, "oom-score-adj", DefaultOOMScoreAdj, "oom_score_adj of the agent (oomScoreAdj), in [-1000, 1000]")

	fs.Int32Var(&o.ctMaxPerCore, "conntrack-max-per-core", 32768, "nf_conntrack_max per CPU (conntrack.maxPerCore; 0 leaves the limit and ignores --conntrack-min)")
	fs.Int32Var(&o.ctMin, "conntrack-min", 131072, "least nf_conntrack_max (conntrack.min)")
	fs.DurationVar(&o.ctEstablished, "conntrack-tcp-timeout-established", 24*time.Hour, "idle timeout of established TCP flows, 0 leaves it (conntrack.tcpEstablishedTimeout; the host's and the eBPF conntrack's)")
	fs.DurationVar(&o.ctCloseWait, "conntrack-tcp-timeout-close-wait", time.Hour, "timeout of TCP flows in CLOSE_WAIT (conntrack.tcpCloseWaitTimeout; the host's and the eBPF conntrack's)")
	fs.BoolVar(&fc.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "nf_conntrack_tcp_be_liberal=1 (conntrack.tcpBeLiberal)")
	fs.DurationVar(&fc.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "idle timeout of unreplied UDP flows, 0 leaves it (conntrack.udpTimeout)")
	fs.DurationVar(&fc.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "idle timeout of replied UDP flows, 0 leaves it (conntrack.udpStreamTimeout)")
	fs.DurationVar(&fc.ConfigSyncPeriod.Duration, "config-sync-period", DefaultConfigSyncPeriod, "informer resync period (configSyncPeriod)")

	fs.Int32Var(&o.healthzPort, "healthz-port", 10256, "port of the health check server, 0 disables")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead")
	fs.Int32Var(&o.metricsPort, "metrics-port", 10249, "port of the metrics server, 0 disables")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead")

	// component-base's logging flags: --logging-format, -v, --vmodule,
	// --log-flush-frequency, --log-text-*; the --log-json-* ones are
	// registered there only with the JSON format's package, so here.
	addLoggingFlags(&fc.Logging, fs)

	fs.StringVar(&o.Objects, "objects", "", "directory of Service, EndpointSlice and Node manifests to serve instead of the API server (the file source)")
	fs.StringVar(&o.Devices, "devices", "", "comma-separated interface names or globs to attach to (default: every interface but lo, including ones created later)")
	fs.StringVar(&o.XDPDevices, "xdp-devices", "", "comma-separated external interface names or globs that also get the XDP fast path for NodePort, ExternalIP and LB traffic (default: none)")
	fs.StringVar(&o.PinPath, "pin-path", loader.DefaultPinPath, "bpffs directory for pinned maps, programs and links")
	fs.StringVar(&o.TCAttach, "tc-attach", string(loader.AttachAuto), "tc attach mode: auto (TCX where available), tcx or legacy")
	fs.StringVar(&o.ServiceCIDR, "service-cluster-ip-range", "", "service CIDRs (comma-separated) of the unallocated-address DROP, beside the API server's ServiceCIDR objects")
	fs.StringVar(&o.NodeIPs, "node-ip", "", "the node's addresses, primary first (default: bindAddress, else from the Node object)")
	fs.StringVar(&o.ServiceProxyName, "service-proxy-name", "", "handle only Services labelled service.kubernetes.io/service-proxy-name=NAME (default: only unlabelled ones)")
	fs.Float64Var(&o.FirstSyncMaxRemoved, "first-sync-max-removed", 0.5, "a restarted agent's first sync that would remove more than this share of the frontends programmed before (0 to 1; 1: any share) waits for a second, direct list of the API server to agree")
	fs.IntVar(&o.MaxFrontendsPerService, "max-frontends-per-service", controller.DefaultMaxFrontendsPerService, "refuse a Service whose ports on all its addresses (ClusterIPs, NodePort addresses, externalIPs, LB IPs) make more frontends than this, so one Service cannot fill the maps every Service shares (0: no limit)")
	fs.BoolVar(&o.AllowExternalIPsInServiceCIDRs, "allow-external-ips-in-service-cidrs", false, "serve externalIPs inside the service CIDRs (--service-cluster-ip-range and ServiceCIDR objects), where the API server allocates ClusterIPs; refused by default, with a Warning Event on the Service, so that a Service cannot claim another Service's address (CVE-2020-8554)")
	if debugSwitches {
		fs.BoolVar(&o.DisableRevNATDbg, "debug-disable-rev-nat", false, "fault injection for conformance tests: skip reverse NAT")
	}
}

// debugSwitches: whether this binary has the fault-injection switches
// (--debug-*, and their environment variables). Only a developer build
// (-tags lab) and the test binaries that run as the tests' agent turn them
// on, at init; the DaemonSet's binary has none, so no flag, ConfigMap edit
// or environment variable can break its datapath on purpose.
var debugSwitches bool

// EnableDebugSwitches registers the fault-injection switches from now on.
func EnableDebugSwitches() { debugSwitches = true }

// DebugSwitches reports whether the fault-injection switches are there.
func DebugSwitches() bool { return debugSwitches }

// addLoggingFlags registers component-base's logging flags bound to c:
// --logging-format, -v, --vmodule, --log-flush-frequency, --log-text-*,
// and the --log-json-* ones, which component-base registers only with its
// JSON format's package (not linked), so here.
func addLoggingFlags(c *logsapi.LoggingConfiguration, fs *pflag.FlagSet) {
	logsapi.AddFlags(c, fs)
	if fs.Lookup("log-json-split-stream") == nil {
		fs.BoolVar(&c.Options.JSON.SplitStream, "log-json-split-stream", false, "[Alpha] in JSON format, errors to stderr and info to stdout")
		fs.Var(&c.Options.JSON.InfoBufferSize, "log-json-info-buffer-size", "[Alpha] in JSON format with split streams, buffer info messages up to this size")
	}
}

// Complete builds Config, kube-proxy's way: the --config file if any
// (with the logging flags and --hostname-override given on the command
// line over it), else the flags and their defaults; then defaulted and
// validated. Call it after fs.Parse.
func (o *Options) Complete() error {
	if o.ConfigFile != "" {
		c, err := Load(o.ConfigFile)
		if err != nil {
			return err
		}
		o.Config = *c
		if err := o.loggingOverFile(); err != nil {
			return err
		}
	} else {
		o.Config = o.flagConfig
		o.fromFlags()
	}
	c := &o.Config
	if h := o.hostnameOverride; h != "" {
		if strings.TrimSpace(h) == "" {
			return fmt.Errorf("--hostname-override: empty host name")
		}
		c.HostnameOverride = strings.ToLower(strings.TrimSpace(h))
	}
	SetDefaults(c)
	if o.ConfigFile == "" {
		// An address given empty disables its server; SetDefaults
		// fills only what nobody set.
		for _, a := range []struct {
			flag string
			addr *string
		}{{"healthz-bind-address", &c.HealthzBindAddress}, {"metrics-bind-address", &c.MetricsBindAddress}} {
			if o.fs.Changed(a.flag) && o.fs.Lookup(a.flag).Value.String() == "" {
				*a.addr = ""
			}
		}
		o.deprecatedPorts()
	}
	if !(o.FirstSyncMaxRemoved >= 0 && o.FirstSyncMaxRemoved <= 1) {
		return fmt.Errorf("--first-sync-max-removed %v: want a share from 0 to 1", o.FirstSyncMaxRemoved)
	}
	return Validate(c)
}

// fromFlags sets, without --config, the fields whose flags are not bound
// to them directly: the pointer fields only when given (kube-proxy's
// defaults apply to them when unset), and the iptables sync periods.
func (o *Options) fromFlags() {
	c, ch := &o.Config, o.fs.Changed
	ptr32 := func(name string, v int32) *int32 {
		if ch(name) {
			return &v
		}
		return nil
	}
	dur := func(name string, d time.Duration) *metav1.Duration {
		if ch(name) {
			return &metav1.Duration{Duration: d}
		}
		return nil
	}
	c.IPTables.MasqueradeBit = ptr32("iptables-masquerade-bit", o.masqueradeBit)
	c.OOMScoreAdj = ptr32("oom-score-adj", o.oomScoreAdj)
	c.Conntrack.MaxPerCore = ptr32("conntrack-max-per-core", o.ctMaxPerCore)
	c.Conntrack.Min = ptr32("conntrack-min", o.ctMin)
	c.Conntrack.TCPEstablishedTimeout = dur("conntrack-tcp-timeout-established", o.ctEstablished)
	c.Conntrack.TCPCloseWaitTimeout = dur("conntrack-tcp-timeout-close-wait", o.ctCloseWait)
	if ch("iptables-localhost-nodeports") {
		c.IPTables.LocalhostNodePorts = &o.localhostNodePorts
	}
	if ch("iptables-sync-period") {
		c.IPTables.SyncPeriod.Duration = o.iptablesSync
	}
	if ch("iptables-min-sync-period") {
		c.IPTables.MinSyncPeriod.Duration = o.iptablesMinSync
	}
}

// deprecatedPorts applies kube-proxy's deprecated --healthz-port and
// --metrics-port, given without --config: the address's host with that
// port, 0 disabling the server.
func (o *Options) deprecatedPorts() {
	c, ch := &o.Config, o.fs.Changed
	for _, p := range []struct {
		flag string
		port int32
		addr *string
	}{{"healthz-port", o.healthzPort, &c.HealthzBindAddress}, {"metrics-port", o.metricsPort, &c.MetricsBindAddress}} {
		if !ch(p.flag) {
			continue
		}
		if p.port == 0 {
			*p.addr = ""
			continue
		}
		if ap, err := netip.ParseAddrPort(*p.addr); err == nil {
			*p.addr = netip.AddrPortFrom(ap.Addr(), uint16(p.port)).String()
		}
	}
}

// loggingOverFile copies the logging flags given on the command line over
// the file's logging section, as kube-proxy does (--config ... -v=4
// works; --vmodule entries are added to the file's), and lists the other
// configuration flags given in Ignored.
func (o *Options) loggingOverFile() error {
	var over pflag.FlagSet
	to := &o.Config.Logging
	vmodule := to.VModule
	to.VModule = nil
	addLoggingFlags(to, &over)
	// The other configuration flags given are ignored, as kube-proxy
	// ignores them.
	o.Ignored = nil
	o.fs.Visit(func(f *pflag.Flag) {
		if o.configNames[f.Name] && over.Lookup(f.Name) == nil {
			o.Ignored = append(o.Ignored, f.Name)
		}
	})
	var err error
	over.VisitAll(func(f *pflag.Flag) {
		if given := o.fs.Lookup(f.Name); err == nil && given != nil && given.Changed {
			if serr := f.Value.Set(given.Value.String()); serr != nil {
				err = fmt.Errorf("--%s: %w", f.Name, serr)
			}
		}
	})
	to.VModule = append(to.VModule, vmodule...)
	return err
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
		NodePortAddresses:      c.NodePortAddresses,
		Scheduler:              c.IPVS.Scheduler,
		MasqueradeAll:          c.IPTables.MasqueradeAll,
		ServiceProxyName:       o.ServiceProxyName,
		MaxFrontendsPerService: o.MaxFrontendsPerService,

		AllowExternalIPsInServiceCIDRs: o.AllowExternalIPsInServiceCIDRs,
	}
	if o.MaxFrontendsPerService < 0 {
		return cc, fmt.Errorf("--max-frontends-per-service %d: want 0 (no limit) or more", o.MaxFrontendsPerService)
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

// Flag values checked as kube-proxy's are: an IP, an IP:port (a bare IP
// takes the server's port), the two enumerations.
type (
	ipValue     struct{ p *string }
	ipPortValue struct {
		p    *string
		port uint16
	}
	modeValue      struct{ p *kpv1.ProxyMode }
	localModeValue struct{ p *kpv1.LocalMode }
	versionValue   struct{ p *string }
)

func (v ipValue) String() string { return *v.p }
func (v ipValue) Type() string   { return "ip" }
func (v ipValue) Set(s string) error {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not an IP address", s)
	}
	*v.p = a.String()
	return nil
}

func (v ipPortValue) String() string { return *v.p }
func (v ipPortValue) Type() string   { return "ipport" }
func (v ipPortValue) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "" {
		*v.p = ""
		return nil
	}
	s = appendPort(s, v.port)
	if _, err := netip.ParseAddrPort(s); err != nil {
		return fmt.Errorf("%q is not IP or IP:port", s)
	}
	*v.p = s
	return nil
}

func (v modeValue) String() string { return string(*v.p) }
func (v modeValue) Type() string   { return "ProxyMode" }
func (v modeValue) Set(s string) error {
	*v.p = kpv1.ProxyMode(s)
	return nil
}

func (v localModeValue) String() string { return string(*v.p) }
func (v localModeValue) Type() string   { return "LocalMode" }
func (v localModeValue) Set(s string) error {
	*v.p = kpv1.LocalMode(s)
	return nil
}

func (v versionValue) String() string { return *v.p }
func (v versionValue) Type() string   { return "version" }
func (v versionValue) Set(s string) error {
	switch s {
	case "true", "raw":
		*v.p = s
	case "false":
		*v.p = ""
	default:
		return fmt.Errorf("%q: want true, false or raw", s)
	}
	return nil
}

// appendPort gives a bare IP (v4, or v6 with or without brackets) the
// port, as kube-proxy's defaulting does for healthzBindAddress and
// metricsBindAddress.
func appendPort(s string, port uint16) string {
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a, port).String()
	}
	return s
}
