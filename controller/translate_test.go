package controller

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xvs-lb/xvs/model"
)

// §3.1: which Services are programmed.
func TestWhichServicesAreProgrammed(t *testing.T) {
	tests := []struct {
		name      string
		proxyName string
		svc       *v1.Service
		want      bool
		problem   string
	}{
		{name: "plain", svc: newSvc("s"), want: true},
		{name: "headless", svc: newSvc("s", clusterIPs(v1.ClusterIPNone))},
		{name: "ExternalName", svc: newSvc("s", svcType(v1.ServiceTypeExternalName), clusterIPs("10.96.0.9"))},
		{name: "headless label", svc: newSvc("s", svcLabel("service.kubernetes.io/headless", ""))},
		{name: "no clusterIP", svc: newSvc("s", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
			problem: "no clusterIP"},
		{name: "bad clusterIP", svc: newSvc("s", clusterIPs("10.96.0.300")), problem: "does not parse"},
		{name: "only spec.clusterIP", svc: newSvc("s", func(s *v1.Service) { s.Spec.ClusterIPs = nil }), want: true},
		{name: "proxy-name label, ours unset", svc: newSvc("s", svcLabel(LabelServiceProxyName, "xvs"))},
		{name: "proxy-name label equal", proxyName: "xvs", svc: newSvc("s", svcLabel(LabelServiceProxyName, "xvs")), want: true},
		{name: "proxy-name label other", proxyName: "xvs", svc: newSvc("s", svcLabel(LabelServiceProxyName, "other"))},
		{name: "no proxy-name label, ours set", proxyName: "xvs", svc: newSvc("s")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.ServiceProxyName = tt.proxyName
			sp, probs := translateOne(t, cfg, nil, tt.svc, v4Slice("s", newEP("10.0.0.1")))
			if (sp != nil) != tt.want {
				t.Fatalf("programmed = %v, want %v", sp != nil, tt.want)
			}
			if tt.problem == "" && len(probs) > 0 {
				t.Errorf("unexpected problems %q", problemStrings(probs))
			}
			if tt.problem != "" && !hasProblem(probs, tt.problem) {
				t.Errorf("problems %q, want one containing %q", problemStrings(probs), tt.problem)
			}
		})
	}
}

// A bad Service, or a bad port, never affects the others.
func TestBadInputIsIsolated(t *testing.T) {
	good := newSvc("good")
	bad := newSvc("bad", clusterIPs("not-an-ip"))
	mixed := newSvc("mixed", clusterIPs("10.96.0.2"), ports(
		v1.ServicePort{Name: "http", Protocol: v1.ProtocolTCP, Port: 80},
		v1.ServicePort{Name: "weird", Protocol: "ICMP", Port: 81},
		v1.ServicePort{Name: "big", Protocol: v1.ProtocolTCP, Port: 70000},
	))
	st, probs := Translate(testConfig(), []*v1.Service{bad, good, mixed}, nil, nil)
	want := []model.ServicePortName{
		{Namespace: "ns", Name: "good", Port: "http", Protocol: model.TCP},
		{Namespace: "ns", Name: "mixed", Port: "http", Protocol: model.TCP},
	}
	if len(st.Services) != len(want) {
		t.Fatalf("got %d ports, want %v", len(st.Services), want)
	}
	for _, k := range want {
		if st.Services[k] == nil {
			t.Errorf("missing %s", k)
		}
	}
	for _, s := range []string{"Service ns/bad: clusterIP", `port "weird"`, `port "big"`} {
		if !hasProblem(probs, s) {
			t.Errorf("problems %q lack %q", problemStrings(probs), s)
		}
	}
}

