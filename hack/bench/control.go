package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"gonum.org/v1/plot/plotter"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/controller/runner"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// The control-plane goals.
const (
	goalSyncTime  = 10 * time.Second
	goalRSS       = 500 << 20
	goalChangeP99 = 50 * time.Millisecond
	// controlMinSync is the agent's default --min-sync-period; changes are
	// spaced a little wider so that none waits for the rate limit.
	controlMinSync = 100 * time.Millisecond
)

// ControlOptions shape the control-plane part of a run.
type ControlOptions struct {
	// Sizes are the numbers of Services (10 endpoints each) to sync; none
	// skips the control-plane benchmark.
	Sizes []int
	// Changes is how many single-EndpointSlice changes are timed at the
	// largest size.
	Changes int
	// Profile, if set, writes a CPU profile of the largest size's child.
	Profile string
	// APISizes are the numbers of Services the real agent process reads
	// through a kube-apiserver (lab/kubeapi) and its informers; the other
	// sizes go through the file source.
	APISizes []int
}

func (o ControlOptions) validate() error {
	for _, n := range o.Sizes {
		if n < 1 || n > maxServices {
			return fmt.Errorf("control size %d is outside 1..%d", n, maxServices)
		}
	}
	if len(o.Sizes) > 0 && o.Changes < 1 {
		return errors.New("control: changes must be positive")
	}
	return nil
}

// controlChildArg makes the benchmark binary (or its test binary) run one
// control-plane measurement as a fresh process, so that its RSS is that
// size's alone.
const controlChildArg = "__xvs_bench_control_child"

// controlResult is what a child measured at one size.
type controlResult struct {
	N        int
	Handlers time.Duration // feeding every Service and EndpointSlice to the Tracker
	Build    time.Duration // Tracker.Build of the first State
	Sync     time.Duration // reconcile.Datapath.Sync into empty maps
	// CPU and SyncCPU are the process's user+system time over handlers,
	// build and sync, and over the sync alone: unlike wall time, other
	// tenants of the machine do not add to them.
	CPU, SyncCPU time.Duration
	// ChangeBuild and ChangeSync split the changes' syncs into
	// Tracker.Build and reconcile.Datapath.Sync.
	ChangeBuild, ChangeSync []time.Duration
	RSS                     uint64 // VmRSS right after the sync
	HWM                     uint64 // VmHWM: the peak resident set of the process
	Heap                    uint64 // live Go heap after the sync and a GC
	// ObjectsHeap is the live heap the Service and EndpointSlice objects
	// take (an informer cache holds the same), measured before the
	// tracker sees them.
	ObjectsHeap uint64
	Changes     []time.Duration
}

func (r controlResult) Total() time.Duration { return r.Handlers + r.Build + r.Sync }

