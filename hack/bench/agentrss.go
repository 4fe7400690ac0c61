package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/kubeapi"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
)

// agentResult is the real agent process at one size: from its start to
// every Service in the maps, through the file source or the API server,
// and its memory then.
type agentResult struct {
	N        int
	Source   string // "file" or "api"
	Ready    time.Duration
	RSS, HWM uint64
	// Created is how long writing the objects into the API server took
	// (before the agent starts; not in Ready).
	Created time.Duration
}

// measureAgentProcess runs the real `xvs agent` binary (ebpf mode) on N
// Services x 10 endpoints, in a node namespace of its own, with its
// map-size flags set as docs/configuration.md advises for the size: through
// the file source at every control size, and through a real API server and
// the agent's informers at the API sizes.
func measureAgentProcess(ctx context.Context, opts Options, bin string) ([]agentResult, error) {
	var out []agentResult
	run := func(n int, source string) error {
		r, err := agentProcessAt(ctx, n, bin, source)
		if err != nil {
			return fmt.Errorf("%d services (%s): %w", n, source, err)
		}
		logf(opts.Log, "control plane: the agent process at %d services (%s source): ready in %v, RSS %d MiB (peak %d MiB)", n, source, r.Ready.Round(time.Millisecond), r.RSS>>20, r.HWM>>20)
		out = append(out, r)
		return nil
	}
	for _, n := range opts.Control.APISizes {
		if err := run(n, "api"); err != nil {
			return nil, err
		}
	}
	for _, n := range opts.Control.Sizes {
		if err := run(n, "file"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// agentSettle is how long after the last Service appears in the maps the
// agent's RSS is read.
const agentSettle = 2 * time.Second

// agentServiceCIDR holds every VIP of the benchmark (vipBase, up to a
// million Services); /12 is the widest range the API server takes.
const agentServiceCIDR = "172.16.0.0/12"

func agentProcessAt(ctx context.Context, n int, bin, source string) (res agentResult, err error) {
	res.N, res.Source = n, source
	l, err := lab.New(lab.UniquePrefix("bench"))
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	node, err := l.AddNode("node", trafficNodeIP)
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "xvs-bench-agent-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	svcs, want := agentServices(n, source)
	sourceArgs, closeSource, err := agentSource(ctx, source, dir, node, svcs, &res)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, closeSource()) }()
	pin := filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-agent", os.Getpid()))
	args := append([]string{"agent", "--hostname-override", "node", "--node-ip", trafficNodeIP.String(), "--pin-path", pin},
		append(sourceArgs, agentMapFlags(n)...)...)
	start := time.Now()
	p, err := lab.StartTied(node.NS, filepath.Join(dir, "agent.log"), bin, args...)
	if err != nil {
		return res, err
	}
	defer func() {
		err = errors.Join(err, p.Stop(10*time.Second))
		if out, cerr := lab.Run(node.NS, bin, "cleanup", "--pin-path", pin); cerr != nil {
			err = errors.Join(err, fmt.Errorf("xvs cleanup: %v: %s", cerr, out))
		}
	}()
	deadline := time.Now().Add(agentReady)
	for {
		heads, err := countHeads(pin)
		if err == nil && heads == want {
			res.Ready = time.Since(start)
			break
		}
		if ended, aerr := p.Exited(); ended {
			log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
			return res, fmt.Errorf("agent exited (%v): %s", aerr, tail(string(log), 10))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, fmt.Errorf("%d of %d Services in the maps after %v (%v)", heads, want, agentReady, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The agent hands the full sync's garbage back right after its last
	// write: read RSS once that is done.
	time.Sleep(agentSettle)
	status := filepath.Join("/proc", strconv.Itoa(p.Pid()), "status")
	if res.RSS, err = statusField(status, "VmRSS"); err != nil {
		return res, err
	}
	res.HWM, err = statusField(status, "VmHWM")
	return res, err
}

// agentServices are the benchmark's n Services with their endpoints, and
// how many Services the agent is to serve. The API server gives its own
// `kubernetes` Service the first address of the range, vipOf(0): there
// the benchmark's start one later, and the agent serves that one too.
func agentServices(n int, source string) ([]ruleService, int) {
	first, want := 0, n
	if source == "api" {
		first, want = 1, n+1
	}
	svcs := trafficServices(n)
	for i := range svcs {
		svcs[i].VIP = vipOf(first + i)
		svcs[i].Endpoints = make([]netip.AddrPort, backendsPerService)
		for j := range backendsPerService {
			svcs[i].Endpoints[j] = netip.AddrPortFrom(addAddr(backendBase, 1+i*backendsPerService+j), trafficPodPort)
		}
	}
	return svcs, want
}

// agentSource puts svcs where the agent's source reads them: manifests in
// dir ("file"), or a real API server ("api", its time to create them in
// res.Created). It returns the agent's flags for that source and what
// ends it.
func agentSource(ctx context.Context, source, dir string, node *lab.Node, svcs []ruleService, res *agentResult) ([]string, func() error, error) {
	none := func() error { return nil }
	switch source {
	case "file":
		objects := filepath.Join(dir, "objects")
		if err := os.Mkdir(objects, 0o755); err != nil {
			return nil, none, err
		}
		if err := writeManifests(objects, svcs); err != nil {
			return nil, none, err
		}
		return []string{"--objects", objects}, none, nil
	case "api":
		srv, err := kubeapi.Start(ctx, kubeapi.Options{ServiceCIDRs: agentServiceCIDR})
		if err != nil {
			return nil, none, fmt.Errorf("kube-apiserver: %w", err)
		}
		// The agent lives in the node namespace, the server on the
		// host's loopback.
		ln, err := lab.ForwardInto(node.NS, net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)))
		if err != nil {
			return nil, none, errors.Join(err, srv.Close())
		}
		closeAll := func() error { ln.Close(); return srv.Close() }
		start := time.Now()
		if err := createObjects(ctx, srv.Config, svcs); err != nil {
			err = fmt.Errorf("create objects: %w (server log: %s)", err, srv.LogTail(2048))
			return nil, none, errors.Join(err, closeAll())
		}
		res.Created = time.Since(start)
		return []string{"--kubeconfig", srv.Kubeconfig}, closeAll, nil
	}
	return nil, none, fmt.Errorf("unknown source %q", source)
}

// createObjects writes the Namespace, the Node (with its InternalIP) and
// every Service and EndpointSlice into the API server, with a few writers
// in parallel and the client's rate limit lifted.
func createObjects(ctx context.Context, cfg *rest.Config, svcs []ruleService) error {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 5000, 10000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	namespaces := map[string]bool{}
	for _, s := range svcs {
		namespaces[s.Namespace] = true
	}
	for ns := range namespaces {
		if err := createNodeAndNamespace(ctx, c, ns); err != nil {
			return err
		}
	}
	return createServices(ctx, c, svcs)
}

// createNodeAndNamespace writes the Namespace and, once, the Node "node"
// with the node's address as its InternalIP.
func createNodeAndNamespace(ctx context.Context, c kubernetes.Interface, namespace string) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	node, err := c.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: trafficNodeIP.String()}}
	_, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// createServices writes every Service and its EndpointSlice, with a few
