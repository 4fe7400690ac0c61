package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/healthcheck"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/model"
)

// recordingDatapath remembers the States it was given and fails on demand.
type recordingDatapath struct {
	states []*model.State
	fail   error
	// gcPercent is the garbage collector's target during each Sync.
	gcPercent []int
}

func (d *recordingDatapath) Sync(_ context.Context, st *model.State) error {
	if d.fail != nil {
		return d.fail
	}
	d.states = append(d.states, st)
	d.gcPercent = append(d.gcPercent, gcPercent())
	return nil
}
func (d *recordingDatapath) Mode() string       { return "test" }
func (d *recordingDatapath) Problems() []string { return nil }

// gcPercent reads the garbage collector's target.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func ptrTo[T any](v T) *T { return &v }

func lbService(etpLocal bool) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lb"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.9", ClusterIPs: []string{"10.96.0.9"},
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080},
				{Name: "https", Protocol: v1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(8443), NodePort: 30443},
			}}}
	if etpLocal {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
	}
	return s
}

func lbSlice(trigger time.Time, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lb-1",
			Labels:      map[string]string{discoveryv1.LabelServiceName: "lb"},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptrTo("http"), Port: ptrTo(int32(8080)), Protocol: ptrTo(v1.ProtocolTCP)},
			{Name: ptrTo("https"), Port: ptrTo(int32(8443)), Protocol: ptrTo(v1.ProtocolTCP)},
		},
	}
}

func ep(ip, node string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptrTo(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(ready), Serving: ptrTo(true), Terminating: ptrTo(terminating)}}
}

type recordingHealthServers struct {
	want  map[types.NamespacedName]healthcheck.Service
	addrs []netip.Addr
	syncs int
}

func (r *recordingHealthServers) Sync(want map[types.NamespacedName]healthcheck.Service, addrs []netip.Addr) {
	r.want, r.addrs = want, addrs
	r.syncs++
}
func (r *recordingHealthServers) Close() {}

// TestSyncerBookkeeping: a sync records kube-proxy's metrics (durations,
// network programming latency from the slice annotation, change counters),
// marks the proxy healthy, and gives the health check servers the local
// Ready endpoints counted by IP; a failed sync counts a failure, forces a
// full resync and keeps the trigger times for the retry.
func TestSyncerBookkeeping(t *testing.T) {
	cfg := controller.Config{NodeName: "n1", NodeAddresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		NodePortAddresses: []string{"primary"}}
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dp := &recordingDatapath{}
	m := xmetrics.New()
	s := newSyncer(syncerConfig{log: slog.New(slog.NewTextHandler(io.Discard, nil)), tracker: tr, dp: dp, metrics: m,
		syncPeriod: time.Hour, ccfg: cfg})
	hs := &recordingHealthServers{}
	s.svcHealth = hs
	triggered := 0
	s.trigger = func() { triggered++ }

	s.onEvent(controller.Event{Kind: "Service", Changed: tr.OnServiceAdd(controller.NewService(lbService(true)))})
	trig := time.Now().Add(-1500 * time.Millisecond)
	slice := lbSlice(trig, ep("10.0.0.1", "n1", true, false), ep("10.0.0.2", "n1", false, true), ep("10.0.0.3", "n2", true, false))
	s.onEvent(controller.Event{Kind: "EndpointSlice", Changed: tr.OnEndpointSliceAdd(slice), TriggerTime: trig,
		AddressType: slice.AddressType})
	s.onEvent(controller.Event{Kind: "EndpointSlice", Changed: false}) // a collapsed no-op
	if triggered != 2 {
		t.Fatalf("%d sync requests for 2 changes", triggered)
	}
	if got := testutil.ToFloat64(m.EndpointChangesPending); got != 1 {
		t.Fatalf("endpoint changes pending %v", got)
	}

	dp.fail = errors.New("boom")
	if err := s.sync(context.Background()); err == nil {
		t.Fatal("sync succeeded with a failing datapath")
	}
	if testutil.ToFloat64(m.SyncFailuresTotal.WithLabelValues("test")) != 1 || !tr.Pending() || hs.syncs != 0 {
		t.Fatal("failure not counted, no full resync forced, or health checks synced from a failed state")
	}

	dp.fail = nil
	if err := s.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(dp.states) != 1 {
		t.Fatalf("datapath saw %d states", len(dp.states))
	}
	out, err := testutil.CollectAndFormat(m.NetworkProgrammingLatency, expfmt.TypeTextPlain,
		"kubeproxy_network_programming_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 0`) ||
		!strings.Contains(string(out), `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"} 1`) {
		t.Fatalf("latency of a 1.5 s old trigger not in (1, 2]:\n%s", out)
	}
	if testutil.ToFloat64(m.EndpointChangesPending) != 0 || testutil.ToFloat64(m.ServiceChangesTotal) != 1 ||
		testutil.ToFloat64(m.EndpointChangesTotal) != 1 {
		t.Fatal("change counters")
	}
	if testutil.CollectAndCount(m.SyncFullProxyRulesLatency) != 1 || testutil.CollectAndCount(m.SyncPartialProxyRulesLatency) != 0 {
		t.Fatal("first successful sync not observed as full")
	}
	if !s.health.IsHealthy() {
		t.Fatal("unhealthy after a sync")
	}
	lb := types.NamespacedName{Namespace: "ns", Name: "lb"}
	if len(hs.want) != 1 || hs.want[lb] != (healthcheck.Service{Port: 32000, LocalEndpoints: 1}) {
		t.Fatalf("health check services %v: want lb on 32000 with 1 local Ready endpoint (by IP, over both ports)", hs.want)
	}
	if len(hs.addrs) != 1 || hs.addrs[0] != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("health check addresses %v, want the primary node IP", hs.addrs)
	}

	// A partial sync: one more local endpoint.
	slice = lbSlice(time.Now(), ep("10.0.0.1", "n1", true, false), ep("10.0.0.4", "n1", true, false))
	s.onEvent(controller.Event{Kind: "EndpointSlice", Changed: tr.OnEndpointSliceUpdate(nil, slice)})
	if err := s.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if testutil.CollectAndCount(m.SyncPartialProxyRulesLatency) != 1 || hs.want[lb].LocalEndpoints != 2 {
		t.Fatalf("partial sync: %v", hs.want)
	}
	if got := testutil.ToFloat64(m.NoLocalEndpointsTotal.WithLabelValues("external", "IPv4")); got != 0 {
		t.Fatalf("no-local gauge %v with local endpoints", got)
	}
	slice = lbSlice(time.Now(), ep("10.0.0.3", "n2", true, false))
	s.onEvent(controller.Event{Kind: "EndpointSlice", Changed: tr.OnEndpointSliceUpdate(nil, slice)})
	if err := s.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Two ports of the Service, both eTP=Local with only a remote endpoint.
	if got := testutil.ToFloat64(m.NoLocalEndpointsTotal.WithLabelValues("external", "IPv4")); got != 2 {
		t.Fatalf("no-local gauge %v, want 2 ports", got)
	}
	if hs.want[lb].LocalEndpoints != 0 {
		t.Fatalf("local endpoints %v", hs.want)
	}
}