// A Service asking for more frontends than MaxFrontendsPerService (ports on
// all its addresses) is refused whole with a Problem naming the count and
// the flag; the others, one exactly at the limit included, are served. The
// Tracker decides the same way.
func TestMaxFrontendsPerService(t *testing.T) {
	manyIPs := func(n int) svcOpt {
		var ips []string
		for i := range n {
			ips = append(ips, fmt.Sprintf("198.51.100.%d", i+1))
		}
		return externalIPs(ips...)
	}
	twoPorts := ports(
		v1.ServicePort{Name: "http", Protocol: v1.ProtocolTCP, Port: 80},
		v1.ServicePort{Name: "https", Protocol: v1.ProtocolTCP, Port: 443},
	)
	// 2 ports x (1 ClusterIP + 4 externalIPs) = 10; 2 x (1 + 5) = 12.
	atLimit := newSvc("at-limit", clusterIPs("10.96.0.2"), twoPorts, manyIPs(4))
	over := newSvc("over", clusterIPs("10.96.0.3"), twoPorts, manyIPs(5))
	small := newSvc("small")
	cfg := testConfig()
	cfg.MaxFrontendsPerService = 10
	st, probs := Translate(cfg, []*v1.Service{atLimit, over, small}, nil, nil)
	var got []string
	for name := range st.Services {
		got = append(got, name.Name+":"+name.Port)
	}
	slices.Sort(got)
	if want := []string{"at-limit:http", "at-limit:https", "small:http"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if !hasProblem(probs, "Service ns/over: 12 frontends (2 ports on their addresses) exceed the limit of 10 per Service (--max-frontends-per-service)") {
		t.Fatalf("problems %q lack the refusal of ns/over", problemStrings(probs))
	}
	tr, err := NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []*v1.Service{atLimit, over, small} {
		tr.OnServiceAdd(NewService(svc))
	}
	if tst := tr.Build().State; len(tst.Services) != len(st.Services) {
		t.Fatalf("the Tracker serves %d ports, Translate %d", len(tst.Services), len(st.Services))
	}
	// Raised, the same Service is served.
	cfg.MaxFrontendsPerService = 0
	if st, _ := Translate(cfg, []*v1.Service{over}, nil, nil); len(st.Services) != 2 {
		t.Fatalf("without a limit: %d ports served, want 2", len(st.Services))
	}
}

// §3.1 and §3.5: ingress ipMode Proxy is not captured; VIP and unset are.
func TestLoadBalancerIngress(t *testing.T) {
	svc := newSvc("s",
		lbIngress("192.0.2.1", ""),
		lbIngress("192.0.2.2", v1.LoadBalancerIPModeVIP),
		lbIngress("192.0.2.3", v1.LoadBalancerIPModeProxy),
		lbIngress("", ""), // hostname-only ingress
		lbIngress("192.0.2.1", ""),
		externalIPs("192.0.2.2"), // also an LB IP: served once, as ExternalIP
	)
	sp, probs := translateOne(t, testConfig(), nil, svc)
	want := []string{"ClusterIP 10.96.0.1:80", "ExternalIP 192.0.2.2:80", "LoadBalancer 192.0.2.1:80"}
	if got := feStrings(sp.Frontends); !equalStrings(got, want) {
		t.Errorf("frontends %q, want %q", got, want)
	}
	if len(probs) > 0 {
		t.Errorf("unexpected problems %q", problemStrings(probs))
	}
}

// §3.1: slices are merged by service-name label, FQDN ones ignored,
// endpoints de-duplicated by IP:port, named targetPorts resolved per slice.
func TestEndpointSliceMerging(t *testing.T) {
	httpAt := func(n int32) []discoveryv1.EndpointPort { return []discoveryv1.EndpointPort{slicePortOf("http", n)} }
	tests := []struct {
		name    string
		slices  []*discoveryv1.EndpointSlice
		want    []string
		problem string
	}{
		{name: "merged and deduplicated", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, httpAt(8080), newEP("10.0.0.2"), newEP("10.0.0.1")),
			newSlice("s", "b", discoveryv1.AddressTypeIPv4, httpAt(8080), newEP("10.0.0.1"), newEP("10.0.0.3")),
		}, want: []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}},
		{name: "named targetPort per slice", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, httpAt(8080), newEP("10.0.0.1")),
			newSlice("s", "b", discoveryv1.AddressTypeIPv4, httpAt(9090), newEP("10.0.0.2"), newEP("10.0.0.1")),
		}, want: []string{"10.0.0.1:8080", "10.0.0.1:9090", "10.0.0.2:9090"}},
		{name: "other port name and other protocol ignored", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				slicePortOf("metrics", 9100),
				{Name: ptr("http"), Port: ptr(int32(5353)), Protocol: ptr(v1.ProtocolUDP)},
				slicePortOf("http", 8080),
			}, newEP("10.0.0.1")),
		}, want: []string{"10.0.0.1:8080"}},
		{name: "FQDN slice ignored", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeFQDN, httpAt(8080), newEP("example.com")),
		}},
		{name: "other Service's slice", slices: []*discoveryv1.EndpointSlice{v4Slice("t", newEP("10.0.0.1"))}},
		{name: "no service-name label", slices: []*discoveryv1.EndpointSlice{
			newSlice("", "a", discoveryv1.AddressTypeIPv4, httpAt(8080), newEP("10.0.0.1")),
		}, problem: "no kubernetes.io/service-name label"},
		{name: "bad endpoints skipped", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, httpAt(8080),
				newEP("10.0.0.1"), newEP("10.0.0.x"), discoveryv1.Endpoint{}, newEP("fd00::1"), newEP("010.000.000.002")),
		}, want: []string{"10.0.0.1:8080", "10.0.0.2:8080"}, problem: `endpoint 1: address "10.0.0.x" does not parse`},
		{name: "port without name ignored", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Port: ptr(int32(8080))}}, newEP("10.0.0.1")),
		}, problem: "port 0 has no name"},
		{name: "port without number ignored", slices: []*discoveryv1.EndpointSlice{
			newSlice("s", "a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: ptr("http")}}, newEP("10.0.0.1")),
		}, problem: `port "http" has no valid number`},
		{name: "slice filtered like its Service", slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			s := v4Slice("s", newEP("10.0.0.1"))
			s.Labels[LabelServiceProxyName] = "other"
			return s
		}()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, probs := translateOne(t, testConfig(), nil, newSvc("s"), tt.slices...)
			if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, tt.want) {
				t.Errorf("endpoints %q, want %q", got, tt.want)
			}
			if sp.HasEndpoints != (len(tt.want) > 0) {
				t.Errorf("HasEndpoints = %v", sp.HasEndpoints)
			}
			if tt.problem == "" && len(probs) > 0 {
				t.Errorf("unexpected problems %q", problemStrings(probs))
			}
			if tt.problem != "" && !hasProblem(probs, tt.problem) {
				t.Errorf("problems %q, want one containing %q", problemStrings(probs), tt.problem)
			}
		})
	}
}

