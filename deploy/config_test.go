package deploy

import (
	"net/url"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/lab/kubeapi"
)

// TestConfigMapIsTheAgentsConfig reads the ConfigMap's config.conf with the
// agent's own parser (config.Load's strict decoding, defaults, validation)
// in the shipped mode and in the flip-back mode of docs/migration.md:
// every field is one xvs honours, so the agent starts without a finding.
func TestConfigMapIsTheAgentsConfig(t *testing.T) {
	objs, err := kubeapi.DecodeManifests(manifests(t)["configmap.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "ConfigMap" {
		t.Fatalf("configmap.yaml: want one ConfigMap, got %d objects", len(objs))
	}
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &cm); err != nil {
		t.Fatal(err)
	}
	data, ok := cm.Data["config.conf"]
	if !ok {
		t.Fatal("no config.conf key: the DaemonSet reads /var/lib/xvs/config.conf")
	}
	for _, mode := range []string{string(config.ModeEBPF), string(config.ModeIPVS)} {
		t.Run(mode, func(t *testing.T) {
			doc := strings.Replace(data, "mode: ebpf", "mode: "+mode, 1)
			c, err := config.Decode([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			config.SetDefaults(c)
			if err := config.Validate(c); err != nil {
				t.Fatal(err)
			}
			if f := config.Unsupported(c); len(f) > 0 {
				t.Errorf("fields xvs does not honour: %v", f)
			}
			if string(c.Mode) != mode {
				t.Errorf("mode %q, want %q", c.Mode, mode)
			}
			// Scraped and probed from outside the node's loopback.
			if c.MetricsBindAddress != "0.0.0.0:10249" || c.HealthzBindAddress != "0.0.0.0:10256" {
				t.Errorf("metrics %q, healthz %q", c.MetricsBindAddress, c.HealthzBindAddress)
			}
			if c.ClientConnection.Kubeconfig != kubeconfigPath {
				t.Errorf("clientConnection.kubeconfig %q, want the ConfigMap's %s", c.ClientConnection.Kubeconfig, kubeconfigPath)
			}
		})
	}

	// The kubeconfig: the API server's own address (never the kubernetes
	// Service's ClusterIP, which only the agent itself would serve), the
	// Pod's ServiceAccount token and CA.
	kc, err := clientcmd.Load([]byte(cm.Data["kubeconfig.conf"]))
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok || kc.Clusters[ctx.Cluster] == nil || kc.AuthInfos[ctx.AuthInfo] == nil {
		t.Fatalf("kubeconfig.conf: current context %q incomplete", kc.CurrentContext)
	}
	cluster, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	if user.TokenFile != sa+"token" || cluster.CertificateAuthority != sa+"ca.crt" {
		t.Errorf("kubeconfig.conf: token file %q, CA %q: want the ServiceAccount's", user.TokenFile, cluster.CertificateAuthority)
	}
	u, err := url.Parse(cluster.Server)
	if err != nil || u.Scheme != "https" || u.Port() == "" {
		t.Errorf("kubeconfig.conf: server %q", cluster.Server)
	}
}

// The ConfigMap is mounted at /var/lib/xvs (daemonset.yaml).
const kubeconfigPath = "/var/lib/xvs/kubeconfig.conf"
