package deploy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/kubeapi"
)

// Documentation addresses; the ClusterIP comes from the rig's
// 198.51.100.0/24 service range.
var (
	agentNodeIP   = netip.MustParseAddr("203.0.113.2")
	agentClientIP = netip.MustParseAddr("203.0.113.50")
	agentPodIP    = netip.MustParseAddr("192.0.2.20")
)

// TestPrivDeployedAgent runs the real agent as deployed: the ConfigMap's
// config.conf (only its kubeconfig path pointed at the test's), the
// ServiceAccount's real token and the ClusterRole of rbac.yaml, nothing
// more. The agent must program a Service created through the API so that a
// client's TCP connection to the ClusterIP reaches the pod, record its
// "Starting" Event, answer /healthz on :10256, and log no authorization
// failure: the least-privilege RBAC is enough for everything it does.
func TestPrivDeployedAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces, BPF)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()

	bin := filepath.Join(dir, "xvs")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../cmd/xvs").CombinedOutput(); err != nil {
		t.Fatalf("build xvs: %v\n%s", err, out)
	}

	srv := kubeapi.StartT(t, kubeapi.Options{})
	objs, err := kubeapi.DecodeManifests(manifests(t)["rbac.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	tok, err := srv.ServiceAccountToken(ctx, saNamespace, saName)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "xvs.kubeconfig")
	if err := srv.WriteKubeconfig(kubeconfig, tok); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "config.conf")
	if err := os.WriteFile(conf, []byte(deployedConfig(t, kubeconfig)), 0o600); err != nil {
		t.Fatal(err)
	}

	l, err := lab.New(lab.UniquePrefix("dp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	node, err := l.AddNode("node", agentNodeIP)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := l.AddPod(node, "pod", agentPodIP)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lab.StartEcho(pod, netip.AddrPortFrom(agentPodIP, 8080), lab.TCP); err != nil {
		t.Fatal(err)
	}
	client, err := l.AddClient(node, "client", agentClientIP)
	if err != nil {
		t.Fatal(err)
	}
	if err := relayInto(t, node.NS, srv.Port); err != nil {
		t.Fatal(err)
	}

	// The cluster as the agent finds it: its Node, a Service and the
	// EndpointSlice the EndpointSlice controller would write.
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}
	if n, err = srv.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: agentNodeIP.String()}}
	if _, err := srv.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := srv.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, port, proto := true, int32(8080), corev1.ProtocolTCP
	if _, err := srv.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{agentPodIP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &n.Name,
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &svc.Spec.Ports[0].Name, Port: &port, Protocol: &proto}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pinPath := filepath.Join("/sys/fs/bpf", strings.TrimSuffix(l.Prefix, "-"))
	logPath := filepath.Join(dir, "agent.log")
	agent, err := lab.StartTied(node.NS, logPath, bin, "agent", "--config", conf, "--hostname-override=node", "--pin-path", pinPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agent.Stop(10 * time.Second); err != nil {
			t.Error(err)
		}
		if out, err := lab.Run(node.NS, bin, "cleanup", "--pin-path", pinPath); err != nil {
			t.Errorf("xvs cleanup: %v\n%s", err, out)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s", b)
		}
	})

	vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	var r lab.Result
	for deadline := time.Now().Add(60 * time.Second); ; {
		if ended, err := agent.Exited(); ended {
			t.Fatalf("agent exited: %v", err)
		}
		r = lab.ProbeTCP(client, agentClientIP, vip, time.Second)
		if r.Verdict == lab.OK || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.Verdict != lab.OK || r.Reply.Local != netip.AddrPortFrom(agentPodIP, 8080) {
		t.Fatalf("client → %s: %v, want the pod %s:8080", vip, r, agentPodIP)
	}

	found := false
	for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		evs, err := srv.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			found = found || (e.Reason == "Starting" && e.Regarding.Kind == "Node" && e.Regarding.Name == "node")
		}
	}
	if !found {
		t.Error(`no "Starting" Event on the Node`)
	}

	if code, body, err := httpGetIn(node.NS, "127.0.0.1:10256", "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %s %v", code, body, err)
	}
	// The DaemonSet's readiness probe: 200 once the first sync is programmed.
	readyBy := time.Now().Add(30 * time.Second)
	for {
		code, body, err := httpGetIn(node.NS, "127.0.0.1:10256", "/readyz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(readyBy) {
			t.Errorf("/readyz: %d %s %v", code, body, err)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if l := strings.ToLower(line); strings.Contains(l, "forbidden") || strings.Contains(l, "unauthorized") {
			t.Errorf("agent log: %s", line)
		}
	}
}

// deployedConfig is the ConfigMap's config.conf with its kubeconfig path
// replaced by the test's (the only change).
func deployedConfig(t *testing.T, kubeconfig string) string {
	t.Helper()
	objs, err := kubeapi.DecodeManifests(manifests(t)["configmap.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	data, _, err := unstructured.NestedString(objs[0].Object, "data", "config.conf")
	if err != nil {
		t.Fatal(err)
	}
	const from = "kubeconfig: " + kubeconfigPath
	if !strings.Contains(data, from) {
		t.Fatalf("config.conf has no %q", from)
	}
	return strings.Replace(data, from, "kubeconfig: "+kubeconfig, 1)
}

// relayInto listens on 127.0.0.1:port inside ns and relays each connection
// to the API server on 127.0.0.1:port of the test's namespace, so the
// kubeconfig (and the serving certificate's 127.0.0.1) holds in both.
func relayInto(t *testing.T, ns *lab.NS, port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return fmt.Errorf("relay in %s: %w", ns.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
	return nil
}

// httpGetIn makes one HTTP GET to addr from inside ns.
func httpGetIn(ns *lab.NS, addr, path string) (int, string, error) {
	var c net.Conn
	if err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}
