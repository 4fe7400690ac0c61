package agent

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/pflag"
	"github.com/xvs-lb/xvs/loader"
)

// parseAgentArgs is `xvs agent ARGS`'s flag handling (cmd/xvs).
func parseAgentArgs(args []string) (*Options, settings, error) {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := &Options{}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, settings{}, err
	}
	if err := o.Complete(fs); err != nil {
		return nil, settings{}, err
	}
	return o, o.settings(), nil
}

// TestAgentArgs: the agent's command line combines kube-proxy's flags,
// the --config file and xvs's own datapath flags into one configuration;
// the file's ipvs.* fields reach the IPVS datapath (the --ipvs-* flags
// beside --config are ignored, as kube-proxy ignores them).
func TestAgentArgs(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs: {scheduler: lc, strictARP: true, excludeCIDRs: [192.0.2.0/24], tcpTimeout: 15m, udpTimeout: 30s}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	o, f, err := parseAgentArgs([]string{"--config", cfg, "--objects", t.TempDir(), "--ipvs-udp-timeout", "1m",
		"--fallback", "ipvs", "--pin-path", "/sys/fs/bpf/x"})
	if err != nil {
		t.Fatal(err)
	}
	m := f.mode
	if m.proxyMode != "ipvs" || !m.ipvsStrictARP || m.ipvsExclude != "192.0.2.0/24" || m.ipvsTCP != 15*time.Minute ||
		m.ipvsUDP != 30*time.Second || m.fallback != "ipvs" || f.scheduler != "lc" || f.pinPath != "/sys/fs/bpf/x" {
		t.Fatalf("datapath settings %+v (scheduler %q, pin path %q)", m, f.scheduler, f.pinPath)
	}
	if o.Config.MetricsBindAddress != "127.0.0.1:10249" || strings.Join(o.Ignored, ",") != "ipvs-udp-timeout" {
		t.Fatalf("metrics address %q, ignored flags %v", o.Config.MetricsBindAddress, o.Ignored)
	}
	// Without --config, kube-proxy's --ipvs-* flags reach the datapath.
	if _, f, err = parseAgentArgs([]string{"--objects", t.TempDir(), "--proxy-mode", "ipvs", "--ipvs-udp-timeout", "1m",
		"--ipvs-exclude-cidrs", "192.0.2.0/24,198.51.100.0/24"}); err != nil || f.mode.ipvsUDP != time.Minute ||
		f.mode.ipvsExclude != "192.0.2.0/24,198.51.100.0/24" {
		t.Fatalf("ipvs flags: %+v %v", f.mode, err)
	}

	// Map sizes for large clusters.
	if _, f, err = parseAgentArgs([]string{"--objects", t.TempDir(), "--bpf-max-services", "131072", "--bpf-max-backends", "2097152",
		"--bpf-max-service-slots", "2097152", "--bpf-conntrack-size", "1048576"}); err != nil {
		t.Fatal(err)
	} else if z := f.mode.mapSizes; z.MaxServices != 131072 || z.MaxBackends != 2097152 || z.MaxServiceSlots != 2097152 || z.ConntrackSize != 1048576 {
		t.Errorf("map sizes %+v", z)
	}
	if _, f, _ = parseAgentArgs([]string{"--objects", t.TempDir()}); f.mode.mapSizes.MaxServices != loader.DefaultConfig().MaxServices {
		t.Errorf("default map sizes %+v", f.mode.mapSizes)
	}

	// The file's mode wins over the flag, as in kube-proxy.
	if _, f, err = parseAgentArgs([]string{"--config", cfg, "--objects", t.TempDir(), "--proxy-mode", "ebpf"}); err != nil || f.mode.proxyMode != "ipvs" {
		t.Fatalf("--proxy-mode beside --config: %q %v", f.mode.proxyMode, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy-mode", "iptables"}, `mode "iptables"`},
		{[]string{"--objects", "/tmp", "--kubeconfig", "/k"}, "alternative sources"},
		{[]string{"--fallback", "iptables"}, "--fallback"},
		{[]string{"stray"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--bpf-max-backends", "0"}, "between 1 and"},
		{[]string{"--bpf-conntrack-size", "lots"}, "between 1 and"},
		{[]string{"--first-sync-max-removed", "1.5"}, "from 0 to 1"},
		{[]string{"--first-sync-max-removed", "NaN"}, "from 0 to 1"},
	} {
		if _, _, err := parseAgentArgs(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}

// TestRestConfig: outside a cluster, with no kubeconfig or master, the
// agent says what to give instead of an opaque in-cluster error.
func TestRestConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	o, _, err := parseAgentArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restConfig(&o.Options); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("restConfig outside a cluster: %v", err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err = parseAgentArgs([]string{"--kubeconfig", kc, "--master", "https://198.51.100.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := restConfig(&o.Options)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://198.51.100.1:6443" || rc.BearerToken != "t" || rc.QPS != 5 || rc.Burst != 10 ||
		rc.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Fatalf("rest config: host %s token %q qps %v burst %d content %s", rc.Host, rc.BearerToken, rc.QPS, rc.Burst, rc.ContentType)
	}
}

// TestMemoryLimitBesideMaps: the Go heap's soft limit is taken from what
// the container's limit leaves beside the BPF maps, which the kernel
// charges to the same cgroup; a limit the maps (nearly) fill is an error,
// and no limit stays no limit.
func TestMemoryLimitBesideMaps(t *testing.T) {
	fixed := func(n uint64) memlimit.Provider { return func() (uint64, error) { return n, nil } }
	if got, err := beside(fixed(1<<30), 161<<20)(); err != nil || got != 1<<30-161<<20 {
		t.Fatalf("1 GiB beside 161 MiB of maps: %d, %v", got, err)
	}
	if got, err := beside(fixed(1<<30), 0)(); err != nil || got != 1<<30 {
		t.Fatalf("no maps: %d, %v", got, err)
	}
	if _, err := beside(fixed(200<<20), 161<<20)(); err == nil {
		t.Fatal("a 200 MiB limit beside 161 MiB of maps accepted")
	}
	if got, err := beside(fixed(math.MaxInt64), 161<<20)(); err != nil || got != math.MaxInt64 {
		t.Fatalf("no limit: %d, %v", got, err)
	}
}
