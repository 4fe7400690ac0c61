package harness

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
)

// Single is the demo's (and the namespace tests') world: one node
// namespace running an xvs agent, backend pods with echo servers, and an
// external client, all with real sockets.
type Single struct {
	Lab     *lab.Lab
	Node    *lab.Node
	Pods    []*lab.NS
	Client  *lab.NS
	Dir     string // the agent's --objects directory
	PinPath string
	Agent   *lab.Process
	Bin     string
}

var (
	DemoVIP      = netip.MustParseAddr("172.30.0.10")
	DemoNodeIP   = netip.MustParseAddr("192.168.50.2")
	DemoClientIP = netip.MustParseAddr("192.0.2.10")
	DemoPodIPs   = []netip.Addr{
		netip.MustParseAddr("10.244.0.11"),
		netip.MustParseAddr("10.244.0.12"),
		netip.MustParseAddr("10.244.0.13"),
	}
)

const DemoBackendPort = 8080

// NewSingle builds the namespaces and starts the echo servers; bin is
// the xvs binary that will run as the agent.
func NewSingle(tag, bin string) (_ *Single, err error) {
	prefix := lab.UniquePrefix(tag)
	l, err := lab.New(prefix)
	if err != nil {
		return nil, err
	}
	s := &Single{Lab: l, Bin: bin, PinPath: filepath.Join("/sys/fs/bpf", strings.TrimSuffix(prefix, "-"))}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.Dir, err = os.MkdirTemp("", prefix); err != nil {
		return nil, err
	}
	if s.Node, err = l.AddNode("node", DemoNodeIP); err != nil {
		return nil, err
	}
	for i, ip := range DemoPodIPs {
		pod, err := l.AddPod(s.Node, fmt.Sprintf("pod%d", i+1), ip)
		if err != nil {
			return nil, err
		}
		// The bulk server also answers the echo probes.
		if _, err := lab.StartBulk(pod, netip.AddrPortFrom(ip, DemoBackendPort)); err != nil {
			return nil, err
		}
		s.Pods = append(s.Pods, pod)
	}
	if s.Client, err = l.AddClient(s.Node, "client", DemoClientIP); err != nil {
		return nil, err
	}
	return s, nil
}

// ServiceOpts vary the demo Service: annotations (scheduler, weights) and
// ClientIP affinity with a timeout in seconds (0: none).
type ServiceOpts struct {
	Annotations map[string]string
	Affinity    int
}

// writeService (re)writes the demo Service with the given endpoints. The
// file is replaced by rename, so the agent never reads half a file.
func (s *Single) WriteService(endpoints []netip.Addr) error {
	return s.WriteServiceWith(endpoints, ServiceOpts{})
}

func (s *Single) WriteServiceWith(endpoints []netip.Addr, o ServiceOpts) error {
	svc := NewService("demo", "web", DemoVIP,
		ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, Target: DemoBackendPort},
		ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, Target: DemoBackendPort})
	svc.Annotations = o.Annotations
	if o.Affinity > 0 {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
			ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(o.Affinity))}}
	}
	return WriteObjects(filepath.Join(s.Dir, "web.yaml"), svc, NewEndpointSlice(svc, "web-1", "node", endpoints...))
}

// startAgent runs `xvs agent` in the node namespace.
func (s *Single) StartAgent(extra ...string) error {
	args := append([]string{"agent", "--objects", s.Dir, "--hostname-override", "node",
		"--pin-path", s.PinPath, "--node-ip", DemoNodeIP.String()}, extra...)
	p, err := lab.Start(s.Node.NS, filepath.Join(s.Dir, "..", filepath.Base(s.Dir)+"-agent.log"), s.Bin, args...)
	if err != nil {
		return err
	}
	s.Agent = p
	return nil
}

// WaitProgrammed polls the pinned maps until the VIP's TCP port lists want
// backends, or the timeout passes.
func (s *Single) WaitProgrammed(want int, timeout time.Duration) error {
	return s.WaitCount("VIP programmed with backends", want, timeout, s.ProgrammedBackends)
}

// WaitCount polls count until it says want, failing at once when the agent
// exits and after timeout otherwise, with the agent's log.
func (s *Single) WaitCount(what string, want int, timeout time.Duration, count func() (int, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := count()
		if err == nil && n == want {
			return nil
		}
		if ended, aerr := s.Agent.Exited(); ended {
			log, _ := os.ReadFile(s.Agent.Log)
			return fmt.Errorf("agent exited (%v):\n%s", aerr, log)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.Agent.Log)
			return fmt.Errorf("%s: %d after %v, want %d (%v); agent log:\n%s", what, n, timeout, want, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Single) ProgrammedBackends() (int, error) {
	sv, err := s.Programmed()
	if err != nil || sv == nil {
		return 0, err
	}
	return len(sv.Backends), nil
}

// programmed reads the VIP's TCP port as `xvs list` shows it (nil when it
// is not programmed).
func (s *Single) Programmed() (*maps.ServiceView, error) {
	m, err := maps.OpenPinned(s.PinPath)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	snap, err := m.Read(false)
	if err != nil {
		return nil, err
	}
	for _, sv := range snap.Services {
		if sv.Address == netip.AddrPortFrom(DemoVIP, 80) && sv.Protocol == "TCP" {
			return &sv, nil
		}
	}
	return nil, nil
}

// Close stops the agent, removes the datapath (in the node namespace) and
// every namespace, file and pin the world created.
func (s *Single) Close() error {
	if s.Agent != nil {
		s.Agent.Stop(5 * time.Second)
	}
	if s.Node != nil {
		lab.Run(s.Node.NS, s.Bin, "cleanup", "--pin-path", s.PinPath)
	}
	os.RemoveAll(s.PinPath)
	err := s.Lab.Close()
	if s.Dir != "" {
		os.RemoveAll(s.Dir)
		os.Remove(filepath.Join(s.Dir, "..", filepath.Base(s.Dir)+"-agent.log"))
	}
	return err
}

// NewSingleT is NewSingle for a test: the world goes away with the test,
// and the agent's log is shown when the test failed.
func NewSingleT(t testing.TB, tag, bin string) *Single {
	t.Helper()
	w, err := NewSingle(tag, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() && w.Agent != nil {
			if log, err := os.ReadFile(w.Agent.Log); err == nil {
				t.Logf("agent log:\n%s", log)
			}
		}
		w.Close()
	})
	return w
}

// StartSingle builds the single-node world for a test (NewSingleT: tag,
// bin as the agent), writes the demo Service with every pod and starts the
// agent with agentArgs.
func StartSingle(t testing.TB, tag, bin string, agentArgs ...string) *Single {
	t.Helper()
	w := NewSingleT(t, tag, bin)
	if err := w.WriteService(DemoPodIPs); err != nil {
		t.Fatal(err)
	}
	if err := w.StartAgent(agentArgs...); err != nil {
		t.Fatal(err)
	}
	return w
}