// A duplicate endpoint that is local on one slice is taken as local, as
// kube-proxy does.
func TestDuplicateEndpointPrefersLocal(t *testing.T) {
	p := []discoveryv1.EndpointPort{slicePortOf("http", 8080)}
	sp, _ := translateOne(t, testConfig(), nil, newSvc("s", itpLocal),
		newSlice("s", "a", discoveryv1.AddressTypeIPv4, p, newEP("10.0.0.1", onNode("node-b"))),
		newSlice("s", "b", discoveryv1.AddressTypeIPv4, p, newEP("10.0.0.1", local)),
	)
	if got := epStrings(sp.LocalEndpoints); !equalStrings(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("local endpoints %q", got)
	}
}

// Of duplicates that are not local, the first in slice-name order is
// kept, whatever order the slices and their endpoints come in.
func TestDuplicateEndpointFirstWins(t *testing.T) {
	p := []discoveryv1.EndpointPort{slicePortOf("http", 8080)}
	for _, tc := range []struct {
		first, second string
		want          []string
	}{
		{"a", "b", []string{"10.0.0.2:8080"}},                  // the not-ready copy is first
		{"b", "a", []string{"10.0.0.1:8080", "10.0.0.2:8080"}}, // the ready copy is first
	} {
		sp, _ := translateOne(t, testConfig(), nil, newSvc("s"),
			newSlice("s", tc.second, discoveryv1.AddressTypeIPv4, p, newEP("10.0.0.2"), newEP("10.0.0.1")),
			newSlice("s", tc.first, discoveryv1.AddressTypeIPv4, p, newEP("10.0.0.1", conds(false, false, false))),
		)
		if got := epStrings(sp.ClusterEndpoints); !equalStrings(got, tc.want) {
			t.Errorf("not-ready copy in slice %q, ready copy in %q: endpoints %q, want %q", tc.first, tc.second, got, tc.want)
		}
	}
}

