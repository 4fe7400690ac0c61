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
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

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
	// Created is how long putting the objects into the API server's etcd
	// took (before the server and the agent start; not in Ready).
	Created time.Duration
	// Scrape is one GET of /metrics after the settle, ScrapeBytes its
	// size, ScrapeRSS and ScrapeHWM the process's memory after it.
	Scrape               time.Duration
	ScrapeBytes          int
	ScrapeRSS, ScrapeHWM uint64
	// Changes are the times from an EndpointSlice update written to the
	// API server to the change in the agent's maps (api source only).
	Changes []time.Duration
}

// changeQuantiles are the p50 and p99 of Changes, false when there are
// none.
func (a agentResult) changeQuantiles() (p50, p99 time.Duration, ok bool) {
	if len(a.Changes) == 0 {
		return 0, 0, false
	}
	s := slices.Sorted(slices.Values(a.Changes))
	return percentile(s, 0.5).Round(10 * time.Microsecond), percentile(s, 0.99).Round(10 * time.Microsecond), true
}

// measureAgentProcess runs the real `xvs agent` binary (ebpf mode) on N
// Services x 10 endpoints, in a node namespace of its own, with its
// map-size flags set as docs/configuration.md advises for the size: through
// the file source at every control size, and through a real API server and
// the agent's informers at the API sizes.
func measureAgentProcess(ctx context.Context, opts Options, bin string) ([]agentResult, error) {
	var out []agentResult
	run := func(n int, source string) error {
		changes := 0
		if source == "api" && n == slices.Max(opts.Control.APISizes) {
			changes = min(opts.Control.Changes, agentChangeCount)
		}
		r, err := agentProcessAt(ctx, n, bin, source, changes)
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

// agentChangeCount bounds the changes timed through the API server, at
// its largest size (each takes over a second).
const agentChangeCount = 50

// agentSettle is how long after the last Service appears in the maps the
// agent's RSS is read.
const agentSettle = 2 * time.Second

// agentServiceCIDR holds every VIP of the benchmark (vipBase, up to a
// million Services); /12 is the widest range the API server takes.
const agentServiceCIDR = "172.16.0.0/12"

func agentProcessAt(ctx context.Context, n int, bin, source string, changes int) (res agentResult, err error) {
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
	want := n
	if source == "api" {
		want++ // and the API server's own `kubernetes` Service
	}
	sourceArgs, srv, closeSource, err := agentSource(ctx, source, dir, node, n, &res)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, closeSource()) }()
	pin := filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-agent", os.Getpid()))
	args := append([]string{"agent", "--hostname-override", "node", "--node-ip", trafficNodeIP.String(), "--pin-path", pin},
		append(sourceArgs, agentMapFlags(n)...)...)
	// $XVS_BENCH_AGENT_ARGS adds flags, for a run to profile: with
	// --profiling, `nsenter --net=/run/netns/<the bench's node netns> curl
	// 127.0.0.1:10249/debug/pprof/heap` reads the agent's heap. The report
	// says when it was set.
	args = append(args, strings.Fields(os.Getenv(envAgentArgs))...)
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
	if res.HWM, err = statusField(status, "VmHWM"); err != nil {
		return res, err
	}
	// Then a scrape of /metrics, as Prometheus makes every 15 to 30 s.
	start = time.Now()
	code, _, body, err := lab.HTTPGet(node.NS, "http://127.0.0.1:10249/metrics")
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	if err != nil {
		return res, fmt.Errorf("scrape /metrics: %w", err)
	}
	res.Scrape, res.ScrapeBytes = time.Since(start), len(body)
	time.Sleep(agentSettle)
	if res.ScrapeRSS, err = statusField(status, "VmRSS"); err != nil {
		return res, err
	}
	if res.ScrapeHWM, err = statusField(status, "VmHWM"); err != nil || srv == nil {
		return res, err
	}
	res.Changes, err = agentChanges(ctx, srv, pin, n, changes)
	return res, err
}

