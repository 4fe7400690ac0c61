package conformance

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

const validScenario = `
name: svc-basic
description: "SEMANTICS 3.2, 3.13: ClusterIP spreads; external clients are masqueraded"
node: {name: n1, addresses: [192.168.0.2/24, "2001:db8::2"]}
cluster: {podCIDRs: [10.0.0.0/8], serviceCIDRs: [172.30.0.0/16]}
proxy: {nodePortAddresses: [primary], masqueradeAll: false, clusterCIDR: ""}
modes: [bpf, ipvs]
objects:
- apiVersion: v1
  kind: Service
  metadata: {name: s, namespace: ns}
  spec: {clusterIP: 172.30.0.1, ports: [{port: 80}]}
probes:
- name: p1
  from: 10.0.0.2
  to: 172.30.0.1:80
  expect: [10.0.0.5:80, 10.0.0.4:80, 10.0.0.4:80]
  masquerade: false
- name: p2
  from: {ip: 203.0.113.1, role: external}
  to: 172.30.0.1:81
  protocol: udp
  expect: REJECT
  tries: 3
  timeout: 500ms
- name: p3
  from: 10.0.0.2
  to: 172.30.0.1:82
  protocol: sctp
  expect: REJECT
- name: p4
  from: 10.0.0.2
  to: 172.30.0.1:82
  protocol: sctp
  expect: REJECT
  timeout: 2s
overrides:
  ebpf:
  - {probe: p2, expect: DROP, why: because}
`

func TestParseValid(t *testing.T) {
	s, err := Parse([]byte(validScenario))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Sections, ","); got != "3.2,3.13" {
		t.Errorf("sections %q", got)
	}
	p := &s.Probes[0]
	if p.Expect.String() != "[10.0.0.4:80 10.0.0.5:80]" {
		t.Errorf("members not sorted and unique: %s", p.Expect)
	}
	if p.proto != "TCP" || p.tries() != DefaultTries || p.timeout() != DefaultTimeout {
		t.Errorf("defaults: %s %d %v", p.proto, p.tries(), p.timeout())
	}
	q := &s.Probes[1]
	if q.proto != "UDP" || q.tries() != 3 || q.timeout().String() != "500ms" || q.From.Role != RoleExternal {
		t.Errorf("probe 2: %+v", q)
	}
	if r := &s.Probes[2]; r.proto != "SCTP" || r.timeout() != DefaultSCTPTimeout {
		t.Errorf("SCTP default timeout: %s %v", r.proto, r.timeout())
	}
	if r := &s.Probes[3]; r.timeout() != 2*time.Second {
		t.Errorf("an SCTP probe's own timeout: %v", r.timeout())
	}
	if e, why := s.ExpectFor("ebpf", q); e.Verdict != Drop || why != "because" {
		t.Errorf("ebpf override: %v %q", e, why)
	}
	if e, why := s.ExpectFor("ipvs", q); e.Verdict != Reject || why != "" {
		t.Errorf("ipvs: %v %q", e, why)
	}
	if !s.RunsIn("ebpf") || !s.RunsIn("ipvs") {
		t.Error("modes [bpf, ipvs] must run in ebpf and ipvs")
	}
	if len(s.nodeAddrs) != 2 || s.nodeAddrs[1] != netip.MustParseAddr("2001:db8::2") {
		t.Errorf("node addresses %v", s.nodeAddrs)
	}
}

// Every way a file can break the format is reported with a reason that
// names the field.
// malformed is a valid document with old replaced by new, which Parse
// must refuse with an error containing want.
type malformed struct {
	name, old, new, want string
}

