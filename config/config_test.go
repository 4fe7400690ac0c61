package config

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := &Options{}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Complete()
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// TestKubeadmConfigMap: the ConfigMap kubeadm writes (every field, mostly
// zero) decodes strictly, gets xvs's defaults and has nothing unsupported.
func TestKubeadmConfigMap(t *testing.T) {
	o, err := parse(t, "--config", "testdata/kubeadm-ipvs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Mode != ModeIPVS || c.HealthzBindAddress != DefaultHealthzBindAddress ||
		c.MetricsBindAddress != DefaultMetricsBindAddress || *c.OOMScoreAdj != -999 ||
		c.IPVS.SyncPeriod.Duration != 30*time.Second || c.IPVS.MinSyncPeriod.Duration != DefaultMinSyncPeriod ||
		c.ConfigSyncPeriod.Duration != 15*time.Minute || c.ClusterCIDR != "10.244.0.0/16" ||
		c.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" {
		t.Fatalf("effective config %+v", c)
	}
	if u := Unsupported(&c); len(u) != 0 {
		t.Fatalf("kubeadm defaults reported as unsupported: %v", u)
	}
	cc, err := o.ControllerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.PodCIDRs) != 1 || cc.PodCIDRs[0].String() != "10.244.0.0/16" || len(cc.NodeAddresses) != 0 {
		t.Fatalf("controller config %+v (bindAddress 0.0.0.0 must not become a node address)", cc)
	}
}

