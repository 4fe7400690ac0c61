package conformance

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

const v2Scenario = `
version: 2
name: bulk
node: {name: n1, addresses: [192.168.0.2/24]}
cluster: {podCIDRs: [10.0.0.0/8], serviceCIDRs: [172.30.0.0/16]}
objects:
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: e, namespace: ns}, addressType: IPv4, endpoints: []}
steps:
- probes:
  - {name: down, from: 10.0.0.2, to: 172.30.0.1:80, expect: [10.0.1.1:8080], tries: 1, transfer: {download: 20MiB, upload: 64Ki, stall: 2s}}
  - {name: half, from: 203.0.113.2, to: 192.168.0.2:30080, expect: [10.0.1.1:8080], tries: 1, stream: {halfClose: client, duration: 20s, interval: 500ms, chunk: 2KiB}}
  - {name: big, from: 10.0.0.2, to: 172.30.0.1:53, protocol: UDP, expect: [10.0.1.1:8053], datagram: 20000, sourcePort: 40000}
- hold: {name: h, from: 10.0.0.2, to: 172.30.0.1:80, bulk: {rate: 2MiB}, sourcePort: 40001}
- session: {name: u, from: 10.0.0.2, to: 172.30.0.1:53, sourcePort: 40002, datagram: 2000, interval: 50ms, expect: [10.0.1.1:8053]}
- apply:
  - {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: e, namespace: ns}, addressType: IPv4, endpoints: []}
- await: {session: u, expect: [10.0.2.1:8053], within: 2s}
- check: {held: h, alive: true}
`

func TestParseV2(t *testing.T) {
	s, err := Parse([]byte(v2Scenario))
	if err != nil {
		t.Fatal(err)
	}
	ps := s.Steps[0].Probes
	if tr := ps[0].Transfer; tr.Download != 20<<20 || tr.Upload != 64<<10 || time.Duration(tr.Stall) != 2*time.Second {
		t.Errorf("transfer %+v", tr)
	}
	spec := ps[0].transferSpec()
	if spec.Download != 20<<20 || spec.Upload != 64<<10 || spec.HalfClose != lab.NoHalfClose || spec.Connect != DefaultTimeout {
		t.Errorf("lab spec %+v", spec)
	}
	spec = ps[1].transferSpec()
	if spec.HalfClose != lab.HalfCloseClient || spec.Stream != 20*time.Second || spec.Interval != 500*time.Millisecond || spec.ChunkSize != 2048 {
		t.Errorf("stream spec %+v", spec)
	}
	if ps[2].Datagram != 20000 || ps[2].SourcePort != 40000 || ps[2].proto != "UDP" {
		t.Errorf("udp probe %+v", ps[2])
	}
	if got := ps[0].trafficString(); got != ", 20MiB down, 64KiB up, intact" {
		t.Errorf("traffic string %q", got)
	}
	if h := s.Steps[1].Hold; h.Bulk.Rate != 2<<20 || h.SourcePort != 40001 {
		t.Errorf("hold %+v", h)
	}
	if u := s.Steps[2].Session; u.to.String() != "172.30.0.1:53" || u.Datagram != 2000 || time.Duration(u.Interval) != 50*time.Millisecond {
		t.Errorf("session %+v", u)
	}
	if a := s.Steps[4].Await; a.Expect.String() != "[10.0.2.1:8053]" || time.Duration(a.Within) != 2*time.Second {
		t.Errorf("await %+v", a)
	}
	var fl []string
	for _, f := range s.flows() {
		fl = append(fl, f.proto+">"+f.to.String())
	}
	if got := strings.Join(fl, " "); !strings.Contains(got, "UDP>172.30.0.1:53 TCP>172.30.0.1:80 UDP>172.30.0.1:53") {
		t.Errorf("flows must include holds and sessions: %s", got)
	}
}