// TestSyncerPeriodicFullSync: every sync hands the State to the datapath
// (which applies only what changed: nothing, when nothing did), and once
// fullSyncPeriod has passed since the last full sync the Tracker
// re-evaluates every Service (kube-proxy's FullSyncPeriod; the datapath
// still skips ports whose pointer did not change).
func TestSyncerPeriodicFullSync(t *testing.T) {
	cfg := controller.Config{NodeName: "n1"}
	tr, err := controller.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dp := &recordingDatapath{}
	m := xmetrics.New()
	s := newSyncer(syncerConfig{log: slog.New(slog.NewTextHandler(io.Discard, nil)), tracker: tr, dp: dp, metrics: m,
		syncPeriod: time.Minute, fullSyncPeriod: 200 * time.Millisecond, ccfg: cfg})
	s.svcHealth = &recordingHealthServers{}
	tr.OnServiceAdd(controller.NewService(lbService(false)))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for range 3 {
		if err := s.sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(dp.states) != 3 || dp.states[1] != dp.states[0] || dp.states[2] != dp.states[0] {
		t.Fatalf("datapath got %d States for one change, want the same one 3 times", len(dp.states))
	}
	time.Sleep(250 * time.Millisecond)
	if err := s.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Full syncs (the first, and the periodic one) collect harder; the
	// target is back to the default after each and during deltas.
	if want := []int{controller.FullSyncGCPercent, 100, 100, controller.FullSyncGCPercent}; !slices.Equal(dp.gcPercent, want) {
		t.Errorf("GC target during the syncs: %v, want %v", dp.gcPercent, want)
	}
	if p := gcPercent(); p != 100 {
		t.Errorf("GC target after the syncs: %d, want 100 again", p)
	}
	out, err := testutil.CollectAndFormat(m.SyncFullProxyRulesLatency, expfmt.TypeTextPlain,
		"kubeproxy_sync_full_proxy_rules_duration_seconds")
	if err != nil || !strings.Contains(string(out), `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2`) {
		t.Fatalf("want 2 full syncs observed (%v):\n%s", err, out)
	}
}