// TestStrictDecoding: typos, wrong kinds and wrong versions are errors.
func TestStrictDecoding(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field":   header + "mode: ebpf\nmasqueradeAl: true\n",
		"unknown nested":  header + "ipvs:\n  schedular: rr\n",
		"duplicate field": header + "mode: ebpf\nmode: ipvs\n",
		"wrong kind":      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
		"wrong version":   "apiVersion: kubeproxy.config.k8s.io/v1beta9\nkind: KubeProxyConfiguration\n",
		"not yaml":        header + "mode: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parse(t, "--config", writeConfig(t, body)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestConfigFilePrecedence: with --config the file is the configuration,
// as in kube-proxy: of the configuration flags given beside it only the
// logging flags and --hostname-override apply; the others are listed as
// ignored. xvs's own flags apply either way.
func TestConfigFilePrecedence(t *testing.T) {
	p := writeConfig(t, header+`mode: ipvs
clusterCIDR: 10.0.0.0/8
hostnameOverride: from-file
metricsBindAddress: 0.0.0.0:9999
oomScoreAdj: -500
ipvs: {scheduler: lc, syncPeriod: 1m, minSyncPeriod: 2s}
iptables: {masqueradeAll: true}
logging: {vmodule: [{filePattern: proxier, verbosity: 4}]}
`)
	o, err := parse(t, "--config", p, "--proxy-mode", "ebpf", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "127.0.0.1:1234", "-v", "4", "--vmodule", "sync=5", "--masquerade-all=false",
		"--ipvs-sync-period", "5s", "--pin-path", "/sys/fs/bpf/other")
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Mode != ModeIPVS || c.ClusterCIDR != "10.0.0.0/8" || c.HealthzBindAddress != DefaultHealthzBindAddress ||
		!c.IPTables.MasqueradeAll || c.MetricsBindAddress != "0.0.0.0:9999" || *c.OOMScoreAdj != -500 ||
		c.IPVS.Scheduler != "lc" || c.IPVS.SyncPeriod.Duration != time.Minute || c.IPVS.MinSyncPeriod.Duration != 2*time.Second {
		t.Errorf("the file's values did not win: %+v", c)
	}
	if c.Logging.Verbosity != 4 || len(c.Logging.VModule) != 2 {
		t.Errorf("logging flags not over the file: verbosity %d, vmodule %v", c.Logging.Verbosity, c.Logging.VModule)
	}
	if got := strings.Join(o.Ignored, " "); got != "proxy-mode cluster-cidr healthz-bind-address masquerade-all ipvs-sync-period" &&
		got != strings.Join(sortedCopy(o.Ignored), " ") {
		t.Errorf("ignored %q", got)
	}
	if want := []string{"cluster-cidr", "healthz-bind-address", "ipvs-sync-period", "masquerade-all", "proxy-mode"}; strings.Join(sortedCopy(o.Ignored), " ") != strings.Join(want, " ") {
		t.Errorf("ignored %v, want %v", o.Ignored, want)
	}
	if o.PinPath != "/sys/fs/bpf/other" {
		t.Errorf("xvs's own flag lost: pin path %q", o.PinPath)
	}
	if n, _ := o.NodeName(); n != "from-file" {
		t.Errorf("node name %q", n)
	}
	o, err = parse(t, "--config", p, "--hostname-override", "Flag-Node")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := o.NodeName(); n != "flag-node" || len(o.Ignored) != 0 {
		t.Errorf("--hostname-override over the file: node name %q, ignored %v", n, o.Ignored)
	}
}

// TestKubeProxyFlags: every flag of kube-proxy v1.37 is accepted, and the
// ones that set fields set them (without --config).
func TestKubeProxyFlags(t *testing.T) {
	o, err := parse(t, "--bind-address", "192.0.2.1", "--bind-address-hard-fail", "--cleanup=false",
		"--cluster-cidr", "10.244.0.0/16", "--config-sync-period", "10m", "--conntrack-max-per-core", "0",
		"--conntrack-min", "1000", "--conntrack-tcp-be-liberal", "--conntrack-tcp-timeout-close-wait", "30m",
		"--conntrack-tcp-timeout-established", "12h", "--conntrack-udp-timeout", "30s", "--conntrack-udp-timeout-stream", "2m",
		"--detect-local-mode", "ClusterCIDR", "--feature-gates", "ServiceTrafficDistribution=true",
		"--healthz-bind-address", "0.0.0.0", "--hostname-override", "n1", "--init-only=false",
		"--iptables-localhost-nodeports=false", "--iptables-masquerade-bit", "14", "--iptables-min-sync-period", "1s",
		"--iptables-sync-period", "30s", "--ipvs-exclude-cidrs", "192.0.2.0/24,198.51.100.0/24", "--ipvs-min-sync-period", "1s",
		"--ipvs-scheduler", "lc", "--ipvs-strict-arp", "--ipvs-sync-period", "1m", "--ipvs-tcp-timeout", "10m",
		"--ipvs-tcpfin-timeout", "1m", "--ipvs-udp-timeout", "1m", "--kube-api-burst", "20", "--kube-api-content-type", "application/json",
		"--kube-api-qps", "10", "--kubeconfig", "/k", "--log-flush-frequency", "5s", "--logging-format", "json",
		"--masquerade-all", "--master", "https://192.0.2.9:6443", "--metrics-bind-address", "127.0.0.1:10249",
		"--nodeport-addresses", "primary", "--oom-score-adj", "-998", "--pod-bridge-interface", "",
		"--pod-interface-name-prefix", "", "--profiling", "--proxy-mode", "ipvs", "--show-hidden-metrics-for-version", "",
		"-v", "3", "--vmodule", "", "--write-config-to", "", "--log-text-split-stream=false",
		"--log-json-split-stream=false", "--healthz-port", "10257")
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.BindAddress != "192.0.2.1" || !c.BindAddressHardFail || c.ConfigSyncPeriod.Duration != 10*time.Minute ||
		*c.Conntrack.MaxPerCore != 0 || *c.Conntrack.Min != 1000 || !c.Conntrack.TCPBeLiberal ||
		c.Conntrack.TCPCloseWaitTimeout.Duration != 30*time.Minute || c.Conntrack.TCPEstablishedTimeout.Duration != 12*time.Hour ||
		c.Conntrack.UDPTimeout.Duration != 30*time.Second || c.Conntrack.UDPStreamTimeout.Duration != 2*time.Minute ||
		c.DetectLocalMode != "ClusterCIDR" || !c.FeatureGates["ServiceTrafficDistribution"] ||
		c.HealthzBindAddress != "0.0.0.0:10257" || c.HostnameOverride != "n1" || *c.IPTables.LocalhostNodePorts ||
		len(c.IPVS.ExcludeCIDRs) != 2 || c.IPVS.Scheduler != "lc" || !c.IPVS.StrictARP || c.IPVS.SyncPeriod.Duration != time.Minute ||
		c.IPVS.TCPTimeout.Duration != 10*time.Minute || c.ClientConnection.Burst != 20 || c.ClientConnection.QPS != 10 ||
		c.ClientConnection.ContentType != "application/json" || c.ClientConnection.Kubeconfig != "/k" ||
		c.Logging.Format != "json" || c.Logging.Verbosity != 3 || !c.IPTables.MasqueradeAll || o.Master != "https://192.0.2.9:6443" ||
		c.NodePortAddresses[0] != "primary" || *c.OOMScoreAdj != -998 || !c.EnableProfiling || c.Mode != ModeIPVS {
		t.Errorf("flags not taken: %+v", c)
	}
	// A bare IP in the file takes the server's port, as in kube-proxy.
	o, err = parse(t, "--config", writeConfig(t, header+"healthzBindAddress: 0.0.0.0\nmetricsBindAddress: \"::\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Config.HealthzBindAddress != "0.0.0.0:10256" || o.Config.MetricsBindAddress != "[::]:10249" {
		t.Errorf("bare IPs: %q %q", o.Config.HealthzBindAddress, o.Config.MetricsBindAddress)
	}
	// An empty bind address given on the command line disables the server.
	if o, err = parse(t, "--metrics-bind-address", ""); err != nil || o.Config.MetricsBindAddress != "" {
		t.Errorf("metrics address %q (%v), want disabled", o.Config.MetricsBindAddress, err)
	}
	if o, err = parse(t, "--metrics-port", "0"); err != nil || o.Config.MetricsBindAddress != "" {
		t.Errorf("--metrics-port 0: metrics address %q (%v), want disabled", o.Config.MetricsBindAddress, err)
	}
}

// TestWriteConfigTo: --write-config-to writes a file --config reads back
// to the same configuration.
func TestWriteConfigTo(t *testing.T) {
	o, err := parse(t, "--proxy-mode", "ipvs", "--cluster-cidr", "10.244.0.0/16", "--conntrack-max-per-core", "0", "-v", "2")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "out.yaml")
	if err := Write(p, &o.Config); err != nil {
		t.Fatal(err)
	}
	back, err := parse(t, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	c := back.Config
	if c.Mode != ModeIPVS || c.ClusterCIDR != "10.244.0.0/16" || c.Conntrack.MaxPerCore == nil || *c.Conntrack.MaxPerCore != 0 ||
		c.Logging.Verbosity != 2 || c.IPVS.MinSyncPeriod.Duration != DefaultMinSyncPeriod {
		t.Errorf("read back %+v", c)
	}
	again := filepath.Join(t.TempDir(), "again.yaml")
	if err := Write(again, &back.Config); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(p)
	b, _ := os.ReadFile(again)
	if string(a) != string(b) {
		t.Errorf("written, read and written again differs:\n%s\n---\n%s", a, b)
	}
}

func sortedCopy(s []string) []string { return slices.Sorted(slices.Values(s)) }

// TestNoConfigFile: flags alone, with their defaults.
func TestNoConfigFile(t *testing.T) {
	o, err := parse(t, "--hostname-override", "Node-1", "--nodeport-addresses", "primary", "--ipvs-scheduler", "rr",
		"--masquerade-all", "--node-ip", "192.0.2.1,2001:db8::1", "--service-cluster-ip-range", "10.96.0.0/12")
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Mode != ModeEBPF || c.HealthzBindAddress != DefaultHealthzBindAddress || *c.OOMScoreAdj != -999 ||
		c.IPVS.MinSyncPeriod.Duration != DefaultMinSyncPeriod {
		t.Fatalf("defaults %+v", c)
	}
	cc, err := o.ControllerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cc.NodeName != "node-1" || !cc.MasqueradeAll || cc.Scheduler != "rr" || len(cc.NodeAddresses) != 2 ||
		len(cc.ServiceCIDRs) != 1 || cc.NodePortAddresses[0] != "primary" {
		t.Fatalf("controller config %+v", cc)
	}
}

// TestValidate: modes xvs does not implement and malformed values are
// refused with a message naming the field.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-mode", "iptables"}, `mode "iptables"`},
		{[]string{"--proxy-mode", "nftables"}, `mode "nftables"`},
		{[]string{"--healthz-bind-address", "10256"}, "healthz-bind-address"},
		{[]string{"--oom-score-adj", "-1001"}, "oomScoreAdj"},
		{[]string{"--cluster-cidr", "10.0.0.0/33"}, "clusterCIDR"},
		{[]string{"--min-sync-period", "1m", "--sync-period", "30s"}, "minSyncPeriod"},
	} {
		_, err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one about %s", tc.args, err, tc.want)
		}
	}
}

