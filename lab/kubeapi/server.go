// Package kubeapi runs a real Kubernetes API server (kube-apiserver with an
// embedded etcd, one process, built from test/apiserver) for xvs's
// integration tests. No root is needed; it listens on loopback only.
//
// Typical use in a test:
//
//	srv := kubeapi.StartT(t, kubeapi.Options{})  // stopped and removed by t.Cleanup
//	srv.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
//	srv.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, ...)
//	agent := exec.Command("xvs", "agent", "--kubeconfig", srv.Kubeconfig, ...)
//
//	srv.Stop()                    // API server down (kill by PID, wait)...
//	time.Sleep(60 * time.Second)
//	srv.Restart(ctx)              // ...and back: same port, same etcd data, same tokens
//
//	// The agent's identity, for RBAC checks (impersonation by the admin):
//	sa, _ := srv.ServiceAccountClient("kube-system", "xvs")
//	kc, _ := srv.ServiceAccountKubeconfig("kube-system", "xvs") // for a process
//	// or a real token of an existing ServiceAccount (TokenRequest API):
//	cfg, _ := srv.ServiceAccountToken(ctx, "kube-system", "xvs")
//	srv.WriteKubeconfig(path, cfg)
//
//	// Manifests as `kubectl apply --server-side [--dry-run=server]` applies them:
//	objs, _ := kubeapi.DecodeManifests(yamlBytes)
//	kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: "t", DryRun: true})
//
// The process dies with the test process, however that dies (a
// parent-death signal), and Stop and Close end it by PID.
//
// Nothing derives EndpointSlices (there is no kube-controller-manager):
// tests write them as the EndpointSlice controller would. Service ClusterIPs
// come from DefaultServiceCIDRs (documentation ranges) unless
// Options.ServiceCIDRs says otherwise. The "kubernetes" Service exists but
// has no endpoints (--endpoint-reconciler-type=none, needed for a loopback
// advertise address).
//
// The binary is built on first use into a cache outside the repository
// (see Binary and Locate); `make apiserver` builds it ahead of `go test`.
// Start takes about 4 s once built, and the process about 300 MB.
package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// AdminUser is the token-file user behind Server.Config (group system:masters).
const AdminUser = "xvs-test-admin"

// DefaultServiceCIDRs is the dual-stack --service-cluster-ip-range used when
// Options.ServiceCIDRs is empty: documentation ranges, never routed anywhere.
const DefaultServiceCIDRs = "198.51.100.0/24,2001:db8:5::/112"

// Options configures Start. The zero value is ready to use.
type Options struct {
	// Dir holds keys, certificates, the token file, etcd's data, the
	// kubeconfigs and apiserver.log. Empty: a new temporary directory that
	// Close removes. A given Dir is kept.
	Dir string
	// ServiceCIDRs is --service-cluster-ip-range; DefaultServiceCIDRs if empty.
	ServiceCIDRs string
	// Args are extra kube-apiserver flags, appended after the rig's own
	// (the last occurrence of a flag wins).
	Args []string
	// Binary overrides the rig binary (default: Binary, which may build it).
	Binary string
	// ReadyTimeout bounds the wait for /readyz on each start; default 2 min.
	ReadyTimeout time.Duration
}

// Server is a running (or stopped, restartable) API server.
type Server struct {
	Dir        string
	Port       int    // secure port on 127.0.0.1; kept across Restart
	URL        string // https://127.0.0.1:Port
	Kubeconfig string // admin kubeconfig (token in group system:masters)
	Log        string // the process's combined output, appended on each start
	Config     *rest.Config
	Client     kubernetes.Interface

	bin       string
	args      []string
	files     *files
	removeDir bool
	ready     time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	werr error         // cmd.Wait's result, valid after done
}

// StartT starts a server for t and registers its Close with t.Cleanup. On
// failure it prints the log's tail and fails t. When t fails, the tail is
// logged at cleanup too.
func StartT(t testing.TB, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	s, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver %s ready in %v (pid %d, dir %s)", s.URL, time.Since(begin).Round(time.Millisecond), s.PID(), s.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log tail (%s):\n%s", s.Log, s.LogTail(4096))
		}
		if err := s.Close(); err != nil {
			t.Errorf("kube-apiserver close: %v", err)
		}
	})
	return s
}

