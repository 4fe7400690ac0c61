package controller

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Fuzz targets. `go test` runs their seeds as ordinary tests; `make fuzz`
// runs each for longer (go test -fuzz).

// fuzzReader hands out the fuzzer's bytes as small choices; past the
// end, zeros.
type fuzzReader struct {
	b []byte
	i int
}

func (r *fuzzReader) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *fuzzReader) pick(n int) int { return int(r.byte()) % n }
func (r *fuzzReader) done() bool     { return r.i >= len(r.b) }

// fuzzService builds one of a small universe of Service variants: three
// names, every type, both policies, one or two ports (named or not, TCP or
// UDP), a fixed or a bad ClusterIP, externalIPs, LB ingress, affinity.
func fuzzService(r *fuzzReader) *v1.Service {
	name := []string{"a", "b", "c"}[r.pick(3)]
	var opts []svcOpt
	switch r.pick(4) {
	case 1:
		opts = append(opts, nodePort(int32(30000+r.pick(3))))
	case 2:
		opts = append(opts, lbIngress([]string{"203.0.113.10", "203.0.113.11"}[r.pick(2)], ""), nodePort(30100))
	case 3:
		// Some collide with another Service's ClusterIP or LB IP
		// (collision.go).
		opts = append(opts, externalIPs([]string{"198.51.100.1", "198.51.100.2", "10.96.0.1", "203.0.113.10"}[r.pick(4)]))
	}
	if age := r.pick(3); age > 0 {
		opts = append(opts, func(s *v1.Service) {
			s.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, age, 0, time.UTC))
		})
	}
	if r.pick(3) == 0 {
		opts = append(opts, etpLocal)
	}
	if r.pick(3) == 0 {
		opts = append(opts, itpLocal)
	}
	switch r.pick(5) {
	case 0:
		opts = append(opts, clusterIPs("10.96.0."+fmt.Sprint(1+r.pick(4))))
	case 1:
		opts = append(opts, clusterIPs("not-an-ip"))
	case 2:
		opts = append(opts, clusterIPs("10.96.0.9", "fd00::9"))
	}
	ps := []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")}}
	switch r.pick(4) {
	case 1:
		ps = append(ps, v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)})
	case 2:
		ps = []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: int32(80 + r.pick(2)), TargetPort: intstr.FromInt32(8080)}}
	case 3:
		ps = append(ps, v1.ServicePort{Name: "http", Protocol: v1.ProtocolTCP, Port: 81}) // a duplicate name
	}
	opts = append(opts, ports(ps...))
	if r.pick(4) == 0 {
		opts = append(opts, func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		})
	}
	svc := newSvc(name, opts...)
	if svc.Spec.Type == v1.ServiceTypeClusterIP && r.pick(6) == 0 {
		svc.Spec.Type = v1.ServiceTypeExternalName
	}
	return svc
}

// fuzzSlice builds one of a small universe of EndpointSlices: four names
// over the three Services (and none), either family, endpoints from a
// pool with every condition, node and hint.
func fuzzSlice(r *fuzzReader) *discoveryv1.EndpointSlice {
	svc := []string{"a", "b", "c", ""}[r.pick(4)]
	name := fmt.Sprintf("s%d", r.pick(4))
	at := discoveryv1.AddressTypeIPv4
	addr := func(i int) string { return fmt.Sprintf("10.0.%d.%d", i/4, 1+i%4) }
	if r.pick(5) == 0 {
		at = discoveryv1.AddressTypeIPv6
		addr = func(i int) string { return fmt.Sprintf("fd00::%d", 1+i) }
	}
	ps := []discoveryv1.EndpointPort{slicePortOf("http", int32(8080+r.pick(2)))}
	if r.pick(3) == 0 {
		udp := v1.ProtocolUDP
		ps = append(ps, discoveryv1.EndpointPort{Name: ptr("dns"), Port: ptr(int32(5353)), Protocol: &udp})
	}
	var eps []discoveryv1.Endpoint
	for range r.pick(5) {
		var opts []epOpt
		switch r.pick(5) {
		case 0:
			opts = append(opts, conds(true, true, false))
		case 1:
			opts = append(opts, conds(false, true, true))
		case 2:
			opts = append(opts, conds(false, false, true))
		case 3:
			opts = append(opts, ready(false))
		}
		switch r.pick(3) {
		case 0:
			opts = append(opts, local)
		case 1:
			opts = append(opts, onNode("node-b"))
		}
		if r.pick(4) == 0 {
			opts = append(opts, zoneHints([]string{testZone, "zone-b"}[r.pick(2)]))
		}
		a := addr(r.pick(8))
		if r.pick(16) == 0 {
			a = "bogus"
		}
		eps = append(eps, newEP(a, opts...))
	}
	return newSlice(svc, name, at, ps, eps...)
}

