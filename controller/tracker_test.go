package controller

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/model"
)

func newTestTracker(t *testing.T) *Tracker {
	t.Helper()
	tr, err := NewTracker(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func portOf(st *model.State, svc string) *model.ServicePort {
	return st.Services[model.ServicePortName{Namespace: "ns", Name: svc, Port: "http", Protocol: model.TCP}]
}

func withRV(rv string) svcOpt { return func(s *v1.Service) { s.ResourceVersion = rv } }

// Updates that cannot change the State are collapsed.
func TestTrackerCollapsesNoOps(t *testing.T) {
	tr := newTestTracker(t)
	if !tr.OnServiceAdd(NewService(newSvc("s", withRV("1")))) {
		t.Fatal("add reported no change")
	}
	tr.Build()
	statusOnly := newSvc("s", withRV("3"))
	statusOnly.Status.Conditions = []metav1.Condition{{Type: "Foo", Status: metav1.ConditionTrue}}
	otherAnnotation := newSvc("s", svcAnnotation("kubectl.kubernetes.io/last-applied-configuration", "{}"))
	tests := []struct {
		name string
		call func() bool
		want bool
	}{
		{"same resourceVersion", func() bool { return tr.OnServiceUpdate(nil, NewService(newSvc("s", withRV("1")))) }, false},
		{"equal without resourceVersion", func() bool { return tr.OnServiceUpdate(nil, NewService(newSvc("s"))) }, false},
		{"new resourceVersion, equal spec", func() bool { return tr.OnServiceUpdate(nil, NewService(newSvc("s", withRV("2")))) }, false},
		{"status conditions only", func() bool { return tr.OnServiceUpdate(nil, NewService(statusOnly)) }, false},
		{"unrelated annotation", func() bool { return tr.OnServiceUpdate(nil, NewService(otherAnnotation)) }, false},
		{"spec change", func() bool { return tr.OnServiceUpdate(nil, NewService(newSvc("s", nodePort(30080)))) }, true},
		{"scheduler annotation", func() bool {
			return tr.OnServiceUpdate(nil, NewService(newSvc("s", nodePort(30080), svcAnnotation(AnnotationScheduler, ""))))
		}, true},
		{"delete unknown", func() bool { return tr.OnServiceDelete(NewService(newSvc("other"))) }, false},
		{"slice add", func() bool { return tr.OnEndpointSliceAdd(v4Slice("s", newEP("10.0.0.1"))) }, true},
		{"slice equal", func() bool { return tr.OnEndpointSliceUpdate(nil, v4Slice("s", newEP("10.0.0.1"))) }, false},
		{"slice change", func() bool { return tr.OnEndpointSliceUpdate(nil, v4Slice("s", newEP("10.0.0.2"))) }, true},
		{"other node", func() bool { return tr.OnNodeAdd(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}) }, false},
		{"our node", func() bool { return tr.OnNodeAdd(testNodeObj(zoneLabels("zone-a"), "192.168.1.10")) }, true},
		{"node heartbeat", func() bool {
			n := testNodeObj(zoneLabels("zone-a"), "192.168.1.10")
			n.ResourceVersion = "99"
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
			return tr.OnNodeUpdate(nil, n)
		}, false},
		{"node label", func() bool { return tr.OnNodeUpdate(nil, testNodeObj(zoneLabels("zone-b"), "192.168.1.10")) }, true},
	}
	for _, tt := range tests {
		if got := tt.call(); got != tt.want {
			t.Errorf("%s: changed = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Only changed Services get new *ServicePort values; a Build with nothing
// to do returns the same State.
func TestTrackerReusesUnchangedPorts(t *testing.T) {
	tr := newTestTracker(t)
	tr.OnServiceAdd(NewService(newSvc("a")))
	tr.OnServiceAdd(NewService(newSvc("b", clusterIPs("10.96.0.2"))))
	tr.OnEndpointSliceAdd(v4Slice("a", newEP("10.0.0.1")))
	tr.OnEndpointSliceAdd(v4Slice("b", newEP("10.0.0.2")))
	first := tr.Build()
	if !first.Changed || !first.Full || len(first.State.Services) != 2 {
		t.Fatalf("first build: changed %v full %v services %d", first.Changed, first.Full, len(first.State.Services))
	}

	if again := tr.Build(); again.Changed || again.State != first.State {
		t.Fatalf("idle build changed the State")
	}
	// A State's map is valid until the next Build: keep the pointers.
	a1, b1 := portOf(first.State, "a"), portOf(first.State, "b")

	tr.OnEndpointSliceUpdate(nil, v4Slice("a", newEP("10.0.0.1"), newEP("10.0.0.3")))
	second := tr.Build()
	if !second.Changed || second.Full || second.State == first.State {
		t.Fatalf("second build: changed %v full %v", second.Changed, second.Full)
	}
	if portOf(second.State, "a") == a1 {
		t.Error("changed Service kept its pointer")
	}
	if portOf(second.State, "b") != b1 {
		t.Error("unchanged Service got a new pointer")
	}
	a2 := portOf(second.State, "a")
	if got := epStrings(portOf(second.State, "a").ClusterEndpoints); len(got) != 2 {
		t.Errorf("a endpoints %q", got)
	}

	// A change that does not alter the result (a not-ready endpoint) keeps
	// the pointer, and the State.
	tr.OnEndpointSliceUpdate(nil, v4Slice("a", newEP("10.0.0.1"), newEP("10.0.0.3"), newEP("10.0.0.4", conds(false, false, false))))
	if third := tr.Build(); third.Changed || third.State != second.State {
		t.Error("an invisible change produced a new State")
	}

	// A Node change re-evaluates everything (the State's Node differs) but
	// reuses equal ports.
	tr.OnNodeAdd(testNodeObj(zoneLabels("zone-a")))
	fourth := tr.Build()
	if !fourth.Full || !fourth.Changed || portOf(fourth.State, "a") != a2 {
		t.Errorf("node label without effect on ports: full %v changed %v", fourth.Full, fourth.Changed)
	}

	tr.OnServiceDelete(NewService(newSvc("b")))
	fifth := tr.Build()
	if !fifth.Changed || portOf(fifth.State, "b") != nil || portOf(fifth.State, "a") != a2 {
		t.Error("delete did not remove only b")
	}
	// The Delta hands over the value the map no longer has.
	if d := fifth.State.Delta; d == nil || len(d.Names) != 1 || d.Names[0].Name != "b" || d.Old[0] != b1 {
		t.Errorf("delta of the delete: %+v", d)
	}
}

// A Node change that matters (zone for topology, addresses for NodePorts)
// replaces the affected ports.
func TestTrackerNodeChange(t *testing.T) {
	tr := newTestTracker(t)
	tr.OnServiceAdd(NewService(newSvc("zoned")))
	tr.OnServiceAdd(NewService(newSvc("np", clusterIPs("10.96.0.2"), nodePort(30080))))
	tr.OnEndpointSliceAdd(v4Slice("zoned", newEP("10.0.1.1", zoneHints("zone-a")), newEP("10.0.1.2", zoneHints("zone-b"))))
	tr.OnNodeAdd(testNodeObj(zoneLabels("zone-a"), "192.168.1.10"))
	first := tr.Build()
	if got := epStrings(portOf(first.State, "zoned").ClusterEndpoints); !equalStrings(got, []string{"10.0.1.1:8080"}) {
		t.Fatalf("zoned endpoints %q", got)
	}
	np1 := portOf(first.State, "np")

	tr.OnNodeUpdate(nil, testNodeObj(zoneLabels("zone-b"), "192.168.1.10"))
	second := tr.Build()
	if !second.Full || !second.Changed {
		t.Fatalf("full %v changed %v", second.Full, second.Changed)
	}
	if got := epStrings(portOf(second.State, "zoned").ClusterEndpoints); !equalStrings(got, []string{"10.0.1.2:8080"}) {
		t.Errorf("zoned endpoints after zone change %q", got)
	}
	if portOf(second.State, "np") != np1 {
		t.Error("NodePort Service unaffected by the zone got a new pointer")
	}
	zoned2 := portOf(second.State, "zoned")

	tr.OnNodeUpdate(nil, testNodeObj(zoneLabels("zone-b"), "192.168.1.11"))
	third := tr.Build()
	if got := feStrings(portOf(third.State, "np").Frontends); !equalStrings(got, []string{"ClusterIP 10.96.0.2:80", "NodePort 192.168.1.11:30080"}) {
		t.Errorf("NodePort frontends %q", got)
	}
	if portOf(third.State, "zoned") != zoned2 {
		t.Error("ClusterIP Service unaffected by the address got a new pointer")
	}
}

// A slice whose service-name label changes moves between Services; slices
// without the label are reported until they go away.
func TestTrackerSliceMovesAndOrphans(t *testing.T) {
	tr := newTestTracker(t)
	tr.OnServiceAdd(NewService(newSvc("a")))
	tr.OnServiceAdd(NewService(newSvc("b", clusterIPs("10.96.0.2"))))
	sl := v4Slice("a", newEP("10.0.0.1"))
	tr.OnEndpointSliceAdd(sl)
	tr.Build()

	moved := sl.DeepCopy()
	moved.Labels[discoveryv1.LabelServiceName] = "b"
	tr.OnEndpointSliceUpdate(sl, moved)
	st := tr.Build().State
	if portOf(st, "a").HasEndpoints || !portOf(st, "b").HasEndpoints {
		t.Errorf("slice did not move: a %v b %v", portOf(st, "a").HasEndpoints, portOf(st, "b").HasEndpoints)
	}

	orphan := moved.DeepCopy()
	delete(orphan.Labels, discoveryv1.LabelServiceName)
	tr.OnEndpointSliceUpdate(moved, orphan)
	res := tr.Build()
	if portOf(res.State, "b").HasEndpoints || !hasProblem(res.Problems, "no kubernetes.io/service-name label") {
		t.Errorf("orphan: b has endpoints %v, problems %q", portOf(res.State, "b").HasEndpoints, problemStrings(res.Problems))
	}
	tr.OnEndpointSliceDelete(orphan)
	if res := tr.Build(); len(res.Problems) > 0 {
		t.Errorf("problems after delete: %q", problemStrings(res.Problems))
	}
}

// Whatever the order of events, Build agrees with Translate on the final
// objects: the incremental path has no semantics of its own.
func TestTrackerMatchesTranslate(t *testing.T) {
	cfg := testConfig()
	tr, _ := NewTracker(cfg)
	node := testNodeObj(zoneLabels("zone-a"), "192.168.1.10")
	svcs := []*v1.Service{
		newSvc("a", nodePort(30080), etpLocal),
		newSvc("b", clusterIPs("10.96.0.2"), itpLocal),
		newSvc("bad", clusterIPs("nope")),
	}
	sls := []*discoveryv1.EndpointSlice{
		v4Slice("a", localReady, remoteReady),
		v4Slice("b", newEP("10.0.2.1", zoneHints("zone-a")), newEP("x")),
		newSlice("", "orphan", discoveryv1.AddressTypeIPv4, nil),
	}
	tr.OnServiceAdd(NewService(newSvc("a")))
	tr.OnEndpointSliceAdd(v4Slice("a", remoteReady))
	tr.Build()
	tr.OnNodeAdd(node)
	for _, s := range svcs {
		tr.OnServiceAdd(NewService(s))
	}
	tr.Build()
	for _, s := range sls {
		tr.OnEndpointSliceAdd(s)
	}
	tr.OnServiceAdd(NewService(newSvc("gone", clusterIPs("10.96.0.9"))))
	tr.OnServiceDelete(NewService(newSvc("gone")))
	got := tr.Build()

	want, wantProbs := Translate(cfg, svcs, sls, node)
	// Numbering is the Tracker's own; the content must match.
	gotState := *got.State
	gotState.Generation, gotState.Delta = 0, nil
	if !reflect.DeepEqual(&gotState, want) {
		t.Errorf("Build State differs from Translate:\n%+v\n%+v", got.State, want)
	}
	if !reflect.DeepEqual(got.Problems, wantProbs) {
		t.Errorf("Build problems %q, Translate %q", problemStrings(got.Problems), problemStrings(wantProbs))
	}
}

func TestTrackerForceFullSync(t *testing.T) {
	tr := newTestTracker(t)
	tr.OnServiceAdd(NewService(newSvc("a")))
	first := tr.Build()
	if tr.Pending() {
		t.Error("pending after Build")
	}
	tr.ForceFullSync()
	if !tr.Pending() {
		t.Error("not pending after ForceFullSync")
	}
	second := tr.Build()
	if !second.Full || second.Changed || portOf(second.State, "a") != portOf(first.State, "a") {
		t.Errorf("forced full build: full %v changed %v", second.Full, second.Changed)
	}
}

func TestNewTrackerRejectsBadConfig(t *testing.T) {
	if _, err := NewTracker(Config{NodePortAddresses: []string{"nonsense"}}); err == nil {
		t.Error("no error for bad nodePortAddresses")
	}
}

// TestTrackerDelta: each changed State names exactly the ports that were
// added, replaced or removed since the previous one, so that a datapath
// replaying the deltas over the first State ends with the last.
func TestTrackerDelta(t *testing.T) {
	tr, _ := NewTracker(testConfig())
	tr.OnServiceAdd(NewService(newSvc("a")))
	tr.OnServiceAdd(NewService(newSvc("b", clusterIPs("10.96.0.2"))))
	tr.OnServiceAdd(NewService(newSvc("c", clusterIPs("10.96.0.3"))))
	tr.OnEndpointSliceAdd(v4Slice("a", remoteReady))
	first := tr.Build()
	if first.State.Generation == 0 || first.State.Delta != nil {
		t.Fatalf("first State: generation %d, delta %v", first.State.Generation, first.State.Delta)
	}
	replay := maps.Clone(first.State.Services)
	prev := first.State
	step := func(want ...string) {
		t.Helper()
		s := tr.Build()
		if !s.Changed {
			t.Fatalf("build after a change: not changed")
		}
		names, ok := s.State.ChangedSince(prev.Generation)
		if !ok {
			t.Fatalf("State %d cannot say what changed since %d", s.State.Generation, prev.Generation)
		}
		var got []string
		for i, n := range names {
			if old := s.State.Delta.Old[i]; old != replay[n] {
				t.Errorf("delta's old %s is %p, the previous State had %p", n, old, replay[n])
			}
			got = append(got, n.Name)
			if sp, ok := s.State.Services[n]; ok {
				replay[n] = sp
			} else {
				delete(replay, n)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("delta %v, want %v", got, want)
		}
		if !maps.Equal(replay, s.State.Services) {
			t.Errorf("replaying the deltas gives %v, want %v", replay, s.State.Services)
		}
		if _, ok := s.State.ChangedSince(prev.Generation - 1); ok && prev.Generation > 1 {
			t.Errorf("State %d claims to know the changes since %d", s.State.Generation, prev.Generation-1)
		}
		prev = s.State
	}
	tr.OnEndpointSliceUpdate(nil, v4Slice("a", remoteReady, localReady))
	step("a")
	tr.OnServiceDelete(NewService(newSvc("b")))
	tr.OnServiceAdd(NewService(newSvc("d", clusterIPs("10.96.0.4"))))
	step("b", "d")
	// An update that changes nothing visible: no new State.
	tr.OnServiceUpdate(nil, NewService(newSvc("c", clusterIPs("10.96.0.3"), svcLabel("x", "y"))))
	if s := tr.Build(); s.Changed || s.State != prev {
		t.Fatalf("invisible change: changed %v", s.Changed)
	}
	if names, ok := prev.ChangedSince(prev.Generation); !ok || len(names) != 0 {
		t.Errorf("a State differs from itself: %v %v", names, ok)
	}
}