// measureControl runs one child per size, largest last; only the largest
// times EndpointSlice changes.
func measureControl(ctx context.Context, opts Options) ([]controlResult, error) {
	sizes := slices.Compact(slices.Sorted(slices.Values(opts.Control.Sizes)))
	if len(sizes) == 0 {
		return nil, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "xvs-bench-control-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var out []controlResult
	for i, n := range sizes {
		changes, profile := 0, ""
		if i == len(sizes)-1 {
			changes, profile = opts.Control.Changes, opts.Control.Profile
		}
		logf(opts.Log, "control plane: %d services x %d endpoints in a child process", n, backendsPerService)
		path := filepath.Join(dir, strconv.Itoa(n)+".json")
		args := []string{controlChildArg, "-n", strconv.Itoa(n), "-changes", strconv.Itoa(changes), "-out", path}
		if profile != "" {
			args = append(args, "-cpuprofile", profile)
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%d services: %v: %s", n, err, stderr.String())
		}
		var r controlResult
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err != nil {
			return nil, fmt.Errorf("%d services: read result: %w", n, err)
		}
		logf(opts.Log, "control plane: %d services: handlers %v, build %v, sync %v (CPU %v, sync %v); RSS %d MiB (peak %d MiB)",
			n, r.Handlers.Round(time.Millisecond), r.Build.Round(time.Millisecond), r.Sync.Round(time.Millisecond),
			r.CPU.Round(time.Millisecond), r.SyncCPU.Round(time.Millisecond), r.RSS>>20, r.HWM>>20)
		if len(r.Changes) > 0 {
			s := slices.Sorted(slices.Values(r.Changes))
			logf(opts.Log, "control plane: %d services: one EndpointSlice change to the maps: p50 %v, p99 %v", n, percentile(s, 0.5), percentile(s, 0.99))
		}
		out = append(out, r)
	}
	return out, nil
}

// controlChild is the child's main: it loads fresh objects, feeds n
// Services and their EndpointSlices through the agent's Tracker, builds
// and syncs, reports the time and memory, then times changes.
func controlChild(args []string) error {
	fs := flag.NewFlagSet(controlChildArg, flag.ContinueOnError)
	n := fs.Int("n", 1000, "services")
	changes := fs.Int("changes", 0, "EndpointSlice changes to time")
	out := fs.String("out", "", "result file")
	cpuprofile := fs.String("cpuprofile", "", "CPU profile of the full sync")
	memprofile := fs.String("memprofile", "", "heap profile right after the full sync")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	r, err := runControl(context.Background(), *n, *changes, *memprofile)
	if err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

func runControl(ctx context.Context, n, changes int, memprofile string) (res controlResult, err error) {
	res.N = n
	cfg := loader.DefaultConfig()
	cfg.PinPath = filepath.Join(pinRoot, fmt.Sprintf("xvs-bench-%d-control", os.Getpid()))
	cfg.MaxServiceSlots = max(cfg.MaxServiceSlots, pow2(n*(2+backendsPerService)))
	cfg.MaxServices = max(cfg.MaxServices, pow2(n))
	cfg.MaxBackends = max(cfg.MaxBackends, pow2(n*(1+backendsPerService)))
	_ = os.RemoveAll(cfg.PinPath)
	defer func() { err = errors.Join(err, os.RemoveAll(cfg.PinPath)) }()
	objs, err := loader.Load(cfg)
	if err != nil {
		return res, err
	}
	defer objs.Close()
	dp, err := reconcile.NewDatapath(maps.FromObjects(objs), reconcile.Config{MaxServices: cfg.MaxServices, MaxBackends: cfg.MaxBackends})
	if err != nil {
		return res, err
	}
	tracker, err := controller.NewTracker(controller.Config{NodeName: "node"})
	if err != nil {
		return res, err
	}
	slicesByIdx, err := res.initialSync(ctx, tracker, dp, n, memprofile)
	if err != nil || changes == 0 {
		return res, err
	}
	return res, res.applyChanges(ctx, tracker, dp, objs, slicesByIdx, changes)
}

// initialSync measures what an informer's initial list costs: every
// object through the handlers, then one Build and one Sync; and the
// memory held after it. It returns the EndpointSlices, by Service.
func (res *controlResult) initialSync(ctx context.Context, tracker *controller.Tracker, dp *reconcile.Datapath, n int, memprofile string) ([]*controller.Slice, error) {
	var err error
	// The agent collects harder from its start until the first sync is
	// applied (agent.syncer.lowerGC); the objects stand in for its
	// informers' initial list.
	restoreGC := controller.LowerGCTarget()
	base := liveHeap()
	svcs, slicesByIdx := controlObjects(n)
	res.ObjectsHeap = liveHeap() - base
	debug.FreeOSMemory()

	start, cpu0 := time.Now(), processCPU()
	for i := range n {
		tracker.OnServiceAdd(svcs[i])
		tracker.OnSliceAdd(slicesByIdx[i])
	}
	res.Handlers = time.Since(start)
	start = time.Now()
	s := tracker.Build()
	res.Build = time.Since(start)
	if len(s.Problems) > 0 {
		return nil, fmt.Errorf("tracker problems: %v", s.Problems[:min(3, len(s.Problems))])
	}
	if len(s.State.Services) != n {
		return nil, fmt.Errorf("tracker built %d service ports, want %d", len(s.State.Services), n)
	}
	start, cpu1 := time.Now(), processCPU()
	if err := dp.Sync(ctx, s.State); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	res.Sync = time.Since(start)
	res.SyncCPU, res.CPU = processCPU()-cpu1, processCPU()-cpu0
	if p := dp.Problems(); len(p) > 0 {
		return nil, fmt.Errorf("sync problems: %v", p)
	}
	// As the agent does after a full sync (agent/sync.go).
	debug.FreeOSMemory()
	restoreGC()
	if res.RSS, err = procStatus("VmRSS"); err != nil {
		return nil, err
	}
	res.Heap = liveHeap()
	if res.HWM, err = procStatus("VmHWM"); err != nil {
		return nil, err
	}
	if memprofile != "" {
		if err := writeHeapProfile(memprofile); err != nil {
			return nil, err
		}
	}
	return slicesByIdx, nil
}

// applyChanges measures changes updates of one Service's endpoints
// through the agent's loop, each until the maps show it.
func (res *controlResult) applyChanges(ctx context.Context, tracker *controller.Tracker, dp *reconcile.Datapath, objs *loader.Objects, slicesByIdx []*controller.Slice, changes int) error {
	n := len(slicesByIdx)
	// The agent's loop: a bounded-frequency runner around Build + Sync.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	syncErr := make(chan error, 1)
	r := runner.New(runner.Config{MinInterval: controlMinSync, MaxInterval: time.Hour}, func(ctx context.Context) error {
		t0 := time.Now()
		s := tracker.Build()
		if !s.Changed && !s.Full {
			return nil
		}
		t1 := time.Now()
		err := dp.Sync(ctx, s.State)
		// Read only after the changes, once this goroutine is idle.
		res.ChangeBuild, res.ChangeSync = append(res.ChangeBuild, t1.Sub(t0)), append(res.ChangeSync, time.Since(t1))
		if err != nil {
			select {
			case syncErr <- err:
			default:
			}
		}
		return err
	})
	loopDone := make(chan struct{})
	go func() {
		r.Loop(rctx)
		close(loopDone)
	}()
	// The runner's goroutine writes res's change splits: stop it before
	// res is returned.
	defer func() {
		cancel()
		<-loopDone
	}()
	for i := range changes {
		// Alternately add an 11th endpoint to a Service and take it away:
		// the head's endpoint count says when the change is in the maps.
		idx := (i / 2 * 7919) % n
		old := slicesByIdx[idx]
		want := uint16(backendsPerService)
		if i%2 == 0 {
			want++
		}
		start := time.Now()
		// The informer's work is in the figure: the update arrives as
		// an API object and is transformed.
		next := informerCached(controlSlice(idx, int(want), strconv.Itoa(2+i))).(*controller.Slice)
		slicesByIdx[idx] = next
		tracker.OnSliceUpdate(old, next)
		r.Run()
		if err := waitCount(objs.XvsServices, vipOf(idx), want, syncErr); err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
		res.Changes = append(res.Changes, time.Since(start))
		// The runner's rate limit counts from the end of its last run:
		// wait it out after the change is seen, so that no change
		// waits for it.
		time.Sleep(controlMinSync + 10*time.Millisecond)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// liveHeap is the Go heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.WriteHeapProfile(f), f.Close())
}

// waitCount polls a frontend's head until it lists want endpoints.
func waitCount(m *ebpf.Map, vip netip.Addr, want uint16, syncErr <-chan error) error {
	key := xbpf.SvcKey{Port: htons(servicePort), Proto: uint8(model.TCP), Family: xbpf.FamilyIPv4}
	a := vip.As4()
	copy(key.Addr[:], a[:])
	deadline := time.Now().Add(30 * time.Second)
	var v xbpf.SvcValue
	for {
		if err := m.Lookup(&key, &v); err == nil && v.Count == want {
			return nil
		}
		select {
		case err := <-syncErr:
			return fmt.Errorf("sync: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never showed %d endpoints (has %d)", vip, want, v.Count)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func htons(p uint16) uint16 { return p<<8 | p>>8 }

// controlObjects are n Services (ClusterIP VIPs as in the per-packet
// benchmark, port 80 to 8080) and one EndpointSlice each with 10 ready
// endpoints (no endpoint is shared), in the form the agent's informers
// cache them: each object made as the API would send it for a Deployment
// installed by a chart (a chart's labels, a selector, the Pods' node
// names and references, the EndpointSlice controller's labels, owner and
// annotation), then passed through controller.TrimObject, the informers'
// transform (which makes EndpointSlices controller.Slices).
func controlObjects(n int) ([]*controller.Service, []*controller.Slice) {
	svcs := make([]*controller.Service, n)
	sls := make([]*controller.Slice, n)
	for i := range n {
		svc := chartService(i, vipOf(i))
		svcs[i] = informerCached(svc).(*controller.Service)
		sls[i] = informerCached(controlSlice(i, backendsPerService, "1")).(*controller.Slice)
	}
	return svcs, sls
}

// chartService is Service i as the API server sends it for a chart's
// Deployment: port 80 to 8080 at vip, a chart's labels and annotations, a
// selector, and the fields the API server defaults on create.
func chartService(i int, vip netip.Addr) *v1.Service {
	name := controlName(i)
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", ResourceVersion: "1",
			UID: serviceUID(i), CreationTimestamp: controlCreated,
			Labels: chartLabels(name), Annotations: map[string]string{"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": "bench"}},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: vip.String(), ClusterIPs: []string{vip.String()},
			Ports:      []v1.ServicePort{{Name: "http", Port: servicePort, TargetPort: intstr.FromInt32(backendPort), Protocol: v1.ProtocolTCP}},
			Selector:   map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: ptr(v1.IPFamilyPolicySingleStack),
			SessionAffinity: v1.ServiceAffinityNone, InternalTrafficPolicy: ptr(v1.ServiceInternalTrafficPolicyCluster),
		},
	}
}

func controlName(i int) string { return "svc-" + strconv.Itoa(i) }

// serviceUID is Service i's UID (its EndpointSlice's owner).
func serviceUID(i int) types.UID {
	return types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
}

// controlCreated is every benchmark object's creation time.
var controlCreated = metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))

// chartLabels are the labels a Helm chart puts on its objects.
func chartLabels(name string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name,
		"app.kubernetes.io/version": "1.0.0", "app.kubernetes.io/managed-by": "Helm",
		"helm.sh/chart": name + "-1.0.0",
	}
}

// controlSlice is Service i's EndpointSlice with its 10 endpoints, plus
// one when eps is 11 (the changes' extra endpoint, outside every other
// Service's).
func controlSlice(i, eps int, rv string) *discoveryv1.EndpointSlice {
	name := controlName(i)
	labels := chartLabels(name)
	labels[discoveryv1.LabelServiceName] = name
	labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: "bench", ResourceVersion: rv,
			UID: types.UID(fmt.Sprintf("00000000-0000-4000-9000-%012d", i)), CreationTimestamp: controlCreated,
			GenerateName: name + "-", Labels: labels,
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-12-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name,
				UID: serviceUID(i), Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(backendPort)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for j := range eps {
		addr := addAddr(backendBase, 1+i*backendsPerService+j)
		if j >= backendsPerService {
			addr = addAddr(vipBase, -1-i) // below every VIP and backend
		}
		pod := fmt.Sprintf("%s-5d8c7b9f6-%05d", name, j)
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(fmt.Sprintf("node-%d", j)),
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: pod, UID: types.UID(fmt.Sprintf("00000000-0000-4000-a000-%06d%06d", i, j))},
		})
	}
	return sl
}

// informerCached is what the agent's informer cache holds for obj.
func informerCached(obj any) any {
	out, _ := controller.TrimObject(obj) // never fails
	return out
}

// procStatus reads one "kB" line of /proc/self/status, in bytes.
func procStatus(field string) (uint64, error) { return statusField("/proc/self/status", field) }

// statusField reads one "kB" line of a /proc/PID/status file, in bytes.
func statusField(path, field string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in %s", field, path)
}

// controlReport renders the control-plane section.
func controlReport(opts Options, rs []controlResult, agent []agentResult, plots map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Control plane: the agent's pipeline at scale\n\n")
	if len(rs) == 0 {
		fmt.Fprintf(&b, "Not run (no -control-sizes).\n\n")
		return b.Bytes()
	}
	fmt.Fprintf(&b, "Command: `%s` (control sizes %s, %d EndpointSlice changes at the largest).\n\n", opts.Command, joinInts(opts.Control.Sizes), opts.Control.Changes)
	if extra := os.Getenv(envAgentArgs); extra != "" {
		fmt.Fprintf(&b, "The real agent ran with `%s` added ($%s): its figures are not the shipped configuration's.\n\n", extra, envAgentArgs)
	}
	fmt.Fprintf(&b, `Each size runs in a fresh child process (the benchmark binary re-executed), so its memory figures are that size's alone. The child loads fresh objects with maps sized for the size, makes N Services (ClusterIP, port 80/TCP) and one EndpointSlice each with %d ready endpoints (no endpoint shared: N x %d backends), shaped as the API server sends a chart's Deployment (chart labels, a selector, UIDs, owner references, node names, pod references, the trigger-time annotation), and feeds them through the agent's own pipeline: every object through `+"`controller.Tracker`"+`'s informer handlers (as an informer's initial list does; objects are built in memory, not decoded from YAML or fetched from an API server), one `+"`Tracker.Build`"+`, one `+"`reconcile.Datapath.Sync`"+` into empty maps. RSS is VmRSS right after the sync; peak is VmHWM over the child's life; both include the Kubernetes objects the tracker holds (an agent's informer cache holds them too).

`, backendsPerService, backendsPerService)
	if p := plots["control"]; p != "" {
		fmt.Fprintf(&b, "![full-sync time and RSS against the number of Services](%s)\n\n", p)
	}
	fmt.Fprintf(&b, "Wall times on this shared machine stretch with other sessions' load (load average %s when the report was written); the CPU columns (the process's user+system time, GC and kernel map work included) do not, and are what the sync would take with a core to itself.\n\n", loadAvg())
	fmt.Fprintf(&b, "| Services | Backends | Handlers | Build | Datapath.Sync | Total (wall) | Total (CPU) | Sync (CPU) | RSS after (MiB) | Peak RSS (MiB) | Live heap (MiB) | of which API objects (MiB) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %d | %d | %v | %v | %v | %v | %v | %v | %.0f | %.0f | %.0f | %.0f |\n", r.N, r.N*backendsPerService,
			r.Handlers.Round(time.Millisecond), r.Build.Round(time.Millisecond), r.Sync.Round(time.Millisecond), r.Total().Round(time.Millisecond),
			r.CPU.Round(time.Millisecond), r.SyncCPU.Round(time.Millisecond),
			float64(r.RSS)/(1<<20), float64(r.HWM)/(1<<20), float64(r.Heap)/(1<<20), float64(r.ObjectsHeap)/(1<<20))
	}
	fmt.Fprintln(&b)
	last := rs[len(rs)-1]
	var s []time.Duration
	if len(last.Changes) > 0 {
		s = slices.Sorted(slices.Values(last.Changes))
		fmt.Fprintf(&b, "**One EndpointSlice change to the maps at %d Services** (%d changes): p50 %v, p99 %v, max %v; of which `Tracker.Build` p50 %v (p99 %v) and `reconcile.Datapath.Sync` p50 %v (p99 %v). Each change adds an 11th endpoint to one Service's slice or takes it away again, through `Tracker.OnEndpointSliceUpdate` (what the informer calls), the agent's bounded-frequency runner (min sync period %v; changes are spaced wider, so none waits for it), `Tracker.Build` and `reconcile.Datapath.Sync`; the clock stops when a lookup of the Service's head in the pinned services map shows the new endpoint count (polled every 100 µs). The API server's watch latency and the file source's re-reading of its directory are not in it.\n\n",
			last.N, len(s), percentile(s, 0.5).Round(time.Microsecond*10), percentile(s, 0.99).Round(time.Microsecond*10), s[len(s)-1].Round(time.Microsecond*10),
			percentile(slices.Sorted(slices.Values(last.ChangeBuild)), 0.5).Round(time.Microsecond*10),
			percentile(slices.Sorted(slices.Values(last.ChangeBuild)), 0.99).Round(time.Microsecond*10),
			percentile(slices.Sorted(slices.Values(last.ChangeSync)), 0.5).Round(time.Microsecond*10),
			percentile(slices.Sorted(slices.Values(last.ChangeSync)), 0.99).Round(time.Microsecond*10), controlMinSync)
	}
	if len(agent) > 0 {
		fmt.Fprintf(&b, "**The real agent process** (`xvs agent`, ebpf mode, with the `--bpf-max-*` map sizes docs/configuration.md gives for the size), fed N Services and their EndpointSlices (%d endpoints each) two ways: through the real watcher path (source `api`: a kube-apiserver v1.37 with embedded etcd from lab/kubeapi holds the objects, shaped as above for a chart's Deployment; they are put straight into its etcd before it starts, with the IPAddress objects its allocator keeps (kubeapi.Seed: creating 100,000 Services through the API server takes hours, because each ClusterIP allocation lists every IPAddress to update a metric); the agent lists and watches them with its informers, as in a cluster), and through the file source (source `file`: one manifest file of minimal objects, read and decoded by the agent). Ready is the time from the process's start to every Service's head in the pinned map; RSS is the process's %v later (once it has handed the sync's garbage back), peak its VmHWM. **Scrape**: then one GET of the agent's `/metrics` (with its defaults: per-backend series on, `--metrics-max-series` 100,000), its time and size, and the process's RSS and peak %v after it. **One change** (api source): an EndpointSlice update written to the API server (an 11th endpoint added to one Service, or taken away again; up to %d changes at the largest size, 1.1 s apart, past the agent's minimum sync interval), timed from the request to the Service's head in the pinned map showing the new count: the API server's write and watch, the informer, the agent's sync and the map update.\n\n",
			backendsPerService, agentSettle, agentSettle, agentChangeCount)
		fmt.Fprintf(&b, "| Source | Services | Backends | Objects written in | Ready after | RSS (MiB) | Peak RSS (MiB) | Scrape: time, size | RSS after it (MiB) | Peak after it (MiB) | One change, p50 | One change, p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, a := range agent {
			created, p50s, p99s := "–", "–", "–"
			if a.Created > 0 {
				created = a.Created.Round(time.Millisecond).String()
			}
			if p50, p99, ok := a.changeQuantiles(); ok {
				p50s, p99s = p50.String(), p99.String()
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %s | %v | %.0f | %.0f | %v, %.1f MiB | %.0f | %.0f | %s | %s |\n", a.Source, a.N, a.N*backendsPerService, created, a.Ready.Round(time.Millisecond),
				float64(a.RSS)/(1<<20), float64(a.HWM)/(1<<20), a.Scrape.Round(time.Millisecond), float64(a.ScrapeBytes)/(1<<20), float64(a.ScrapeRSS)/(1<<20), float64(a.ScrapeHWM)/(1<<20), p50s, p99s)
		}
		fmt.Fprintln(&b)
	}
	fmt.Fprintf(&b, "### Goals\n\n| Goal | Measured | Met |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| full sync of %d Services x %d endpoints <= %v | wall %v (Datapath.Sync alone %v); CPU %v (Datapath.Sync alone %v) | wall %s, CPU %s |\n", last.N, backendsPerService, goalSyncTime,
		last.Total().Round(time.Millisecond), last.Sync.Round(time.Millisecond), last.CPU.Round(time.Millisecond), last.SyncCPU.Round(time.Millisecond),
		yesNo(last.Total() <= goalSyncTime), yesNo(last.CPU <= goalSyncTime))
	fmt.Fprintf(&b, "| RSS at %d Services <= %d MiB | %.0f MiB after the sync (what the agent keeps), %.0f MiB peak during it | after %s, peak %s |\n", last.N, goalRSS>>20,
		float64(last.RSS)/(1<<20), float64(last.HWM)/(1<<20), yesNo(last.RSS <= goalRSS), yesNo(last.HWM <= goalRSS))
	if len(s) > 0 {
		fmt.Fprintf(&b, "| one EndpointSlice change to the maps at %d Services, p99 <= %v | %v | %s |\n", last.N, goalChangeP99,
			percentile(s, 0.99).Round(time.Microsecond*10), yesNo(percentile(s, 0.99) <= goalChangeP99))
	}
	mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
	fmt.Fprintf(&b, "\n**What limits them.** A change is O(changed) end to end: the Tracker recomputes only the changed Service and hands the datapath a numbered State whose Delta names the changed ServicePorts (its map is updated in place, so a change allocates next to nothing and the garbage collector stays idle), `Datapath.Sync` applies only those, and the agent's metrics and health-check bookkeeping follow the same Delta. The full sync's CPU goes to translating N Services, the kernel's inserts of about %d hash-map entries (service slots and backends) and the garbage collector (the per-Service and per-backend counters are created by the datapath when traffic first counts for an ID, not by the sync). **Memory:** of the %.0f MiB live heap after the sync at %d Services, %.0f MiB are the Service and EndpointSlice objects themselves (as the agent's informer cache holds them: compact Services with the fields the translation reads, EndpointSlices parsed into compact Slices); xvs's own structures (the Tracker's index and translations, the State, the Datapath's bookkeeping: one pointer-free entry per backend in a map per family, ID bitmaps) are the other %.0f MiB. At Go's default GOGC=100 the heap would grow to about twice the live heap between collections; from its start until the first sync is applied, and during every later full sync, the agent lowers the target to GOGC=25 (controller.LowerGCTarget; an operator's lower GOGC stays), as this run does, trading some CPU of the full sync for a lower peak (the peak column above is this run's). After the sync the agent hands the garbage back, and RSS falls to about the live heap; until the next full sync the heap may grow by 64 MiB or a quarter of the live heap, whichever is more (controller.SteadyGCPercent). The real agent holds more than this child: its Services file and per-Service metrics bookkeeping, client-go's informer machinery, and the garbage of its informers' list (table below).\n",
		last.N*(2+backendsPerService), mib(last.Heap), last.N, mib(last.ObjectsHeap), mib(last.Heap-min(last.Heap, last.ObjectsHeap)))
	fmt.Fprintf(&b, "\nRSS is given twice: after the full sync, once the agent has handed the sync's garbage back (`debug.FreeOSMemory`, as the agent does after every full sync), which is what the agent holds from then on; and the peak during the sync, which a container memory limit must also allow for (the agent's Go soft limit, 90%% of the container's, makes the collector work harder near it). **Reference, not measured by us** (figures quoted when these goals were set): kube-proxy's first full sync of 10k Services took 37–42 s in nftables mode and 113–127 s in iptables mode; one endpoint change reached the datapath in 0.5–0.6 s and 1.6–2.0 s; its RSS was about 220 MiB.\n\n")
	return b.Bytes()
}

// writeControlPlot draws full-sync time and peak RSS against N.
func writeControlPlot(base string, rs []controlResult) (string, error) {
	if len(rs) == 0 {
		return "", nil
	}
	var total, sync, rss plotter.XYs
	for _, r := range rs {
		total = append(total, plotter.XY{X: float64(r.N), Y: r.Total().Seconds() * 100})
		sync = append(sync, plotter.XY{X: float64(r.N), Y: r.Sync.Seconds() * 100})
		rss = append(rss, plotter.XY{X: float64(r.N), Y: float64(r.HWM) / (1 << 20)})
	}
	lo, hi := float64(rs[0].N)/2, float64(rs[len(rs)-1].N)*2
	goalT := plotter.XYs{{X: lo, Y: goalSyncTime.Seconds() * 100}, {X: hi, Y: goalSyncTime.Seconds() * 100}}
	goalM := plotter.XYs{{X: lo, Y: goalRSS >> 20}, {X: hi, Y: goalRSS >> 20}}
	path := base + "-control.png"
	err := linePlot(path, "Full sync of N Services x 10 endpoints (child process, wall time)", "MiB  |  10 ms", rs[0].N, rs[len(rs)-1].N,
		[]any{"full sync, handlers+build+sync (10 ms units)", total, "Datapath.Sync (10 ms units)", sync, "peak RSS (MiB)", rss,
			"goal: full sync 10 s", goalT, "goal: RSS 500 MiB", goalM})
	return filepath.Base(path), err
}