// agentChanges times changes through the API server: each adds an 11th
// endpoint to one Service's EndpointSlice or takes it away again (as the
// control benchmark's changes do), from the update's request to the
// Service's head in the pinned map showing the new endpoint count. The
// API server's write and watch, the agent's informer, its sync and the
// kernel's map update are all in it.
func agentChanges(ctx context.Context, srv *kubeapi.Server, pin string, n, changes int) ([]time.Duration, error) {
	m, err := maps.OpenPinned(pin)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var out []time.Duration
	for i := range changes {
		idx := (i / 2 * 7919) % n
		want := backendsPerService
		if i%2 == 0 {
			want++
		}
		sl := controlSlice(idx, want, "")
		start := time.Now()
		uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := srv.Client.DiscoveryV1().EndpointSlices(sl.Namespace).Update(uctx, sl, metav1.UpdateOptions{})
		cancel()
		if err != nil {
			return out, fmt.Errorf("change %d: %w", i, err)
		}
		if err := waitCount(m.Services, vipOf(1+idx), uint16(want), nil); err != nil {
			return out, fmt.Errorf("change %d: %w", i, err)
		}
		out = append(out, time.Since(start))
		// Past the agent's minimum sync interval (1 s by default), so
		// that no change waits for the previous one's rate limit.
		time.Sleep(1100 * time.Millisecond)
	}
	return out, nil
}

// agentServices are the benchmark's n Services with their endpoints, for
// the file source's manifests.
func agentServices(n int) []ruleService {
	svcs := trafficServices(n)
	for i := range svcs {
		svcs[i].VIP = vipOf(i)
		svcs[i].Endpoints = make([]netip.AddrPort, backendsPerService)
		for j := range backendsPerService {
			svcs[i].Endpoints[j] = netip.AddrPortFrom(addAddr(backendBase, 1+i*backendsPerService+j), trafficPodPort)
		}
	}
	return svcs
}

// apiObjects are the n Services and EndpointSlices of the api source,
// shaped as the control benchmark's (a chart's Service, the EndpointSlice
// controller's slice with 10 endpoints) and as the API server stores them
// (the fields it defaults on create are set). The API server gives its own
// `kubernetes` Service the first address of the range, vipOf(0): Service i
// is at vipOf(1+i).
func apiObjects(n int) []runtime.Object {
	objs := make([]runtime.Object, 0, 2*n)
	for i := range n {
		objs = append(objs, chartService(i, vipOf(1+i)), controlSlice(i, backendsPerService, ""))
	}
	return objs
}

// agentSource puts n Services where the agent's source reads them:
// manifests in dir ("file"), or a real API server ("api": the objects put
// straight into its etcd before it starts, that time in res.Created). It
// returns the agent's flags for that source, the API server (nil for the
// file source) and what ends it.
func agentSource(ctx context.Context, source, dir string, node *lab.Node, n int, res *agentResult) ([]string, *kubeapi.Server, func() error, error) {
	none := func() error { return nil }
	switch source {
	case "file":
		objects := filepath.Join(dir, "objects")
		if err := os.Mkdir(objects, 0o755); err != nil {
			return nil, nil, none, err
		}
		if err := writeManifests(objects, agentServices(n)); err != nil {
			return nil, nil, none, err
		}
		return []string{"--objects", objects}, nil, none, nil
	case "api":
		kdir := filepath.Join(dir, "kubeapi")
		start := time.Now()
		// Creating them through the API server would take hours at
		// 100,000 (kubeapi.Seed says why).
		if _, err := kubeapi.Seed(ctx, kdir, apiObjects(n)); err != nil {
			return nil, nil, none, err
		}
		res.Created = time.Since(start)
		srv, err := kubeapi.Start(ctx, kubeapi.Options{Dir: kdir, ServiceCIDRs: agentServiceCIDR, ReadyTimeout: 10 * time.Minute})
		if err != nil {
			return nil, nil, none, fmt.Errorf("kube-apiserver: %w", err)
		}
		// The agent lives in the node namespace, the server on the
		// host's loopback.
		ln, err := lab.ForwardInto(node.NS, net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)))
		if err != nil {
			return nil, nil, none, errors.Join(err, srv.Close())
		}
		closeAll := func() error { ln.Close(); return srv.Close() }
		if err := createNodeAndNamespace(ctx, srv.Client, "bench"); err != nil {
			err = fmt.Errorf("node and namespace: %w (server log: %s)", err, srv.LogTail(2048))
			return nil, nil, none, errors.Join(err, closeAll())
		}
		return []string{"--kubeconfig", srv.Kubeconfig}, srv, closeAll, nil
	}
	return nil, nil, none, fmt.Errorf("unknown source %q", source)
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
	if s.NodePort != 0 {
		svc.Spec.Type, svc.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, int32(s.NodePort)
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