// Start builds the binary if needed, generates the server's credentials,
// starts it on free loopback ports, waits for /readyz and writes the admin
// kubeconfig. ctx bounds the build and the wait, not the server's life:
// call Close (or Stop) to end it.
func Start(ctx context.Context, opts Options) (s *Server, err error) {
	bin := opts.Binary
	if bin == "" {
		if bin, err = Binary(ctx); err != nil {
			return nil, err
		}
	}
	s = &Server{Dir: opts.Dir, bin: bin, ready: opts.ReadyTimeout}
	if s.ready == 0 {
		s.ready = 2 * time.Minute
	}
	if s.Dir == "" {
		if s.Dir, err = os.MkdirTemp("", "xvs-kubeapi-"); err != nil {
			return nil, err
		}
		s.removeDir = true
	} else if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	srv := s // s is nil on the error returns below
	defer func() {
		if err != nil {
			srv.Close()
		}
	}()
	if s.files, err = writePKI(s.Dir); err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	s.Log = filepath.Join(s.Dir, "apiserver.log")
	s.Kubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	// Free ports are picked, released and bound again by the server: a
	// concurrent test may take one in between. Then the server exits
	// before it is ready, and new ports are tried. Over a large store
	// (100k Services seeded) the server may also exit because its
	// NodePort repair ran while the Services' watch cache was still
	// filling and did not try again within its start hook's minute; a
	// kubelet restarts such a static pod, and so does this.
	for attempt := 1; ; attempt++ {
		mark := logSize(s.Log)
		err := s.configure(opts)
		if err == nil {
			err = s.start(ctx)
		}
		if err == nil {
			return s, nil
		}
		log := s.logSince(mark)
		if attempt == 3 || !strings.Contains(log, "address already in use") && !strings.Contains(log, `"start-service-ip-repair-controllers" failed`) {
			return nil, err
		}
	}
}

// configure picks the ports and derives the arguments, the admin client
// and the kubeconfig from them.
func (s *Server) configure(opts Options) error {
	ports, err := pickPorts(3)
	if err != nil {
		return err
	}
	s.Port = ports[0]
	s.URL = "https://127.0.0.1:" + strconv.Itoa(s.Port)
	cidrs := opts.ServiceCIDRs
	if cidrs == "" {
		cidrs = DefaultServiceCIDRs
	}
	f := s.files
	s.args = append([]string{
		"-etcd-dir", f.etcd,
		"-etcd-client-port", strconv.Itoa(ports[1]),
		"-etcd-peer-port", strconv.Itoa(ports[2]),
		"--",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.Port),
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + f.certDir,
		"--tls-cert-file=" + f.servingCert,
		"--tls-private-key-file=" + f.servingKey,
		"--client-ca-file=" + f.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + f.saKey,
		"--service-account-signing-key-file=" + f.saKey,
		"--service-cluster-ip-range=" + cidrs,
		"--token-auth-file=" + f.tokens,
		"--authorization-mode=RBAC",
		// As in every real cluster (kubeadm, kind): kube-proxy's and
		// xvs's DaemonSets are privileged.
		"--allow-privileged=true",
		"--profiling=false",
	}, opts.Args...)

	caPEM, err := os.ReadFile(f.caCert)
	if err != nil {
		return err
	}
	s.Config = &rest.Config{
		Host:            s.URL,
		BearerToken:     f.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM},
		QPS:             200,
		Burst:           400,
	}
	if s.Client, err = kubernetes.NewForConfig(s.Config); err != nil {
		return err
	}
	return s.WriteKubeconfig(s.Kubeconfig, s.Config)
}