// checkMalformed parses each case's document from base.
func checkMalformed(t *testing.T, base string, cases []malformed) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.Replace(base, c.old, c.new, 1)
			if doc == base {
				t.Fatalf("test case does not change the document (%q not found)", c.old)
			}
			_, err := Parse([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	checkMalformed(t, validScenario, []malformed{
		{"unknown top-level field", "modes:", "section: 3.2\nmodes:", `unknown field "section"`},
		{"unknown probe field", "  masquerade: false", "  masq: false", `unknown field "masq"`},
		{"typo in expect", "  expect: REJECT", "  expcet: REJECT", `unknown field "expcet"`},
		{"duplicate key", "  tries: 3", "  tries: 3\n  tries: 4", `already set`},
		{"bad name", "name: svc-basic", "name: Svc_Basic", "kebab-case"},
		{"no node name", "name: n1,", "", "node.name: required"},
		{"bad expect", "expect: REJECT", "expect: MAYBE", "expect"},
		{"empty expect list", "expect: [10.0.0.5:80, 10.0.0.4:80, 10.0.0.4:80]", "expect: []", "empty list"},
		{"bad to", "to: 172.30.0.1:81", "to: 172.30.0.1", "to \"172.30.0.1\""},
		{"family mismatch", "to: 172.30.0.1:81", "to: \"[2001:db8::1]:81\"", "different families"},
		{"bad protocol", "protocol: udp", "protocol: icmp", "protocol"},
		{"bad role", "role: external", "role: router", "from.role"},
		{"unknown mode", "modes: [bpf, ipvs]", "modes: [iptables]", "unknown mode"},
		{"override without why", "why: because", "why: ''", "why is required"},
		{"override of unknown probe", "probe: p2,", "probe: p9,", `no probe named "p9"`},
		{"unsupported kind", "kind: Service", "kind: Pod", "only Service, EndpointSlice, Node"},
		{"wrong apiVersion", "- apiVersion: v1\n  kind: Service", "- apiVersion: apps/v1\n  kind: Service", "apiVersion"},
		{"bad CIDR", "podCIDRs: [10.0.0.0/8]", "podCIDRs: [10.0.0.0/33]", "cluster.podCIDRs"},
		{"not YAML", "node:", "node: [", "YAML"},
		{"ServiceCIDR before version 3", "objects:\n",
			"objects:\n- {apiVersion: networking.k8s.io/v1, kind: ServiceCIDR, metadata: {name: c}, spec: {cidrs: [10.96.0.0/16]}}\n",
			"objects[0]: kind ServiceCIDR needs version: 3"},
		{"version 5", "name: svc-basic", "version: 5\nname: svc-basic", "reads versions 1, 2, 3 and 4"},
	})
}

func TestParseSteps(t *testing.T) {
	head := `name: s
node: {name: n, addresses: [192.168.0.2]}
objects:
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: e, namespace: ns}, addressType: IPv4, endpoints: []}
steps:
`
	ok := head + `- hold: {name: h1, from: 10.0.0.2, to: 172.30.0.1:80}
- delete: [{kind: EndpointSlice, namespace: ns, name: e}]
- sleep: 1s
- check: {held: h1, alive: true}
- apply:
  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: e, namespace: ns}, addressType: IPv4, endpoints: []}
- probes: [{name: p, from: 10.0.0.2, to: 172.30.0.1:80, expect: DROP}]
`
	if _, err := Parse([]byte(ok)); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ steps, want string }{
		"two actions in one step": {"- sleep: 1s\n  probes: []\n", "exactly one"},
		"check before hold":       {"- check: {held: h1, alive: true}\n", `no earlier hold named "h1"`},
		"check without alive":     {"- hold: {name: h1, from: 10.0.0.2, to: 172.30.0.1:80}\n- check: {held: h1}\n", "alive"},
		"delete of missing object": {"- delete: [{kind: Service, namespace: ns, name: e}]\n- probes: [{name: p, from: 10.0.0.2, to: 1.2.3.4:80, expect: DROP}]\n",
			"no Service ns/e exists"},
		"delete twice": {"- delete: [{kind: EndpointSlice, namespace: ns, name: e}]\n- delete: [{kind: EndpointSlice, namespace: ns, name: e}]\n- probes: [{name: p, from: 10.0.0.2, to: 1.2.3.4:80, expect: DROP}]\n",
			"no EndpointSlice ns/e exists"},
		"no probes":             {"- sleep: 1s\n", "no probes"},
		"bad sleep":             {"- sleep: forever\n", "duration \"forever\""},
		"unknown step field":    {"- wait: 1s\n", `unknown field "wait"`},
		"probes and steps both": {"- sleep: 1s\nprobes: [{name: p, from: 10.0.0.2, to: 1.2.3.4:80, expect: DROP}]\n", "one or the other"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(head + c.steps))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// LoadDir reports broken files and duplicate names and still returns the
// good scenarios.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", validScenario)
	write("b.yaml", validScenario) // same name
	write("c.yml", "name: [")
	write("d.txt", "ignored")
	write(".e.yaml", "ignored")
	scs, bad, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) != 1 || scs[0].File != filepath.Join(dir, "a.yaml") {
		t.Fatalf("scenarios: %v", scs)
	}
	if len(bad) != 2 || !strings.Contains(bad[0].Error(), "b.yaml") || !strings.Contains(bad[0].Error(), "also used by") ||
		!strings.Contains(bad[1].Error(), "c.yml") {
		t.Fatalf("malformed: %v", bad)
	}
}

