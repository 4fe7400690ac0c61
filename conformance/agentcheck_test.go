package conformance

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestExpectAgent(t *testing.T) {
	sc := &Scenario{Node: NodeSpec{Name: "node-a"}}
	node := func(meta, rest string) string {
		return `{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"` + meta + `}` + rest + `}`
	}
	svc := func(name, spec string) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"` + name + `","namespace":"ns"` + `},"spec":{` + spec + `}}`
	}
	slice := func(svc, fam, eps string) string {
		return `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"` + svc + `-` + fam +
			`","namespace":"ns","labels":{"kubernetes.io/service-name":"` + svc + `"}},"addressType":"` + fam +
			`","endpoints":[` + eps + `],"ports":[{"name":"http","port":8080},{"name":"dns","port":8053,"protocol":"UDP"}]}`
	}
	remote := `{"addresses":["10.0.2.1"],"nodeName":"node-b"}`
	local := `{"addresses":["10.0.1.1"],"nodeName":"node-a"}`
	ports := `"ports":[{"name":"http","port":80,"nodePort":30001},{"name":"dns","port":53,"protocol":"UDP","nodePort":30001}]`
	for _, c := range []struct {
		name     string
		objs     []string
		eligible bool
		noLocal  string
	}{
		{"nothing: the supplied Node", nil, true, "none"},
		{"plain Node", []string{node("", "")}, true, "none"},
		{"autoscaler taint", []string{node("", `,"spec":{"taints":[{"key":"ToBeDeletedByClusterAutoscaler","effect":"NoSchedule"}]}`)}, false, "none"},
		{"other taint", []string{node("", `,"spec":{"unschedulable":true,"taints":[{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"}]}`)}, true, "none"},
		{"being deleted", []string{node(`,"deletionTimestamp":"2026-01-01T00:00:00Z"`, "")}, false, "none"},
		{"eTP=Local NodePort, remote endpoints: each port",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports), slice("a", "IPv4", remote)},
			true, "external/IPv4=2"},
		{"eTP=Local with a local endpoint",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports), slice("a", "IPv4", remote+","+local)},
			true, "none"},
		{"eTP=Local without endpoints: rejected, not counted",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports)},
			true, "none"},
		{"iTP=Local and eTP=Local, remote",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","internalTrafficPolicy":"Local","externalTrafficPolicy":"Local",`+ports), slice("a", "IPv4", remote)},
			true, "external/IPv4=2 internal/IPv4=2"},
		{"local endpoint serving and terminating is local",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports),
				slice("a", "IPv4", remote+`,{"addresses":["10.0.1.1"],"nodeName":"node-a","conditions":{"ready":false,"serving":true,"terminating":true}}`)},
			true, "none"},
		{"local endpoint not serving is not",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports),
				slice("a", "IPv4", remote+`,{"addresses":["10.0.1.1"],"nodeName":"node-a","conditions":{"ready":false}}`)},
			true, "external/IPv4=2"},
		{"only remote not-ready endpoints: none usable",
			[]string{svc("a", `"type":"NodePort","clusterIP":"172.30.0.1","externalTrafficPolicy":"Local",`+ports),
				slice("a", "IPv4", `{"addresses":["10.0.2.1"],"nodeName":"node-b","conditions":{"ready":false}}`)},
			true, "none"},
		{"ClusterIP Service: eTP does not apply",
			[]string{svc("a", `"clusterIP":"172.30.0.1","externalTrafficPolicy":"Local","ports":[{"name":"http","port":80}]`), slice("a", "IPv4", remote)},
			true, "none"},
		{"externalIP makes eTP apply",
			[]string{svc("a", `"clusterIP":"172.30.0.1","externalTrafficPolicy":"Local","externalIPs":["192.0.2.9"],"ports":[{"name":"http","port":80}]`), slice("a", "IPv4", remote)},
			true, "external/IPv4=1"},
		{"dual-stack: per family",
			[]string{svc("a", `"type":"NodePort","clusterIPs":["172.30.0.1","fd00:30::1"],"externalTrafficPolicy":"Local",`+ports),
				slice("a", "IPv4", remote), slice("a", "IPv6", `{"addresses":["fd00:10:1::1"],"nodeName":"node-a"}`)},
			true, "external/IPv4=2"},
		{"headless and other proxies' Services are not programmed",
			[]string{svc("a", `"type":"NodePort","clusterIP":"None","externalTrafficPolicy":"Local",`+ports), slice("a", "IPv4", remote),
				`{"apiVersion":"v1","kind":"Service","metadata":{"name":"b","namespace":"ns","labels":{"service.kubernetes.io/service-proxy-name":"other"}},"spec":{"type":"NodePort","clusterIP":"172.30.0.2","externalTrafficPolicy":"Local",` + ports + `}}`,
				slice("b", "IPv4", remote)},
			true, "none"},
		{"slice of another Service, or a port of another name, does not count",
			[]string{svc("a", `"clusterIP":"172.30.0.1","internalTrafficPolicy":"Local","ports":[{"name":"web","port":80}]`), slice("a", "IPv4", remote), slice("b", "IPv4", local)},
			true, "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := newObjectSet()
			var raws []json.RawMessage
			for _, s := range c.objs {
				raws = append(raws, json.RawMessage(s))
			}
			if err := o.apply(raws); err != nil {
				t.Fatal(err)
			}
			exp := expectAgent(o, sc)
			if exp.eligible != c.eligible || exp.noLocal.String() != c.noLocal {
				t.Errorf("eligible %v (%s), no local %q; want %v, %q", exp.eligible, exp.why, exp.noLocal, c.eligible, c.noLocal)
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	m := parseMetrics([]byte(`# HELP kubeproxy_sync_proxy_rules_no_local_endpoints_total Number of services
# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 2
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7645e+09
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
go_goroutines 12
`))
	if v := m.max("kubeproxy_sync_proxy_rules_duration_seconds_count"); v != 3 {
		t.Errorf("duration count %v", v)
	}
	if v := m.max("kubeproxy_sync_proxy_rules_last_timestamp_seconds"); v != 1.7645e9 {
		t.Errorf("last timestamp %v", v)
	}
	if v := m.max("absent_metric"); v != -1 {
		t.Errorf("absent metric %v", v)
	}
	s := m.series("kubeproxy_sync_proxy_rules_no_local_endpoints_total")
	if len(s) != 2 || s[0].labels["traffic_policy"] != "external" || s[0].labels["ip_family"] != "IPv4" || s[0].value != 2 {
		t.Errorf("series %+v", s)
	}
	if v := m.max("go_goroutines"); v != 12 {
		t.Errorf("unlabelled series %v", v)
	}
}

func TestJudgeHealthz(t *testing.T) {
	for _, c := range []struct {
		code     int
		body     string
		eligible bool
		pass     bool
	}{
		{http.StatusOK, `{"lastUpdated":"x","nodeEligible":true,"healthy":true}`, true, true},
		{http.StatusServiceUnavailable, `{"lastUpdated":"x","nodeEligible":false,"healthy":false}`, false, true},
		{http.StatusOK, `{"lastUpdated":"x","nodeEligible":true}`, false, false},
		{http.StatusServiceUnavailable, `{"lastUpdated":"x","nodeEligible":true}`, true, false},
		{http.StatusOK, `{"nodeEligible":true}`, true, false},
		{http.StatusOK, `{"lastUpdated":"x"}`, true, false},
		{http.StatusOK, `ok`, true, false},
	} {
		obs, pass := judgeHealthz(c.code, []byte(c.body), nil, c.eligible)
		if pass != c.pass {
			t.Errorf("%d %s eligible=%v: %s pass=%v, want %v", c.code, c.body, c.eligible, obs, pass, c.pass)
		}
	}
}
