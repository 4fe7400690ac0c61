package config

import (
	"os"
	"testing"
)

// FuzzDecode: the configuration file takes any bytes without a panic, and
// what decodes goes through defaulting, validation and the unsupported
// fields report without one too; a configuration that validates survives
// Write and Load unchanged in what Validate sees.
func FuzzDecode(f *testing.F) {
	if b, err := os.ReadFile("testdata/kubeadm-ipvs.yaml"); err == nil {
		f.Add(b)
	}
	for _, seed := range []string{
		"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ebpf\n",
		"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs: {scheduler: mh, syncPeriod: -1s}\nhealthzBindAddress: 0.0.0.0\n",
		"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: \"10.0.0.0/8,fd00::/8,nope\"\nconntrack: {maxPerCore: -3}\n",
		"{\"apiVersion\":\"kubeproxy.config.k8s.io/v1alpha1\",\"kind\":\"KubeProxyConfiguration\",\"featureGates\":{\"X\":true}}",
		"kind: Pod\n",
		"\xff\xfe",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			return
		}
		SetDefaults(c)
		Unsupported(c)
		if Validate(c) != nil {
			return
		}
		path := t.TempDir() + "/config.yaml"
		if err := Write(path, c); err != nil {
			t.Fatalf("write a valid configuration: %v", err)
		}
		back, err := Load(path)
		if err != nil {
			t.Fatalf("load what Write wrote: %v", err)
		}
		SetDefaults(back)
		if err := Validate(back); err != nil {
			t.Fatalf("a valid configuration, written and loaded again, no longer validates: %v", err)
		}
	})
}
