// Package config reads kube-proxy's configuration, a KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1) file and kube-proxy's flags, and turns
// it into what xvs runs with. Fields xvs does not honour are never dropped
// silently: Unsupported lists every one set to a value other than its
// default, and the agent logs and exports them.
//
// docs/configuration.md is the table of fields; keep the two in step.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/xvs-lb/xvs/model"
)

// Modes xvs implements. kube-proxy's own iptables, nftables and kernelspace
// are refused: running xvs means choosing xvs's datapath.
const (
	ModeEBPF = kpv1.ProxyMode(model.ModeEBPF)
	ModeIPVS = kpv1.ProxyMode(model.ModeIPVS)
)

// Defaults that differ from a zero KubeProxyConfiguration. The kube-proxy
// ones follow kube-proxy's defaulting; the sync periods are xvs's own.
const (
	DefaultHealthzBindAddress = "0.0.0.0:10256"
	DefaultMetricsBindAddress = "127.0.0.1:10249"
	DefaultOOMScoreAdj        = -999
	DefaultConfigSyncPeriod   = 15 * time.Minute
	DefaultSyncPeriod         = 30 * time.Second
	// DefaultMinSyncPeriod is short because a partial sync costs
	// O(changed Services): there is no iptables-restore to amortise.
	DefaultMinSyncPeriod = 100 * time.Millisecond
	DefaultQPS           = 5
	DefaultBurst         = 10
	DefaultContentType   = "application/vnd.kubernetes.protobuf"
)

// Load reads a KubeProxyConfiguration file. Decoding is strict: an
// unknown or duplicated field is an error (a typo must not fall back to a
// default unnoticed), as is any other apiVersion or kind.
func Load(path string) (*kpv1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func codecs() (serializer.CodecFactory, error) {
	scheme := runtime.NewScheme()
	if err := kpv1.AddToScheme(scheme); err != nil {
		return serializer.CodecFactory{}, err
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict), nil
}

// Decode is Load for bytes (YAML or JSON).
func Decode(data []byte) (*kpv1.KubeProxyConfiguration, error) {
	codecs, err := codecs()
	if err != nil {
		return nil, err
	}
	obj, gvk, err := codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decode KubeProxyConfiguration: %w", err)
	}
	c, ok := obj.(*kpv1.KubeProxyConfiguration)
	if !ok {
		return nil, fmt.Errorf("decode KubeProxyConfiguration: got %v", gvk)
	}
	return c, nil
}

// Write writes c to path as a KubeProxyConfiguration YAML file, which Load
// reads back: --write-config-to.
func Write(path string, c *kpv1.KubeProxyConfiguration) error {
	codecs, err := codecs()
	if err != nil {
		return err
	}
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		return errors.New("no YAML serializer")
	}
	out := c.DeepCopy()
	out.APIVersion, out.Kind = kpv1.SchemeGroupVersion.String(), "KubeProxyConfiguration"
	var b strings.Builder
	if err := codecs.EncoderForVersion(info.Serializer, kpv1.SchemeGroupVersion).Encode(out, &b); err != nil {
		return fmt.Errorf("encode configuration: %w", err)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// SetDefaults fills the fields xvs reads that are zero. v1alpha1 cannot
// tell "0s" from absent in durations, so a zero sync period means the
// default, as in kube-proxy.
func SetDefaults(c *kpv1.KubeProxyConfiguration) {
	if c.Mode == "" {
		c.Mode = ModeEBPF
	}
	// component-base's logging defaults (format text, a 5 s flush), as
	// kube-proxy's defaulting sets them.
	logsapi.SetRecommendedLoggingConfiguration(&c.Logging)
	// A bare IP takes the server's default port, as in kube-proxy.
	if c.HealthzBindAddress == "" {
		c.HealthzBindAddress = DefaultHealthzBindAddress
	} else {
		c.HealthzBindAddress = appendPort(c.HealthzBindAddress, 10256)
	}
	if c.MetricsBindAddress == "" {
		c.MetricsBindAddress = DefaultMetricsBindAddress
	} else {
		c.MetricsBindAddress = appendPort(c.MetricsBindAddress, 10249)
	}
	if c.OOMScoreAdj == nil {
		v := int32(DefaultOOMScoreAdj)
		c.OOMScoreAdj = &v
	}
	if c.ConfigSyncPeriod.Duration == 0 {
		c.ConfigSyncPeriod.Duration = DefaultConfigSyncPeriod
	}
	if c.IPVS.SyncPeriod.Duration == 0 {
		c.IPVS.SyncPeriod.Duration = DefaultSyncPeriod
	}
	if c.IPVS.MinSyncPeriod.Duration == 0 {
		c.IPVS.MinSyncPeriod.Duration = DefaultMinSyncPeriod
	}
	cc := &c.ClientConnection
	if cc.QPS == 0 {
		cc.QPS = DefaultQPS
	}
	if cc.Burst == 0 {
		cc.Burst = DefaultBurst
	}
	if cc.ContentType == "" {
		cc.ContentType = DefaultContentType
	}
}

// Validate rejects what kube-proxy would refuse at start-up, and modes xvs
// does not implement.
func Validate(c *kpv1.KubeProxyConfiguration) error {
	var errs []error
	if _, ok := model.ParseMode(string(c.Mode)); !ok {
		errs = append(errs, fmt.Errorf("mode %q: xvs implements %q (its eBPF datapath) and %q (the kernel IPVS fallback); "+
			"kube-proxy's iptables and nftables modes are kube-proxy's own", c.Mode, ModeEBPF, ModeIPVS))
	}
	for _, a := range []struct{ field, v string }{
		{"healthzBindAddress", c.HealthzBindAddress}, {"metricsBindAddress", c.MetricsBindAddress},
	} {
		if a.v == "" {
			continue // disabled
		}
		if _, err := netip.ParseAddrPort(a.v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want IP:port: %v", a.field, a.v, err))
		}
	}
	if c.IPVS.MinSyncPeriod.Duration > c.IPVS.SyncPeriod.Duration {
		errs = append(errs, fmt.Errorf("ipvs.minSyncPeriod (%v) must not exceed ipvs.syncPeriod (%v)",
			c.IPVS.MinSyncPeriod.Duration, c.IPVS.SyncPeriod.Duration))
	}
	if c.OOMScoreAdj != nil && (*c.OOMScoreAdj < -1000 || *c.OOMScoreAdj > 1000) {
		errs = append(errs, fmt.Errorf("oomScoreAdj %d: must be within [-1000, 1000]", *c.OOMScoreAdj))
	}
	if _, err := ParseCIDRs(c.ClusterCIDR); err != nil {
		errs = append(errs, fmt.Errorf("clusterCIDR: %w", err))
	}
	if c.BindAddress != "" {
		if _, err := netip.ParseAddr(c.BindAddress); err != nil {
			errs = append(errs, fmt.Errorf("bindAddress %q: %v", c.BindAddress, err))
		}
	}
	switch c.Logging.Format {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("logging.format %q: xvs logs text or json", c.Logging.Format))
	}
	return errors.Join(errs...)
}

// ParseCIDRs parses a comma-separated CIDR list (clusterCIDR's format, one
// per family).
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range SplitList(s) {
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, err
		}
		out = append(out, pf.Masked())
	}
	return out, nil
}

// SplitList splits a comma-separated list, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func duration(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }
