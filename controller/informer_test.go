package controller

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/xvs-lb/xvs/model"
)

// informerWorld is a fake clientset feeding a Tracker through an
// InformerSource, with every event recorded.
type informerWorld struct {
	t       *testing.T
	client  *fake.Clientset
	tracker *Tracker
	src     *InformerSource
	ctx     context.Context

	mu       sync.Mutex
	events   []Event
	notify   chan struct{}
	watching chan string
}

func newInformerWorld(t *testing.T, cfg Config, objs ...runtime.Object) *informerWorld {
	t.Helper()
	w := &informerWorld{t: t, client: fake.NewClientset(objs...), notify: make(chan struct{}, 1000),
		watching: make(chan string, 10)}
	// The fake clientset starts a watch after the list without a resource
	// version, so a change made in between is lost: tests wait for the
	// three watches before changing anything.
	w.client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w.watching <- a.GetResource().Resource
		return false, nil, nil
	})
	var err error
	if w.tracker, err = NewTracker(cfg); err != nil {
		t.Fatal(err)
	}
	w.src = NewInformerSource(w.client, w.tracker,
		InformerConfig{NodeName: cfg.NodeName, ServiceProxyName: cfg.ServiceProxyName},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.ctx = ctx
	return w
}

func (w *informerWorld) start() {
	w.t.Helper()
	// The informers live as long as Start's context: the test's.
	if err := w.src.Start(w.ctx, w.record); err != nil {
		w.t.Fatal(err)
	}
	w.waitWatches()
}

func (w *informerWorld) waitWatches() {
	w.t.Helper()
	for range 3 {
		select {
		case <-w.watching:
		case <-time.After(5 * time.Second):
			w.t.Fatal("informers never started watching")
		}
	}
}

func (w *informerWorld) record(ev Event) {
	w.mu.Lock()
	w.events = append(w.events, ev)
	w.mu.Unlock()
	w.notify <- struct{}{}
}

// waitFor waits until cond holds on the tracker's next Build.
func (w *informerWorld) waitFor(what string, cond func(*model.State) bool) *model.State {
	w.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		st := w.tracker.Build().State
		if cond(st) {
			return st
		}
		select {
		case <-w.notify:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			w.t.Fatalf("timed out waiting for %s; state has %d ports", what, len(st.Services))
		}
	}
}

func (w *informerWorld) eventsOf(kind string) []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Event
	for _, e := range w.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func backendsOf(st *model.State, svc string) []string {
	sp := portOf(st, svc)
	if sp == nil {
		return nil
	}
	var out []string
	for _, e := range sp.ClusterEndpoints {
		out = append(out, e.String())
	}
	return out
}

func newSliceObj(svc, name string, ips ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}, NodeName: ptr(testNode)})
	}
	return es
}

// TestInformerAddUpdateDelete: objects present before Start and changes
// made after it reach the Tracker; deletes remove them.
func TestInformerAddUpdateDelete(t *testing.T) {
	w := newInformerWorld(t, testConfig(), newSvc("web"), newSliceObj("web", "web-1", "10.0.0.1"))
	w.start()
	if !w.src.HasSynced() {
		t.Fatal("Start returned before HasSynced")
	}
	st := w.tracker.Build().State
	if got := backendsOf(st, "web"); len(got) != 1 || got[0] != "10.0.0.1:8080" {
		t.Fatalf("initial list: backends %v", got)
	}
	if n := len(w.eventsOf("Service")) + len(w.eventsOf("EndpointSlice")); n != 0 {
		t.Fatalf("initial list reported %d events; want none (the first sync follows Start)", n)
	}

	ctx := w.ctx
	es := newSliceObj("web", "web-1", "10.0.0.1", "10.0.0.2")
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-02T03:04:05Z"}
	if _, err := w.client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("second endpoint", func(st *model.State) bool { return len(backendsOf(st, "web")) == 2 })
	evs := w.eventsOf("EndpointSlice")
	if len(evs) == 0 || !evs[len(evs)-1].Changed {
		t.Fatalf("slice update events %+v", evs)
	}
	if want := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC); !evs[len(evs)-1].TriggerTime.Equal(want) {
		t.Fatalf("trigger time %v, want %v", evs[len(evs)-1].TriggerTime, want)
	}

	svc2 := newSvc("api", clusterIPs("10.96.0.2"))
	if _, err := w.client.CoreV1().Services("ns").Create(ctx, svc2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("second service", func(st *model.State) bool { return portOf(st, "api") != nil })

	if err := w.client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("web deleted", func(st *model.State) bool { return portOf(st, "web") == nil })
	if err := w.client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.tracker.Pending() || len(w.eventsOf("EndpointSlice")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("slice delete never reached the tracker")
		}
		w.tracker.Build()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestInformerCollapsesNoOpUpdates: an update that changes nothing the
// translation reads (a status-only Service change) is reported as an event
// but not as a change.
func TestInformerCollapsesNoOpUpdates(t *testing.T) {
	w := newInformerWorld(t, testConfig(), newSvc("web"))
	w.start()
	w.tracker.Build()
	svc, err := w.client.CoreV1().Services("ns").Get(w.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc = svc.DeepCopy()
	svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "R",
		LastTransitionTime: metav1.Now()}}
	svc.ResourceVersion = "2"
	if _, err := w.client.CoreV1().Services("ns").UpdateStatus(w.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.notify:
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the status update")
	}
	evs := w.eventsOf("Service")
	if len(evs) != 1 || evs[0].Changed {
		t.Fatalf("events %+v: want one unchanged Service event", evs)
	}
	if w.tracker.Pending() {
		t.Fatal("tracker has work after a no-op update")
	}
}

// TestInformerDeletedFinalStateUnknown: a delete seen only as a tombstone
// (the watch missed it; a relist found the object gone) is unwrapped.
func TestInformerDeletedFinalStateUnknown(t *testing.T) {
	w := newInformerWorld(t, testConfig(), newSvc("web"), newSliceObj("web", "web-1", "10.0.0.1"),
		testNodeObj(zoneLabels(testZone), "192.0.2.1"))
	w.start()
	w.tracker.Build()
	handlers := []struct {
		kind string
		h    cache.ResourceEventHandler
		obj  runtime.Object
	}{
		{"EndpointSlice", w.src.sliceHandler(), newSliceObj("web", "web-1", "10.0.0.1")},
		{"Service", w.src.serviceHandler(), newSvc("web")},
		{"Node", w.src.nodeHandler(), testNodeObj(zoneLabels(testZone), "192.0.2.1")},
	}
	for _, c := range handlers {
		key, _ := cache.MetaNamespaceKeyFunc(c.obj)
		c.h.OnDelete(cache.DeletedFinalStateUnknown{Key: key, Obj: c.obj})
		evs := w.eventsOf(c.kind)
		if len(evs) != 1 || !evs[0].Changed {
			t.Fatalf("%s tombstone: events %+v, want one change", c.kind, evs)
		}
		if c.kind == "Node" && evs[0].Node != nil {
			t.Fatal("Node delete event carries a node")
		}
	}
	st := w.tracker.Build().State
	if len(st.Services) != 0 {
		t.Fatalf("services left after tombstone deletes: %v", st.Services)
	}
	// A tombstone wrapping something else is logged and ignored, never a
	// panic.
	w.src.serviceHandler().OnDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: &v1.Pod{}})
	w.src.serviceHandler().OnDelete("garbage")
}

// TestInformerServiceProxyName: the informers ask the API server for
// kube-proxy's label selector, and Services (and slices) of another proxy
// never reach the State even when a server ignores the selector (the fake
// clientset does not filter watches).
func TestInformerServiceProxyName(t *testing.T) {
	for _, tc := range []struct {
		proxyName    string
		wantSelector string
		want, other  string
	}{
		{"", "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name", "mine", "theirs"},
		{"xvs", "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=xvs", "theirs", "mine"},
	} {
		t.Run("proxyName="+tc.proxyName, func(t *testing.T) {
			cfg := testConfig()
			cfg.ServiceProxyName = tc.proxyName
			w := newInformerWorld(t, cfg)
			var mu sync.Mutex
			selectors := map[string]string{}
			w.client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				l := a.(k8stesting.ListAction)
				selectors[a.GetResource().Resource] = l.GetListRestrictions().Labels.String() + "|" + l.GetListRestrictions().Fields.String()
				return false, nil, nil
			})
			w.start()
			mu.Lock()
			for _, res := range []string{"services", "endpointslices"} {
				if got := selectors[res]; got != tc.wantSelector+"|" {
					t.Errorf("%s list selector %q, want %q", res, got, tc.wantSelector)
				}
			}
			if got := selectors["nodes"]; got != "|metadata.name="+testNode {
				t.Errorf("nodes list selector %q, want only our node", got)
			}
			mu.Unlock()

			mine := newSvc("mine", clusterIPs("10.96.0.1"))
			theirs := newSvc("theirs", clusterIPs("10.96.0.2"))
			theirs.Labels = map[string]string{LabelServiceProxyName: "xvs"}
			for _, s := range []*v1.Service{theirs, mine} {
				if _, err := w.client.CoreV1().Services("ns").Create(w.ctx, s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			st := w.waitFor(tc.want, func(st *model.State) bool { return portOf(st, tc.want) != nil })
			if portOf(st, tc.other) != nil {
				t.Fatalf("%s programmed with serviceProxyName %q", tc.other, tc.proxyName)
			}
		})
	}
}

