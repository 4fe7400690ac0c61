package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	o := &Options{}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
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

// TestFlagsOverrideConfig: a flag given on the command line wins over the
// file; one not given leaves the file's value.
func TestFlagsOverrideConfig(t *testing.T) {
	p := writeConfig(t, header+`mode: ipvs
clusterCIDR: 10.0.0.0/8
hostnameOverride: from-file
metricsBindAddress: 0.0.0.0:9999
oomScoreAdj: -500
ipvs: {scheduler: lc, syncPeriod: 1m, minSyncPeriod: 2s}
iptables: {masqueradeAll: true}
`)
	o, err := parse(t, "--config", p, "--proxy-mode", "ebpf", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "127.0.0.1:1234", "-v", "4", "--masquerade-all=false")
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Mode != ModeEBPF || c.ClusterCIDR != "10.244.0.0/16" || c.HealthzBindAddress != "127.0.0.1:1234" ||
		c.Logging.Verbosity != 4 || c.IPTables.MasqueradeAll {
		t.Errorf("flags did not override: %+v", c)
	}
	if c.HostnameOverride != "from-file" || c.MetricsBindAddress != "0.0.0.0:9999" || *c.OOMScoreAdj != -500 ||
		c.IPVS.Scheduler != "lc" || c.IPVS.SyncPeriod.Duration != time.Minute || c.IPVS.MinSyncPeriod.Duration != 2*time.Second {
		t.Errorf("file values lost to flag defaults: %+v", c)
	}
	if n, _ := o.NodeName(); n != "from-file" {
		t.Errorf("node name %q", n)
	}

	// An empty bind address given on the command line disables the server.
	o, err = parse(t, "--config", p, "--metrics-bind-address", "")
	if err != nil {
		t.Fatal(err)
	}
	if o.Config.MetricsBindAddress != "" {
		t.Errorf("metrics address %q, want disabled", o.Config.MetricsBindAddress)
	}
}

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
		{[]string{"--healthz-bind-address", "10256"}, "healthzBindAddress"},
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
		"ipvs.excludeCIDRs ipvs.strictARP ipvs.tcpTimeout logging.vmodule nftables.masqueradeAll portRange winkernel.enableDSR"
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
