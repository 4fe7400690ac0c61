package kubeapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestAPIServerObjectsSurviveRestart drives the real API server the way
// the agent's tests do: a Service and its EndpointSlice written with
// client-go (through the generated kubeconfig), the server stopped and
// started again on the same port and etcd data, and everything still there.
func TestAPIServerObjectsSurviveRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := StartT(t, Options{})

	cfg, err := clientcmd.BuildConfigFromFlags("", srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	svc, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !netip.MustParsePrefix("198.51.100.0/24").Contains(ip) {
		t.Fatalf("ClusterIP %q not allocated from %s", svc.Spec.ClusterIP, DefaultServiceCIDRs)
	}

	ready := true
	port, proto := int32(8080), corev1.ProtocolTCP
	slice, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "web-abc12",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "xvs-test"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"192.0.2.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   ptr("node-a"),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: &proto}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create EndpointSlice: %v", err)
	}

	pid, port0 := srv.PID(), srv.Port
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if srv.Running() || srv.PID() != 0 {
		t.Fatal("server still running after Stop")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("process %d still exists after Stop (kill 0: %v)", pid, err)
	}
	if _, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); err == nil {
		t.Fatal("a request succeeded while the server was stopped")
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.Port != port0 || srv.PID() == pid || srv.PID() == 0 {
		t.Fatalf("after Restart: port %d (was %d), pid %d (was %d)", srv.Port, port0, srv.PID(), pid)
	}
	// The old clientset, built before the restart, works unchanged.
	got, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Service after restart: %v", err)
	}
	if got.UID != svc.UID || got.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Fatalf("Service changed across restart: uid %s→%s, clusterIP %s→%s", svc.UID, got.UID, svc.Spec.ClusterIP, got.Spec.ClusterIP)
	}
	list, err := c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
	if err != nil {
		t.Fatalf("EndpointSlices after restart: %v", err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != slice.UID || list.Items[0].Endpoints[0].Addresses[0] != "192.0.2.10" {
		t.Fatalf("EndpointSlices after restart: %+v", list.Items)
	}
}

// TestAPIServerIdentities checks the rig's authentication: the admin
// token is cluster-admin, a ServiceAccount identity (impersonated, or a real
// TokenRequest token) gets only what RBAC grants it, and anonymous requests
// are refused. Close ends the process and removes its directory.
func TestAPIServerIdentities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	if _, err := srv.Client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin cannot list secrets: %v", err)
	}

	sa, err := srv.ServiceAccountClient("kube-system", "probe")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sa.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("impersonated ServiceAccount without RBAC listed services: err=%v", err)
	}
	if !strings.Contains(err.Error(), "system:serviceaccount:kube-system:probe") {
		t.Fatalf("forbidden for the wrong user: %v", err)
	}
	// Every authenticated identity may ask who it is (SelfSubjectReview):
	// the server sees the ServiceAccount user with its groups.
	who, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := who.Status.UserInfo; u.Username != "system:serviceaccount:kube-system:probe" ||
		!slices.Contains(u.Groups, "system:serviceaccounts:kube-system") {
		t.Fatalf("impersonated identity: %s %v", u.Username, u.Groups)
	}

	if _, err := srv.Client.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokCfg, err := srv.ServiceAccountToken(ctx, "kube-system", "probe")
	if err != nil {
		t.Fatal(err)
	}
	tok := kubernetes.NewForConfigOrDie(tokCfg)
	_, err = tok.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system:serviceaccount:kube-system:probe") {
		t.Fatalf("token of the ServiceAccount: want forbidden for it, got %v", err)
	}

	anon := kubernetes.NewForConfigOrDie(rest.AnonymousClientConfig(srv.Config))
	if _, err := anon.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
		t.Fatalf("anonymous list: %v", err)
	}

	pid, dir := srv.PID(), srv.Dir
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("process %d still exists after Close", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after Close", dir)
	}
}

func ptr[T any](v T) *T { return &v }

const childEnv = "XVS_KUBEAPI_TEST_CHILD"

// TestAPIServerDiesWithTestProcess: a test binary killed with SIGKILL (a
// timeout, a crash) leaves no API server behind. The test re-runs itself
// as the child that starts the server.
func TestAPIServerDiesWithTestProcess(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		runChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAPIServerDiesWithTestProcess$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	var dir string
	sc := bufio.NewScanner(stdout)
	var out strings.Builder
	for pid == 0 && sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		fmt.Sscanf(sc.Text(), "CHILD-SERVER %d %s", &pid, &dir)
	}
	if dir != "" {
		defer os.RemoveAll(dir)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if pid == 0 {
		t.Fatalf("the child started no server:\n%s%s", out.String(), stderr.String())
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL) // by PID: the server this test started
			t.Fatalf("kube-apiserver (pid %d) outlived its killed test process by 10s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func runChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CHILD-SERVER %d %s\n", srv.PID(), srv.Dir)
	time.Sleep(time.Minute) // killed by the parent before this ends
	srv.Close()
}

// TestAPIServerRetriesATakenPort: a port picked free but taken before the
// server binds it (by a concurrent test) costs a retry, not a failure.
func TestAPIServerRetriesATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[0] = port
		}
		return ports, err
	}
	defer func() { pickPorts = freePorts }()

	srv := StartT(t, Options{})
	if calls != 2 || srv.Port == port {
		t.Fatalf("%d port picks, serving on %d (the taken port is %d)", calls, srv.Port, port)
	}
	if !strings.Contains(srv.LogTail(1<<20), "address already in use") {
		t.Fatal("the first attempt did not fail on the taken port")
	}
}