// Same port number on TCP and UDP are independent ServicePorts (§3.2).
func TestProtocolsAreIndependent(t *testing.T) {
	svc := newSvc("dns", ports(
		v1.ServicePort{Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(5353)},
		v1.ServicePort{Name: "dns-udp", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5354)},
	))
	udp := v1.ProtocolUDP
	sl := newSlice("dns", "dns-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
		slicePortOf("dns-tcp", 5353),
		{Name: ptr("dns-udp"), Port: ptr(int32(5354)), Protocol: &udp},
	}, newEP("10.0.0.1"))
	st, _ := Translate(testConfig(), []*v1.Service{svc}, []*discoveryv1.EndpointSlice{sl}, nil)
	for name, want := range map[model.ServicePortName]string{
		{Namespace: "ns", Name: "dns", Port: "dns-tcp", Protocol: model.TCP}: "10.0.0.1:5353",
		{Namespace: "ns", Name: "dns", Port: "dns-udp", Protocol: model.UDP}: "10.0.0.1:5354",
	} {
		sp := st.Services[name]
		if sp == nil || sp.Frontends[0].Proto != name.Protocol || !equalStrings(epStrings(sp.ClusterEndpoints), []string{want}) {
			t.Errorf("%s: got %+v, want endpoint %s", name, sp, want)
		}
	}
}

// §3.7: session affinity.
func TestSessionAffinity(t *testing.T) {
	withTimeout := func(s int32) svcOpt {
		return func(svc *v1.Service) {
			svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &s}}
		}
	}
	tests := []struct {
		name    string
		opt     svcOpt
		want    model.Affinity
		problem string
	}{
		{name: "none", opt: func(*v1.Service) {}},
		{name: "explicit None", opt: func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityNone }},
		{name: "default timeout", opt: func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP },
			want: model.Affinity{ClientIP: true, TimeoutSeconds: 10800}},
		{name: "explicit timeout", opt: withTimeout(125), want: model.Affinity{ClientIP: true, TimeoutSeconds: 125}},
		{name: "timeout out of range", opt: withTimeout(86401),
			want: model.Affinity{ClientIP: true, TimeoutSeconds: 10800}, problem: "outside 1..86400"},
		{name: "unknown affinity", opt: func(s *v1.Service) { s.Spec.SessionAffinity = "Cookie" }, problem: "unknown sessionAffinity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, probs := translateOne(t, testConfig(), nil, newSvc("s", tt.opt))
			if sp.Affinity != tt.want {
				t.Errorf("affinity %+v, want %+v", sp.Affinity, tt.want)
			}
			if (tt.problem != "") != hasProblem(probs, tt.problem) || (tt.problem == "" && len(probs) > 0) {
				t.Errorf("problems %q, want %q", problemStrings(probs), tt.problem)
			}
		})
	}
}