// FuzzTrackerMatchesTranslate: whatever the events, in whatever order,
// with Builds anywhere between them, the Tracker's State and problems
// equal Translate's over the objects as they end up: the incremental path
// has no semantics of its own.
func FuzzTrackerMatchesTranslate(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		{1, 0, 0, 1, 1, 0, 2, 2, 2, 0, 1, 1, 3, 3, 0, 5, 5, 6, 1, 2},
		{0, 9, 0, 0, 0, 0, 1, 1, 3, 0, 0, 1, 2, 3, 4, 0, 1, 0, 0, 4, 4, 2, 1, 0},
		{3, 3, 3, 2, 2, 2, 1, 1, 1, 0, 0, 0, 7, 7, 7, 5, 5, 5, 4, 4, 4, 9, 9},
		[]byte("the quick brown fox jumps over the lazy dog, twice: the quick brown fox"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		cfg := testConfig()
		// Low enough that a drawn Service with a NodePort, an LB IP or an
		// externalIP and two ports crosses it.
		cfg.MaxFrontendsPerService = 4
		tr, err := NewTracker(cfg)
		if err != nil {
			t.Fatal(err)
		}
		svcs := map[string]*v1.Service{}
		sls := map[string]*discoveryv1.EndpointSlice{}
		var node *v1.Node
		for steps := 0; !r.done() && steps < 64; steps++ {
			switch r.pick(8) {
			case 0, 1:
				s := fuzzService(r)
				if old := svcs[s.Name]; old != nil {
					tr.OnServiceUpdate(NewService(old), NewService(s))
				} else {
					tr.OnServiceAdd(NewService(s))
				}
				svcs[s.Name] = s
			case 2:
				for _, name := range []string{"a", "b", "c"}[r.pick(3):] {
					if s := svcs[name]; s != nil {
						tr.OnServiceDelete(NewService(s))
						delete(svcs, name)
						break
					}
				}
			case 3, 4:
				s := fuzzSlice(r)
				if old := sls[s.Name]; old != nil {
					tr.OnEndpointSliceUpdate(old, s)
				} else {
					tr.OnEndpointSliceAdd(s)
				}
				sls[s.Name] = s
			case 5:
				name := fmt.Sprintf("s%d", r.pick(4))
				if s := sls[name]; s != nil {
					tr.OnEndpointSliceDelete(s)
					delete(sls, name)
				}
			case 6:
				n := testNodeObj(zoneLabels([]string{testZone, "zone-b"}[r.pick(2)]), []string{"192.168.1.10", "192.168.1.11"}[r.pick(2)])
				if node != nil {
					tr.OnNodeUpdate(node, n)
				} else {
					tr.OnNodeAdd(n)
				}
				node = n
			case 7:
				tr.Build()
			}
		}
		got := tr.Build()
		want, wantProbs := Translate(cfg, sortedValues(svcs), sortedValues(sls), node)
		gotState := *got.State
		gotState.Generation, gotState.Delta = 0, nil
		if !reflect.DeepEqual(&gotState, want) {
			t.Fatalf("Tracker State differs from Translate:\n%+v\n%+v", &gotState, want)
		}
		if !reflect.DeepEqual(got.Problems, wantProbs) {
			t.Fatalf("Tracker problems %q, Translate %q", problemStrings(got.Problems), problemStrings(wantProbs))
		}
	})
}

func sortedValues[T any](m map[string]*T) []*T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]*T, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// FuzzDecodeManifests: the file source's decoder takes any bytes (a
// manifest stream that is not YAML, objects of any kind with any fields)
// without a panic, and what it keeps the Tracker builds a State from
// without one too.
func FuzzDecodeManifests(f *testing.F) {
	for _, seed := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a-1, namespace: ns, labels: {kubernetes.io/service-name: a}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}]\nports: [{port: 8080}]\n",
		"---\n---\nkind: List\nitems: [{kind: Service}]\n",
		"apiVersion: v1\nkind: Service\nspec: {ports: [{port: 99999999999}], clusterIPs: [\"::\", x]}\n",
		"apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: 1.2.3.4}]}\n",
		"{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"j\"},\"spec\":{\"type\":\"LoadBalancer\",\"ports\":[{\"port\":1,\"nodePort\":-5}]}}",
		"\x00\xff: [",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, _, _ := decodeManifests("fuzz.yaml", data)
		// What the file source does with them: the Tracker, then a Build.
		tr, err := NewTracker(testConfig())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch v := o.obj.(type) {
			case *Service:
				tr.OnServiceAdd(v)
			case *Slice:
				tr.OnSliceAdd(v)
			case *v1.Node:
				tr.OnNodeAdd(v)
			}
		}
		tr.Build()
	})
}