// TestInformerNoEventsBeforeSync: while one informer's initial list is
// still outstanding, Start does not return and no event is reported, even
// though the other informers already fed the Tracker.
func TestInformerNoEventsBeforeSync(t *testing.T) {
	w := newInformerWorld(t, testConfig(), newSvc("web"), newSliceObj("web", "web-1", "10.0.0.1"))
	release := make(chan struct{})
	w.src.h = blockingHandler{Handler: w.tracker, serviceAdd: release}
	started := make(chan error, 1)
	go func() { started <- w.src.Start(w.ctx, w.record) }()

	deadline := time.Now().Add(5 * time.Second)
	for w.src.EndpointSlice("ns", "web-1") == nil {
		if time.Now().After(deadline) {
			t.Fatal("EndpointSlice informer never listed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-started:
		t.Fatalf("Start returned (%v) before the Service handler saw the initial list", err)
	case <-time.After(200 * time.Millisecond):
	}
	if w.src.HasSynced() {
		t.Fatal("HasSynced before the Service handler saw the initial list")
	}
	w.waitWatches()
	// A change while unsynced is applied to the Tracker but not reported.
	if _, err := w.client.DiscoveryV1().EndpointSlices("ns").Update(w.ctx,
		newSliceObj("web", "web-1", "10.0.0.1", "10.0.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for len(w.src.cachedSlice("ns", "web-1").Endpoints) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("slice update never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(w.eventsOf("EndpointSlice")); n != 0 {
		t.Fatalf("%d events before sync", n)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	st := w.tracker.Build().State
	if got := backendsOf(st, "web"); len(got) != 2 {
		t.Fatalf("after sync: backends %v, want both", got)
	}
}

// blockingHandler holds OnServiceAdd (and OnNodeAdd) until its channel
// closes, keeping that informer's registration unsynced.
type blockingHandler struct {
	Handler
	serviceAdd, nodeAdd chan struct{}
}

func (b blockingHandler) OnServiceAdd(svc *Service) bool {
	if b.serviceAdd != nil {
		<-b.serviceAdd
	}
	return b.Handler.OnServiceAdd(svc)
}

func (b blockingHandler) OnNodeAdd(n *v1.Node) bool {
	if b.nodeAdd != nil {
		<-b.nodeAdd
	}
	return b.Handler.OnNodeAdd(n)
}

// TestInformerStartCancelled: Start gives up with an error when its context
// ends before the caches sync.
func TestInformerStartCancelled(t *testing.T) {
	w := newInformerWorld(t, testConfig(), testNodeObj(nil, "192.0.2.1"))
	block := make(chan struct{})
	defer close(block)
	w.src.h = blockingHandler{Handler: w.tracker, nodeAdd: block}
	ctx, cancel := context.WithTimeout(w.ctx, 200*time.Millisecond)
	defer cancel()
	err := w.src.Start(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "not synced") {
		t.Fatalf("Start with a stuck handler: %v", err)
	}
}

// TestInformerEndpointSelection runs docs/semantics.md §3.10/3.11 through the
// API path: conditions and topology hints written as the EndpointSlice
// controller writes them pick the endpoints the table tests pick, and the
// Node's zone label (from the Node informer) switches hints on.
func TestInformerEndpointSelection(t *testing.T) {
	node := testNodeObj(zoneLabels(testZone), "192.0.2.1")
	es := newSliceObj("web", "web-1")
	add := func(ip, nodeName, zone string, ready, serving, terminating bool) {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{ip}, NodeName: ptr(nodeName), Zone: ptr(zone),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		})
	}
	add("10.0.0.1", testNode, testZone, true, true, false)   // local, in zone
	add("10.0.0.2", "node-b", testZone, true, true, false)   // remote, in zone
	add("10.0.0.3", "node-c", "zone-b", true, true, false)   // other zone: filtered by hints
	add("10.0.0.4", testNode, testZone, false, true, true)   // serving-terminating: not while ready ones exist
	add("10.0.0.5", "node-b", testZone, false, false, false) // not serving: never
	add("10.0.0.6", testNode, testZone, false, false, true)  // terminating, not serving: never
	svc := newSvc("web", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	w := newInformerWorld(t, testConfig(), node, svc, es)
	w.start()
	sp := portOf(w.tracker.Build().State, "web")
	if sp == nil {
		t.Fatal("web not programmed")
	}
	got := func(eps []model.Endpoint) string {
		var s []string
		for _, e := range eps {
			s = append(s, e.Addr.String())
		}
		return strings.Join(s, ",")
	}
	if c := got(sp.ClusterEndpoints); c != "10.0.0.1,10.0.0.2" {
		t.Errorf("cluster set %s, want the ready in-zone endpoints", c)
	}
	if l := got(sp.LocalEndpoints); l != "10.0.0.1" {
		t.Errorf("local set %s", l)
	}
	if sp.LocalReady != 1 {
		t.Errorf("LocalReady %d", sp.LocalReady)
	}
	wantNodePort := model.Frontend{Kind: model.NodePort, Addr: netip.MustParseAddr("192.0.2.1"), Port: 30080, Proto: model.TCP}
	found := false
	for _, f := range sp.Frontends {
		found = found || f == wantNodePort
	}
	if !found {
		t.Errorf("frontends %v lack the NodePort on the Node's InternalIP", sp.Frontends)
	}

	// The zone label goes away: hints no longer apply (full resync), so
	// the other zone's endpoint joins the cluster set.
	node = node.DeepCopy()
	node.Labels = nil
	if _, err := w.client.CoreV1().Nodes().Update(w.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("hints off", func(st *model.State) bool {
		sp := portOf(st, "web")
		return sp != nil && got(sp.ClusterEndpoints) == "10.0.0.1,10.0.0.2,10.0.0.3"
	})
	evs := w.eventsOf("Node")
	if len(evs) == 0 || !evs[len(evs)-1].Changed || evs[len(evs)-1].Node == nil {
		t.Fatalf("node events %+v", evs)
	}

	// Every ready endpoint goes: the serving-terminating ones are used,
	// the local one for the local set.
	es = es.DeepCopy()
	es.Endpoints = es.Endpoints[3:]
	if _, err := w.client.DiscoveryV1().EndpointSlices("ns").Update(w.ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	st := w.waitFor("terminating fallback", func(st *model.State) bool {
		sp := portOf(st, "web")
		return sp != nil && got(sp.ClusterEndpoints) == "10.0.0.4"
	})
	if sp := portOf(st, "web"); got(sp.LocalEndpoints) != "10.0.0.4" || sp.LocalReady != 0 {
		t.Fatalf("local set %s, LocalReady %d: want the serving-terminating one, counted 0", got(sp.LocalEndpoints), sp.LocalReady)
	}
}

// ServiceCIDRs are watched when the API server serves them: the initial
// list reaches the first Build, later changes come as events. Without the
// resource, the source starts as before and the configured ranges stay.
func TestInformerServiceCIDRs(t *testing.T) {
	t.Run("served", func(t *testing.T) {
		w := newInformerWorld(t, testConfig(), serviceCIDR("kubernetes", "10.96.0.0/16"))
		w.client.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1",
			APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}}}}
		w.start()
		w.waitWatches1()
		w.waitFor("the listed range", func(st *model.State) bool {
			return slices.Equal(st.ServiceCIDRs, prefixes("10.96.0.0/16"))
		})
		cidrs := w.client.NetworkingV1().ServiceCIDRs()
		if _, err := cidrs.Create(w.ctx, serviceCIDR("extra", "10.100.0.0/24"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		w.waitFor("the created range", func(st *model.State) bool {
			return slices.Equal(st.ServiceCIDRs, prefixes("10.96.0.0/16", "10.100.0.0/24"))
		})
		if err := cidrs.Delete(w.ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.waitFor("the deletion", func(st *model.State) bool {
			return slices.Equal(st.ServiceCIDRs, prefixes("10.100.0.0/24"))
		})
		if evs := w.eventsOf("ServiceCIDR"); len(evs) != 2 || !evs[0].Changed || !evs[1].Changed {
			t.Fatalf("events %+v, want the create and the delete (the initial list is not reported)", evs)
		}
	})
	t.Run("not served", func(t *testing.T) {
		cfg := testConfig()
		cfg.ServiceCIDRs = prefixes("10.96.0.0/16")
		w := newInformerWorld(t, cfg, serviceCIDR("kubernetes", "10.200.0.0/16"))
		w.start()
		if got := w.tracker.Build().State.ServiceCIDRs; !slices.Equal(got, prefixes("10.96.0.0/16")) {
			t.Fatalf("ranges %v, want the configured one only", got)
		}
	})
}

// waitWatches1 waits for a fourth watch (the ServiceCIDRs', which start
// needs not wait for).
func (w *informerWorld) waitWatches1() {
	w.t.Helper()
	select {
	case <-w.watching:
	case <-time.After(5 * time.Second):
		w.t.Fatal("the ServiceCIDR informer never started watching")
	}
}