func TestParseV2Malformed(t *testing.T) {
	checkMalformed(t, v2Scenario, []malformed{
		{"v2 field in a v1 file", "version: 2\n", "", "transfer need version: 2"},
		{"session in a v1 file", "version: 2\n", "version: 1\n", "session need version: 2"},
		{"unknown version", "version: 2", "version: 9", "versions 1, 2, 3 and 4"},
		{"typo in transfer", "download: 20MiB", "downlaod: 20MiB", `unknown field "downlaod"`},
		{"bad size", "download: 20MiB", "download: 20 parsecs", "want e.g. 1500"},
		{"size over 1GiB", "download: 20MiB", "download: 2GiB", "over 1GiB"},
		{"fractional size", "datagram: 20000", "datagram: 20000.5", "whole number"},
		{"empty transfer", "transfer: {download: 20MiB, upload: 64Ki, stall: 2s}", "transfer: {}", "download, upload or both"},
		{"transfer over UDP", "protocol: UDP, expect: [10.0.1.1:8053], datagram: 20000", "protocol: UDP, expect: [10.0.1.1:8053], transfer: {download: 1}", "transfer and stream are TCP"},
		{"datagram over TCP", "tries: 1, transfer: {download: 20MiB, upload: 64Ki, stall: 2s}", "tries: 1, datagram: 100", "datagram is a UDP size"},
		{"datagram too big", "datagram: 20000", "datagram: 70000", "at most 65000"},
		{"bad half-close", "halfClose: client", "halfClose: both", "want client or server"},
		{"no stream duration", "duration: 20s, ", "", "duration 0s"},
		{"interval over duration", "interval: 500ms", "interval: 30s", "interval 30s"},
		{"session without port", "sourcePort: 40002, ", "", "sourcePort is required"},
		{"session without expect", ", expect: [10.0.1.1:8053]}\n- apply", "}\n- apply", "expect: a list"},
		{"await REJECT", "await: {session: u, expect: [10.0.2.1:8053]", "await: {session: u, expect: REJECT", "expect: a list"},
		{"await unknown session", "await: {session: u,", "await: {session: x,", `no earlier session named "x"`},
		{"duplicate session", "- apply:", "- session: {name: u, from: 10.0.0.2, to: 172.30.0.1:53, sourcePort: 40003, expect: [10.0.1.1:8053]}\n- apply:", `name "u" used twice`},
		{"session interval too short", "interval: 50ms", "interval: 1ms", "want 10ms..10s"},
		{"hold rate", "rate: 2MiB", "rate: 200MiB", "at most 100MiB"},
		{"port out of range", "sourcePort: 40000", "sourcePort: 70000", "sourcePort"},
	})
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{
		`1500`: 1500, `"1500"`: 1500, `"2000B"`: 2000, `"64KiB"`: 64 << 10, `"64Ki"`: 64 << 10,
		`"20MiB"`: 20 << 20, `"1Mi"`: 1 << 20, `"1GiB"`: 1 << 30, `"3 MiB"`: 3 << 20,
	} {
		var b ByteSize
		if err := json.Unmarshal([]byte(in), &b); err != nil || b != want {
			t.Errorf("%s: %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{`-1`, `"1.5MiB"`, `"20 MB/s"`, `"2GiB"`, `true`} {
		var b ByteSize
		if err := json.Unmarshal([]byte(in), &b); err == nil {
			t.Errorf("%s: accepted as %d", in, b)
		}
	}
	if s := ByteSize(20 << 20).String(); s != "20MiB" {
		t.Errorf("String %q", s)
	}
}

const v4Scenario = `
version: 4
name: icmp
node: {name: n1, addresses: [192.168.0.2/24, "2001:db8:1::2/64"]}
cluster: {podCIDRs: [10.0.0.0/8], serviceCIDRs: [172.30.0.0/16]}
closed: [10.0.1.1:8053]
objects:
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: e, namespace: ns}, addressType: IPv4, endpoints: [{addresses: [10.0.1.1]}], ports: [{port: 8053, protocol: UDP}]}
probes:
- {name: refused, from: 10.0.0.2, to: 172.30.0.1:53, protocol: UDP, expect: REJECT, tries: 3}
- {name: narrow, from: {ip: 203.0.113.62, router: 203.0.113.61, mtu: 1400}, to: 192.168.0.2:30620, expect: [10.0.1.1:8080], tries: 1, transfer: {download: 8MiB}}
- {name: narrow v6, from: {ip: "2001:db8:ff::62", router: "2001:db8:ff::61", mtu: 1280, role: external}, to: "[2001:db8:1::2]:30620", expect: ["[fd00::1]:8080"], tries: 1}
`

func TestParseV4(t *testing.T) {
	s, err := Parse([]byte(v4Scenario))
	if err != nil {
		t.Fatal(err)
	}
	if !s.closed[netip.MustParseAddrPort("10.0.1.1:8053")] || len(s.closed) != 1 {
		t.Errorf("closed %v", s.closed)
	}
	f := s.Probes[1].From
	if f.Router != netip.MustParseAddr("203.0.113.61") || f.MTU != 1400 || f.Role != RoleAuto {
		t.Errorf("from %+v", f)
	}
	if got := f.String(); got != "203.0.113.62 via 203.0.113.61 mtu 1400" {
		t.Errorf("from string %q", got)
	}
	b, err := json.Marshal(f)
	if err != nil || string(b) != `{"ip":"203.0.113.62","mtu":1400,"router":"203.0.113.61"}` {
		t.Errorf("from json %s, %v", b, err)
	}
}

func TestParseV4Malformed(t *testing.T) {
	checkMalformed(t, v4Scenario, []malformed{
		{"closed in a v3 file", "version: 4\n", "version: 3\n", "closed: needs version: 4"},
		{"router in a v3 file", "version: 4\n", "version: 3\n", "from.router, from.mtu need version: 4"},
		{"closed port of no endpoint", "closed: [10.0.1.1:8053]", "closed: [10.0.1.1:8080]", "no endpoint address and port"},
		{"closed not an address", "closed: [10.0.1.1:8053]", "closed: [pod-a:8053]", "closed[0]"},
		{"mtu without router", "router: 203.0.113.61, mtu: 1400}", "mtu: 1400, role: external}", "mtu needs a router"},
		{"router of another family", "router: 203.0.113.61", "router: \"2001:db8::1\"", "same family"},
		{"router is the client", "router: 203.0.113.61", "router: 203.0.113.62", "same family"},
		{"mtu too small", "mtu: 1400", "mtu: 500", "out of range (576..9000)"},
		{"IPv6 mtu too small", "mtu: 1280", "mtu: 1400, role: pod}, to: \"[2001:db8:1::2]:30620\", expect: [\"[fd00::1]:8080\"], tries: 1}\n#", "only an external client"},
		{"two MTUs on one router", "{ip: 203.0.113.62, router: 203.0.113.61, mtu: 1400}", "{ip: 203.0.113.62, router: 203.0.113.61, mtu: 1400}, to: 192.168.0.2:30620, expect: [10.0.1.1:8080], tries: 1}\n- {name: other, from: {ip: 203.0.113.63, router: 203.0.113.61, mtu: 1300}", "one link per router"},
		{"object without role or router", "{ip: 203.0.113.62, router: 203.0.113.61, mtu: 1400}", "{ip: 203.0.113.62}", "role is required without router"},
	})
}