// TestUnsupported: every field xvs does not honour is reported when set to
// a non-default value, and only then.
func TestUnsupported(t *testing.T) {
	p := writeConfig(t, header+`mode: ebpf
iptables: {masqueradeBit: 15, localhostNodePorts: true, syncPeriod: 10s, minSyncPeriod: 1s}
nftables: {masqueradeAll: true, masqueradeBit: 14}
ipvs: {strictARP: true, excludeCIDRs: [192.0.2.0/24], tcpTimeout: 5m}
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: veth}
conntrack: {maxPerCore: 65536, min: 131072, tcpBeLiberal: true, tcpCloseWaitTimeout: 1h}
featureGates: {PreferSameTrafficDistribution: true, ServiceTrafficDistribution: false, SomeAlphaGate: true}
winkernel: {enableDSR: true}
portRange: 30000-32767
logging: {vmodule: [{filePattern: proxier, verbosity: 4}]}
`)
	o, err := parse(t, "--config", p)
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, f := range Unsupported(&o.Config) {
		fields = append(fields, f.Field)
		if f.Reason == "" || f.Value == "" {
			t.Errorf("finding without value or reason: %+v", f)
		}
	}
	want := "detectLocal.interfaceNamePrefix detectLocalMode " +
		"featureGates.ServiceTrafficDistribution featureGates.SomeAlphaGate " +
		"iptables.localhostNodePorts iptables.masqueradeBit iptables.syncPeriod " +
		"ipvs.excludeCIDRs ipvs.strictARP ipvs.tcpTimeout nftables.masqueradeAll portRange winkernel.enableDSR"
	if got := strings.Join(fields, " "); got != want {
		t.Errorf("unsupported:\n got %s\nwant %s", got, want)
	}

	// In ipvs mode the IPVS fields belong to the IPVS datapath.
	o.Config.Mode = ModeIPVS
	for _, f := range Unsupported(&o.Config) {
		if strings.HasPrefix(f.Field, "ipvs.") {
			t.Errorf("ipvs mode: %s reported", f.Field)
		}
	}
}

// TestDebugSwitchesOnlyWhenEnabled: the DaemonSet's binary (no lab tag,
// not a test binary) has no fault-injection flag; a developer build and the
// test agents enable them.
func TestDebugSwitchesOnlyWhenEnabled(t *testing.T) {
	if DebugSwitches() {
		t.Fatal("debug switches on in a binary that did not ask for them")
	}
	if _, err := parse(t, "--debug-disable-rev-nat"); err == nil || !strings.Contains(err.Error(), "unknown flag") {
		t.Fatalf("--debug-disable-rev-nat without the switches: %v, want unknown flag", err)
	}
	EnableDebugSwitches()
	defer func() { debugSwitches = false }()
	o, err := parse(t, "--debug-disable-rev-nat")
	if err != nil || !o.DisableRevNATDbg {
		t.Fatalf("--debug-disable-rev-nat with the switches: %v %+v", err, o.DisableRevNATDbg)
	}
}