func TestSectionsOf(t *testing.T) {
	for in, want := range map[string]string{
		"SEMANTICS 3.4: external IPs":              "3.4",
		"SEMANTICS 3.8, 3.13 and 3.10: eTP":        "3.8,3.13,3.10",
		"§3.12: no endpoints; see also §3.2":       "3.12,3.2",
		"version 1.29 of e2e, no section":          "",
		"SEMANTICS 3.7/3.23: affinity scope, §3.7": "3.7,3.23",
	} {
		if got := strings.Join(SectionsOf(in), ","); got != want {
			t.Errorf("SectionsOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// judge is the heart of the runner's truthfulness: exercise it on
// synthetic tries.
func TestJudge(t *testing.T) {
	w := &world{sc: &Scenario{nodeAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2")}}}
	to := netip.MustParseAddrPort("172.30.0.1:80")
	a, b := netip.MustParseAddrPort("10.0.0.4:80"), netip.MustParseAddrPort("10.0.0.5:80")
	cl := client{src: netip.MustParseAddr("10.0.0.2")}
	ok := func(local netip.AddrPort, peer string) try {
		return try{verdict: lab.OK, reply: lab.Reply{Local: local, Peer: netip.AddrPortFrom(netip.MustParseAddr(peer), 1234)}}
	}
	f, tr := false, true
	members := Expect{Members: []netip.AddrPort{a, b}}
	for _, c := range []struct {
		name     string
		exp      Expect
		masq     *bool
		affinity bool
		tries    []try
		planned  int
		want     bool
	}{
		{"all members reached", members, &f, false, []try{ok(a, "10.0.0.2"), ok(b, "10.0.0.2")}, 2, true},
		{"one member never reached", members, nil, false, []try{ok(a, "10.0.0.2"), ok(a, "10.0.0.2")}, 2, false},
		{"landed outside the list", members, nil, false, []try{ok(a, "10.0.0.2"), ok(b, "10.0.0.2"), ok(to, "10.0.0.2")}, 3, false},
		{"masquerade expected, client seen", members, &tr, false, []try{ok(a, "10.0.0.2"), ok(b, "10.0.0.2")}, 2, false},
		{"masquerade expected, node seen", members, &tr, false, []try{ok(a, "192.168.0.2"), ok(b, "192.168.0.2")}, 2, true},
		{"affinity: one member", members, nil, true, []try{ok(b, "10.0.0.2"), ok(b, "10.0.0.2")}, 2, true},
		{"affinity: two members", members, nil, true, []try{ok(a, "10.0.0.2"), ok(b, "10.0.0.2")}, 2, false},
		{"stopped early", members, nil, false, []try{ok(a, "10.0.0.2")}, 16, false},
		{"reject", Expect{Verdict: Reject}, nil, false, []try{{verdict: lab.Refused}, {verdict: lab.Refused}}, 2, true},
		{"reject but one timed out", Expect{Verdict: Reject}, nil, false, []try{{verdict: lab.Refused}, {verdict: lab.Timeout}}, 2, false},
		{"drop", Expect{Verdict: Drop}, nil, false, []try{{verdict: lab.Timeout}}, 1, true},
		{"drop but answered", Expect{Verdict: Drop}, nil, false, []try{{verdict: lab.Timeout}, ok(a, "10.0.0.2")}, 2, false},
		{"pass", Expect{Verdict: Pass}, nil, false, []try{ok(to, "10.0.0.2")}, 1, true},
		{"pass but DNATed", Expect{Verdict: Pass}, nil, false, []try{ok(a, "10.0.0.2")}, 1, false},
		{"error is never a pass", Expect{Verdict: Drop}, nil, false, []try{{verdict: lab.Failed}}, 1, false},
	} {
		p := &Probe{Name: c.name, to: to, Masquerade: c.masq}
		obs, got := w.judge(p, c.exp, c.affinity, cl, c.tries, c.planned)
		if got != c.want {
			t.Errorf("%s: pass=%v (observed %q), want %v", c.name, got, obs, c.want)
		}
	}
}