// writers in parallel.
func createServices(ctx context.Context, c kubernetes.Interface, svcs []ruleService) error {
	const writers = 8
	work := make(chan ruleService)
	errs := make(chan error, writers)
	for range writers {
		go func() {
			var first error
			for s := range work {
				if first == nil {
					first = createService(ctx, c, s)
				}
			}
			errs <- first
		}()
	}
	for _, s := range svcs {
		work <- s
	}
	close(work)
	var all error
	for range writers {
		all = errors.Join(all, <-errs)
	}
	return all
}

// createService writes one Service and its EndpointSlice, as
// writeManifests describes them.
func createService(ctx context.Context, c kubernetes.Interface, s ruleService) error {
	vip := s.VIP.String()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
			Ports: []v1.ServicePort{{Name: s.Port, Port: int32(s.VIPPort), TargetPort: intstr.FromInt32(trafficPodPort), Protocol: v1.ProtocolTCP}},
		},
	}
	if _, err := c.CoreV1().Services(s.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("service %s: %w", s.Name, err)
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name + "-1", Namespace: s.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(s.Port), Port: ptr(int32(trafficPodPort)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, ep := range s.Endpoints {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{ep.Addr().String()}, NodeName: ptr("node"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		})
	}
	if _, err := c.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("endpointslice %s: %w", sl.Name, err)
	}
	return nil
}

// countHeads counts the frontends (slot 0 of scope 0) in the pinned
// services map.
func countHeads(pin string) (int, error) {
	m, err := maps.OpenPinned(pin)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	var k xbpf.SvcKey
	var v xbpf.SvcValue
	n := 0
	it := m.Services.Iterate()
	for it.Next(&k, &v) {
		if k.Slot == 0 && k.Scope == 0 {
			n++
		}
	}
	return n, it.Err()
}

// buildXvs builds the agent binary into dir.
func buildXvs(ctx context.Context, dir string, static bool) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "xvs")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/xvs")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build xvs: %v: %s", err, out)
	}
	return bin, nil
}

// agentMapFlags sizes the agent's maps for n Services x 10 endpoints, no
// smaller than its defaults.
func agentMapFlags(n int) []string {
	def := loader.DefaultConfig()
	size := func(flag string, want int, min uint32) []string {
		return []string{flag, strconv.FormatUint(uint64(max(pow2(want), min)), 10)}
	}
	var out []string
	out = append(out, size("--bpf-max-services", n, def.MaxServices)...)
	out = append(out, size("--bpf-max-backends", n*backendsPerService, def.MaxBackends)...)
	return append(out, size("--bpf-max-service-slots", n*(1+backendsPerService), def.MaxServiceSlots)...)
}