func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		return errors.New("kube-apiserver is already running")
	}
	out, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "==== xvs: start %s at %s\n", s.bin, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, and SIGKILL when the test process dies first,
	// however it dies. The kernel sends the parent-death signal when the
	// thread that forked exits (a goroutine ending while locked to its
	// thread, as namespace helpers do, ends that thread), so the fork
	// happens on a goroutine that holds its thread until the child exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			out.Close()
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		runtime.UnlockOSThread()
		out.Close()
		s.mu.Lock()
		s.werr = err
		s.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	if err := s.waitReady(ctx, done); err != nil {
		s.Stop()
		return fmt.Errorf("%w\nlog tail (%s):\n%s", err, s.Log, s.LogTail(4096))
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, s.ready)
	defer cancel()
	rc := s.Client.Discovery().RESTClient()
	var last error
	for {
		body, err := rc.Get().AbsPath("/readyz").Timeout(5 * time.Second).DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = err
		select {
		case <-exited:
			return fmt.Errorf("kube-apiserver exited before ready: %v", s.waitErr())
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %v: %v", s.ready, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Server) waitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.werr
}

// Running reports whether the process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// PID is the process id, or 0 when stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop ends the process it started, by PID: SIGTERM, SIGKILL after 20 s,
// then waits for it. The directory, port and etcd data stay for Restart.
// Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	var err error
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		err = fmt.Errorf("kube-apiserver (pid %d) ignored SIGTERM for 20s; killed", cmd.Process.Pid)
	}
	s.mu.Lock()
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	return err
}

// Restart stops the server if it runs and starts it again on the same port
// with the same etcd data, keys and tokens, so existing clients, kubeconfigs
// and watches (after their reconnect) carry on. It waits for /readyz.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

// Close stops the server and removes its directory when Start created it.
func (s *Server) Close() error {
	err := s.Stop()
	if s.removeDir {
		err = errors.Join(err, os.RemoveAll(s.Dir))
	}
	return err
}

func logSize(path string) int64 {
	if st, err := os.Stat(path); err == nil {
		return st.Size()
	}
	return 0
}

// logSince returns the log from byte offset off on.
func (s *Server) logSince(off int64) string {
	f, err := os.Open(s.Log)
	if err != nil {
		return ""
	}
	defer f.Close()
	f.Seek(off, io.SeekStart)
	b, _ := io.ReadAll(f)
	return string(b)
}

// LogTail returns up to n bytes from the end of the log.
func (s *Server) LogTail(n int64) string {
	f, err := os.Open(s.Log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// Impersonate returns a copy of the admin config acting as user with groups
// (system:authenticated is added by the server).
func (s *Server) Impersonate(user string, groups ...string) *rest.Config {
	c := rest.CopyConfig(s.Config)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return c
}

// ServiceAccountConfig acts as ServiceAccount namespace/name exactly as its
// token would: user system:serviceaccount:<ns>:<name>, groups
// system:serviceaccounts and system:serviceaccounts:<ns>. The
// ServiceAccount object need not exist (RBAC matches by name).
func (s *Server) ServiceAccountConfig(namespace, name string) *rest.Config {
	return s.Impersonate("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

// ServiceAccountClient is a clientset for ServiceAccountConfig.
func (s *Server) ServiceAccountClient(namespace, name string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(s.ServiceAccountConfig(namespace, name))
}

// ServiceAccountKubeconfig writes a kubeconfig acting as the ServiceAccount
// (see ServiceAccountConfig) into Dir and returns its path, for a process
// such as `xvs agent --kubeconfig`.
func (s *Server) ServiceAccountKubeconfig(namespace, name string) (string, error) {
	p := filepath.Join(s.Dir, "sa-"+namespace+"-"+name+".kubeconfig")
	return p, s.WriteKubeconfig(p, s.ServiceAccountConfig(namespace, name))
}

// ServiceAccountToken asks the server for a real token of an existing
// ServiceAccount (TokenRequest API, signed with the rig's key) and returns
// a config that authenticates with it, no impersonation involved.
func (s *Server) ServiceAccountToken(ctx context.Context, namespace, name string) (*rest.Config, error) {
	exp := int64(3600)
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}
	tr, err := s.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	c := rest.AnonymousClientConfig(s.Config)
	c.BearerToken = tr.Status.Token
	return c, nil
}

// WriteKubeconfig writes cfg (server, CA, bearer token, impersonation) as a
// kubeconfig file with one context.
func (s *Server) WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["xvs-test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["xvs-test"] = &clientcmdapi.AuthInfo{
		Token:             cfg.BearerToken,
		Impersonate:       cfg.Impersonate.UserName,
		ImpersonateGroups: cfg.Impersonate.Groups,
	}
	kc.Contexts["xvs-test"] = &clientcmdapi.Context{Cluster: "xvs-test", AuthInfo: "xvs-test"}
	kc.CurrentContext = "xvs-test"
	return clientcmd.WriteToFile(*kc, path)
}

// pickPorts is freePorts; tests replace it to provoke a taken port.
var pickPorts = freePorts

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