// §3.6: loadBalancerSourceRanges.
func TestLoadBalancerSourceRanges(t *testing.T) {
	t.Run("whitespace and host bits", func(t *testing.T) {
		sp, probs := translateOne(t, testConfig(), nil, newSvc("s", lbIngress("192.0.2.1", ""),
			sourceRanges(" 203.0.113.0/25", "198.51.100.7/24 ", "2001:db8::/64")))
		want := []netip.Prefix{
			netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/64"),
		}
		if len(probs) > 0 || len(sp.SourceRanges) != 3 || sp.SourceRanges[0] != want[0] || sp.SourceRanges[1] != want[1] || sp.SourceRanges[2] != want[2] {
			t.Fatalf("ranges %v problems %q, want %v", sp.SourceRanges, problemStrings(probs), want)
		}
		// Per family: an IPv6 LB address is filtered only by IPv6 ranges.
		if got := sp.SourceRangesFor(netip.MustParseAddr("2001:db8:1::1")); len(got) != 1 || got[0] != want[2] {
			t.Errorf("SourceRangesFor(v6) = %v", got)
		}
	})
	t.Run("bad range withholds LB frontends only", func(t *testing.T) {
		sp, probs := translateOne(t, testConfig(), nil, newSvc("s", lbIngress("192.0.2.1", ""), nodePort(30080),
			sourceRanges("203.0.113.0/25", "203.0.113.300/32")), v4Slice("s", newEP("10.0.0.1")))
		if !hasProblem(probs, `"203.0.113.300/32" is not a CIDR`) {
			t.Errorf("problems %q", problemStrings(probs))
		}
		for _, f := range sp.Frontends {
			if f.Kind == model.LoadBalancer {
				t.Errorf("LB frontend %s served despite a bad source range", f)
			}
		}
		if sp.Frontends[0].Kind != model.ClusterIP {
			t.Errorf("frontends %q", feStrings(sp.Frontends))
		}
	})
}

// The scheduler annotation overrides the configured default.
func TestScheduler(t *testing.T) {
	cfg := testConfig()
	cfg.Scheduler = "rr"
	for _, tt := range []struct {
		opt           svcOpt
		want, problem string
	}{
		{opt: func(*v1.Service) {}, want: "rr"},
		{opt: svcAnnotation(AnnotationScheduler, "mh"), want: "mh"},
		{opt: svcAnnotation(AnnotationScheduler, ""), want: ""},
		{opt: svcAnnotation(AnnotationScheduler, "fastest"), want: "rr", problem: `unknown scheduler "fastest"`},
	} {
		sp, probs := translateOne(t, cfg, nil, newSvc("s", tt.opt))
		if sp.Scheduler != tt.want || hasProblem(probs, tt.problem) != (tt.problem != "") {
			t.Errorf("scheduler %q problems %q, want %q %q", sp.Scheduler, problemStrings(probs), tt.want, tt.problem)
		}
	}
}

// A hostile tenant's annotations and fields reach logs and Events only
// as short quoted prefixes: a 256 KB weights annotation of bad entries and
// a 100 KB scheduler name give a few hundred bytes of reasons.
func TestProblemsQuoteTenantTextShortly(t *testing.T) {
	weights := strings.Repeat("x,", 128<<10)
	sp, probs := translateOne(t, testConfig(), nil, newSvc("s",
		svcAnnotation(AnnotationWeights, weights),
		svcAnnotation(AnnotationScheduler, strings.Repeat("s", 100<<10)),
		sourceRanges(strings.Repeat("9", 50<<10))))
	if sp == nil {
		t.Fatal("Service not translated")
	}
	total := 0
	for _, p := range probs {
		total += len(p.Reason)
	}
	if total > 2048 || len(probs) > 8 {
		t.Fatalf("%d problems with %d bytes of reasons:\n%s", len(probs), total, strings.Join(problemStrings(probs), "\n"))
	}
	if !hasProblem(probs, "131069 more entries are not key=weight") || !hasProblem(probs, "(102400 bytes)") {
		t.Errorf("problems do not count the rest or give the length: %q", problemStrings(probs))
	}
}

