// Package deploy holds the manifests that install xvs in a cluster; its
// tests prove them against a real API server (lab/kubeapi).
package deploy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/xvs-lb/xvs/lab/kubeapi"
)

const fieldManager = "xvs-deploy-test"

// manifests reads every manifest file of deploy/ (kustomization.yaml is
// kustomize's, not the API server's).
func manifests(t *testing.T) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, n := range names {
		if n == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	if len(out) == 0 {
		t.Fatal("no manifests in deploy/")
	}
	return out
}

// TestAPIServerManifestsDryRun: every document of every manifest is
// accepted by the real API server (schema, defaulting, validation and
// admission, including the system-node-critical priority class) through
// server-side apply with DryRun=All, and nothing is stored.
func TestAPIServerManifestsDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := kubeapi.StartT(t, kubeapi.Options{})

	kinds := map[string]bool{}
	var ds *appsv1.DaemonSet
	for name, data := range manifests(t) {
		objs, err := kubeapi.DecodeManifests(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: fieldManager, DryRun: true})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, o := range got {
			kinds[o.GetKind()] = true
			if o.GetKind() == "DaemonSet" {
				ds = &appsv1.DaemonSet{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
					t.Fatal(err)
				}
			}
			if o.GetUID() == "" {
				t.Errorf("%s: %s %s: the server's answer has no uid", name, o.GetKind(), o.GetName())
			}
			t.Logf("%s: %s %s/%s accepted", name, o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}
	for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} {
		if !kinds[k] {
			t.Errorf("no %s among the manifests", k)
		}
	}
	// Dry run stored nothing.
	if _, err := srv.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "xvs", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet after a dry run: %v", err)
	}
	if ds == nil {
		t.FailNow()
	}

	// Pod admission sees the template only through a Pod: the priority
	// class must exist, the ServiceAccount too, privileged and host ports
	// must be allowed. Dry-run the Pod the DaemonSet controller would
	// create on a node, with the ServiceAccount in place.
	objs, err := kubeapi.DecodeManifests(manifests(t)["rbac.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "xvs-abcde", Namespace: ds.Namespace, Labels: ds.Spec.Template.Labels},
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-a"
	got, err := srv.Client.CoreV1().Pods(ds.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("the DaemonSet's Pod: %v", err)
	}
	if got.Spec.Priority == nil || *got.Spec.Priority != 2000001000 {
		t.Errorf("the DaemonSet's Pod: priority %v, want system-node-critical's 2000001000", got.Spec.Priority)
	}
}

// TestKustomizationListsEveryManifest: `kubectl apply -k deploy/` applies
// every manifest (`-f deploy/` would also read kustomization.yaml, which is
// no API object).
func TestKustomizationListsEveryManifest(t *testing.T) {
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
		Images    []struct {
			Name string `json:"name"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	var files []string
	for f := range manifests(t) {
		files = append(files, f)
	}
	slices.Sort(files)
	res := slices.Sorted(slices.Values(k.Resources))
	if !slices.Equal(files, res) {
		t.Errorf("kustomization resources %v, manifests %v", res, files)
	}
	if len(k.Images) != 1 || k.Images[0].Name != image {
		t.Errorf("kustomization images: %+v, want %s", k.Images, image)
	}
}

const image = "ghcr.io/xvs-lb/xvs"

// TestDaemonSetShape checks the DaemonSet against what the agent needs on
// a node (issue #3): the API server accepts many DaemonSets that would not
// work, so the properties are checked one by one.
func TestDaemonSetShape(t *testing.T) {
	var ds *appsv1.DaemonSet
	for _, data := range manifests(t) {
		objs, err := kubeapi.DecodeManifests(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "DaemonSet" {
				ds = &appsv1.DaemonSet{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, ds, true); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet")
	}
	p := ds.Spec.Template.Spec
	check := func(ok bool, what string) {
		t.Helper()
		if !ok {
			t.Errorf("DaemonSet: %s", what)
		}
	}
	check(ds.Namespace == "kube-system", "namespace kube-system")
	check(p.ServiceAccountName == "xvs", "serviceAccountName xvs")
	check(p.HostNetwork, "hostNetwork")
	check(p.DNSPolicy == corev1.DNSDefault, "dnsPolicy Default (the node resolver, as kube-proxy)")
	check(p.PriorityClassName == "system-node-critical", "priorityClassName system-node-critical")
	check(slices.ContainsFunc(p.Tolerations, func(t corev1.Toleration) bool {
		return t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == ""
	}), "a toleration of every taint")
	if len(p.Containers) != 1 {
		t.Fatalf("%d containers", len(p.Containers))
	}
	c := p.Containers[0]
	check(strings.HasPrefix(c.Image, image+":"), "image "+image+":<tag>")
	// Least privilege: capabilities, not privileged; what needs full root
	// is done by the init container (below).
	sc := c.SecurityContext
	check(sc != nil && (sc.Privileged == nil || !*sc.Privileged), "the agent not privileged")
	if sc != nil && sc.Capabilities != nil {
		check(slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}), "capabilities: drop ALL")
		check(slices.Equal(slices.Sorted(slices.Values(sc.Capabilities.Add)),
			[]corev1.Capability{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"}),
			"capabilities: add BPF, NET_ADMIN, PERFMON, SYS_ADMIN, and nothing else")
	} else {
		check(false, "capabilities")
	}
	cmd := append(slices.Clone(c.Command), c.Args...)
	check(len(cmd) >= 2 && filepath.Base(cmd[0]) == "xvs" && cmd[1] == "agent", "runs `xvs agent`")
	check(slices.Contains(cmd, "--config=/var/lib/xvs/config.conf"), "--config=/var/lib/xvs/config.conf")
	check(slices.Contains(cmd, "--hostname-override=$(NODE_NAME)"), "--hostname-override=$(NODE_NAME)")
	check(slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}), "NODE_NAME from spec.nodeName")
	probe := func(pr *corev1.Probe, path string) bool {
		return pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Path == path && pr.HTTPGet.Port.IntValue() == 10256
	}
	// A memory limit that holds the maps at their default sizes (161 MiB)
	// and a Go heap beside them; requests under it.
	limit, request := c.Resources.Limits.Memory(), c.Resources.Requests.Memory()
	check(limit.Value() >= 512<<20, "a memory limit of at least 512Mi (the BPF maps are charged to the container)")
	check(request.Value() > 0 && request.Cmp(*limit) <= 0, "a memory request within the limit")
	check(probe(c.LivenessProbe, "/livez"), "liveness /livez on 10256")
	check(probe(c.ReadinessProbe, "/readyz"), "readiness /readyz on 10256")

	vols := map[string]corev1.Volume{}
	for _, v := range p.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	hostPath := func(mountPath string) string {
		m, ok := mounts[mountPath]
		if !ok || vols[m.Name].HostPath == nil {
			return ""
		}
		return vols[m.Name].HostPath.Path
	}
	check(hostPath("/sys/fs/bpf") == "/sys/fs/bpf", "host /sys/fs/bpf mounted at /sys/fs/bpf")
	check(mounts["/sys/fs/bpf"].MountPropagation != nil && *mounts["/sys/fs/bpf"].MountPropagation == corev1.MountPropagationHostToContainer,
		"the agent's bpffs with HostToContainer propagation (the host's, mounted by the init container)")
	check(hostPath("/sys/fs/cgroup") == "/sys/fs/cgroup" && mounts["/sys/fs/cgroup"].ReadOnly, "host /sys/fs/cgroup mounted read-only")
	check(hostPath("/run/xvs") == "/run/xvs", "host /run/xvs mounted (IPVS mode's record of its virtual servers)")
	cm, ok := mounts["/var/lib/xvs"]
	check(ok && vols[cm.Name].ConfigMap != nil && vols[cm.Name].ConfigMap.Name == "xvs", "ConfigMap xvs at /var/lib/xvs")

	// The init container: kube-proxy's --init-only, privileged, with the
	// same configuration; its bpffs mount is the host's.
	if len(p.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the --init-only one", len(p.InitContainers))
	}
	ic := p.InitContainers[0]
	icmd := append(slices.Clone(ic.Command), ic.Args...)
	check(ic.Image == c.Image, "the init container runs the agent's image")
	check(len(icmd) >= 2 && filepath.Base(icmd[0]) == "xvs" && icmd[1] == "agent" && slices.Contains(icmd, "--init-only") &&
		slices.Contains(icmd, "--config=/var/lib/xvs/config.conf"), "init: `xvs agent --config=... --init-only`")
	check(ic.SecurityContext != nil && ic.SecurityContext.Privileged != nil && *ic.SecurityContext.Privileged, "init privileged")
	imounts := map[string]corev1.VolumeMount{}
	for _, m := range ic.VolumeMounts {
		imounts[m.MountPath] = m
	}
	check(imounts["/sys/fs/bpf"].Name == mounts["/sys/fs/bpf"].Name && imounts["/sys/fs/bpf"].MountPropagation != nil &&
		*imounts["/sys/fs/bpf"].MountPropagation == corev1.MountPropagationBidirectional,
		"init: bpffs with Bidirectional propagation (the bpffs it mounts is the host's, and the pins survive the containers)")
	check(imounts["/var/lib/xvs"].Name == cm.Name, "init: the ConfigMap at /var/lib/xvs")
	lm, ok := imounts["/lib/modules"]
	check(ok && lm.ReadOnly && vols[lm.Name].HostPath != nil && vols[lm.Name].HostPath.Path == "/lib/modules", "init: host /lib/modules read-only (ipvs mode's modprobe)")
}
