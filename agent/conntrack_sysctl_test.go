package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"
)

// TestConntrackSysctls: kube-proxy's values (its defaults, and what the
// configuration sets), written only where the file exists.
func TestConntrackSysctls(t *testing.T) {
	got := conntrackSysctls(kpv1.KubeProxyConntrackConfiguration{}, 2)
	want := map[string]string{
		"net/netfilter/nf_conntrack_max":                     "131072",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
	}
	if len(got) != len(want) {
		t.Fatalf("defaults: %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("defaults: %s=%s, want %s", k, got[k], v)
		}
	}
	zero, per := int32(0), int32(100000)
	got = conntrackSysctls(kpv1.KubeProxyConntrackConfiguration{
		MaxPerCore: &per, TCPCloseWaitTimeout: &metav1.Duration{Duration: 20 * time.Minute},
		UDPTimeout: metav1.Duration{Duration: 45 * time.Second}, TCPBeLiberal: true,
	}, 4)
	if got["net/netfilter/nf_conntrack_max"] != "400000" || got["net/netfilter/nf_conntrack_tcp_timeout_close_wait"] != "1200" ||
		got["net/netfilter/nf_conntrack_udp_timeout"] != "45" || got["net/netfilter/nf_conntrack_tcp_be_liberal"] != "1" {
		t.Fatalf("configured: %v", got)
	}
	if _, ok := conntrackSysctls(kpv1.KubeProxyConntrackConfiguration{MaxPerCore: &zero}, 4)["net/netfilter/nf_conntrack_max"]; ok {
		t.Fatal("maxPerCore 0 must leave nf_conntrack_max alone")
	}

	root := t.TempDir()
	dir := filepath.Join(root, "net/netfilter")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_close_wait"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("60\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := applyConntrackSysctls(log, root, kpv1.KubeProxyConntrackConfiguration{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "nf_conntrack_tcp_timeout_close_wait")); string(b) != "3600" {
		t.Fatalf("close_wait file holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "nf_conntrack_tcp_timeout_established")); !os.IsNotExist(err) {
		t.Fatal("a missing sysctl was created")
	}
}