// §3.3: which addresses NodePorts are served on.
func TestNodePortAddresses(t *testing.T) {
	dual := testNodeObj(nil, "ext:203.0.113.5", "192.168.1.10", "192.168.2.10", "fd00::10", "127.0.0.1", "fd00::20")
	tests := []struct {
		name     string
		npa      []string
		override []string
		node     *v1.Node
		want     []string
	}{
		{name: "unset is primary per family", node: dual,
			want: []string{"NodePort 192.168.1.10:30080", "NodePort [fd00::10]:30080"}},
		{name: "primary", npa: []string{"primary"}, node: dual,
			want: []string{"NodePort 192.168.1.10:30080", "NodePort [fd00::10]:30080"}},
		{name: "CIDR selects; unlisted family gets all", npa: []string{"192.168.2.0/24", "203.0.113.0/24"}, node: dual,
			want: []string{"NodePort 192.168.2.10:30080", "NodePort 203.0.113.5:30080", "NodePort [fd00::10]:30080", "NodePort [fd00::20]:30080"}},
		{name: "zero CIDR never serves loopback", npa: []string{"0.0.0.0/0", "::/0"}, node: dual,
			want: []string{"NodePort 192.168.1.10:30080", "NodePort 192.168.2.10:30080", "NodePort 203.0.113.5:30080",
				"NodePort [fd00::10]:30080", "NodePort [fd00::20]:30080"}},
		{name: "loopback CIDR matches nothing", npa: []string{"127.0.0.0/8", "::1/128"}, node: dual},
		{name: "loopback primary is not served", override: []string{"127.0.0.1", "10.0.0.1"}},
		{name: "config addresses override the Node", override: []string{"10.0.0.1", "10.0.0.2"}, node: dual,
			want: []string{"NodePort 10.0.0.1:30080"}},
		{name: "no node addresses", node: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.NodePortAddresses = tt.npa
			for _, a := range tt.override {
				cfg.NodeAddresses = append(cfg.NodeAddresses, netip.MustParseAddr(a))
			}
			svc := newSvc("s", clusterIPs("10.96.0.1", "fd00:96::1"), nodePort(30080))
			sp, probs := translateOne(t, cfg, tt.node, svc)
			var got []string
			for _, f := range feStrings(sp.Frontends) {
				if strings.HasPrefix(f, "NodePort") {
					got = append(got, f)
				}
			}
			if !equalStrings(got, tt.want) || len(probs) > 0 {
				t.Errorf("NodePort frontends %q problems %q, want %q", got, problemStrings(probs), tt.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg Config
		ok  bool
	}{
		{cfg: Config{}, ok: true},
		{cfg: Config{NodePortAddresses: []string{"primary"}, Scheduler: "rr"}, ok: true},
		{cfg: Config{NodePortAddresses: []string{"10.0.0.0/8", "fd00::/8"}}, ok: true},
		{cfg: Config{NodePortAddresses: []string{"primary", "10.0.0.0/8"}}},
		{cfg: Config{NodePortAddresses: []string{"10.0.0.0"}}},
		{cfg: Config{Scheduler: "fastest"}},
	} {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate() = %v", tt.cfg, err)
		}
	}
}

// Scheduler weights come from the xvs.io/weights annotation, by endpoint
// address or pod name; bad entries are reported and weigh 1.
func TestWeightsAnnotation(t *testing.T) {
	pod := func(name string) epOpt {
		return func(e *discoveryv1.Endpoint) { e.TargetRef = &v1.ObjectReference{Kind: "Pod", Name: name} }
	}
	svc := newSvc("s", svcAnnotation(AnnotationWeights, " web-0=3, 10.0.0.2 = 2, bogus, web-9=0"), svcAnnotation(AnnotationScheduler, "wrr"))
	sl := v4Slice("s", newEP("10.0.0.1", pod("web-0")), newEP("10.0.0.2", pod("web-1")), newEP("10.0.0.3", pod("web-2")))
	sp, probs := translateOne(t, testConfig(), nil, svc, sl)
	got := map[string]uint16{}
	for _, e := range sp.ClusterEndpoints {
		got[e.Addr.String()] = e.Weight
	}
	if got["10.0.0.1"] != 3 || got["10.0.0.2"] != 2 || got["10.0.0.3"] != 1 || sp.Scheduler != "wrr" {
		t.Fatalf("weights %v, scheduler %q", got, sp.Scheduler)
	}
	if len(probs) != 2 || !strings.Contains(probs[0].Reason+probs[1].Reason, `"bogus"`) {
		t.Fatalf("problems: %v", probs)
	}
}

// TestTrimObject: the informers' transform keeps everything the
// translation reads (the same State and problems from trimmed objects)
// and drops the bulk the proxy never reads.
func TestTrimObject(t *testing.T) {
	big := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	svc := newSvc("a", nodePort(30080), etpLocal, svcLabel("app", "a"))
	svc.ManagedFields = big
	svc.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	svc.Labels["app.kubernetes.io/name"] = "a"
	svc.Labels["helm.sh/chart"] = "a-1.0.0"
	svc.Spec.Selector = map[string]string{"app.kubernetes.io/name": "a"}
	svc.OwnerReferences = []metav1.OwnerReference{{Kind: "HelmRelease", Name: "a"}}
	svc.Finalizers = []string{"service.kubernetes.io/load-balancer-cleanup"}
	svc.Annotations = map[string]string{
		"kubectl.kubernetes.io/last-applied-configuration": `{"a very":"long copy"}`,
		AnnotationScheduler: "rr",
	}
	ep := newEP("10.0.0.1", local)
	ep.Hostname = ptr("pod-a")
	ep.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "pod-a", UID: "u", ResourceVersion: "9"}
	sl := v4Slice("a", ep, remoteReady)
	sl.ManagedFields = big
	sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-30T14:00:00Z", "other": "x"}
	node := testNodeObj(zoneLabels("zone-a"), "192.168.1.10")
	node.ManagedFields = big
	node.Spec.Taints = []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}
	node.Status.Images = []v1.ContainerImage{{Names: []string{"registry.example/some/image:tag"}}}

	cfg := testConfig()
	want, wantProbs := Translate(cfg, []*v1.Service{svc}, []*discoveryv1.EndpointSlice{sl}, node)
	trim := func(o any) any {
		t.Helper()
		out, err := TrimObject(o)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tsvc := trim(svc.DeepCopy()).(*Service)
	tsl := trim(sl.DeepCopy()).(*Slice)
	tnode := trim(node.DeepCopy()).(*v1.Node)
	if again := trim(tsl); again != tsl {
		t.Error("a Slice is transformed again")
	}
	if again := trim(tsvc); again != tsvc {
		t.Error("a Service is transformed again")
	}
	tr := newTestTracker(t)
	tr.OnServiceAdd(tsvc)
	tr.OnSliceAdd(tsl)
	tr.OnNodeAdd(tnode)
	b := tr.Build()
	got := *b.State
	got.Generation, got.Delta = 0, nil
	if !reflect.DeepEqual(&got, want) || !reflect.DeepEqual(b.Problems, wantProbs) {
		t.Errorf("trimmed objects translate differently:\n%+v\n%+v", &got, want)
	}
	if len(tsvc.Annotations) != 1 || tsvc.Annotations[AnnotationScheduler] != "rr" || tsvc.Labels != nil {
		t.Errorf("service keeps annotations %v, labels %v", tsvc.Annotations, tsvc.Labels)
	}
	if tsvc.Name != svc.Name || tsvc.Namespace != svc.Namespace || tsvc.UID != svc.UID || tsvc.ResourceVersion != svc.ResourceVersion ||
		!tsvc.Created.Equal(svc.CreationTimestamp.Time) {
		t.Errorf("service loses what an Event's reference or a frontend claim needs: %+v", tsvc.Meta)
	}
	if tsl.Labels != nil || !tsl.TriggerTime.Equal(time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)) ||
		tsl.Endpoints[0].Target != PodNameOf("pod-a") || tsl.Name != sl.Name || tsl.UID != sl.UID {
		t.Errorf("slice keeps %v %+v", tsl.Labels, tsl.Endpoints[0])
	}
	if tnode.Status.Images != nil || len(tnode.Spec.Taints) != 1 || len(tnode.Status.Addresses) == 0 {
		t.Errorf("node keeps images %v, taints %v, addresses %v", tnode.Status.Images, tnode.Spec.Taints, tnode.Status.Addresses)
	}
	// The labels that decide whether this proxy serves a Service stay.
	named := trim(newSvc("b", svcLabel("app", "b"), svcLabel(LabelServiceProxyName, "other"))).(*Service)
	if !maps.Equal(named.Labels, map[string]string{LabelServiceProxyName: "other"}) {
		t.Errorf("service-proxy-name label: labels trimmed to %v", named.Labels)
	}
	if o, err := TrimObject("a tombstone"); err != nil || o != "a tombstone" {
		t.Errorf("other objects: %v %v", o, err)
	}
}
