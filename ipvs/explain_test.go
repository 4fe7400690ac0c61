package ipvs

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/xvs-lb/xvs/model"
)

// explainStateOf is what a node synced to st holds for the virtual server
// k, as explain reads it: the server and its real servers as buildDesired
// makes them, the sets of renderRules' own script (read back from its
// text, so that the explainer is tested against the rules as written),
// and the given IPVS connections.
func explainStateOf(t *testing.T, st *model.State, k vsKey, conns ...Conn) *explainState {
	t.Helper()
	d := buildDesired(st, "", nil)
	script := renderRules(st, d, Config{})
	es := &explainState{sets: map[string][][]string{}, conns: conns}
	table := script[strings.Index(script, "table ip xvs-ipvs {"):]
	table = table[:strings.Index(table, "\n}\n")]
	sets := regexp.MustCompile(`set (\w+) \{\n\t\ttype [^\n]+\n(?:\t\tflags [^\n]+\n)?(?:\t\telements = \{ ([^}]*) \}\n)?\t\}`)
	for _, m := range sets.FindAllStringSubmatch(table, -1) {
		es.sets[m[1]] = [][]string{}
		if m[2] == "" {
			continue
		}
		for e := range strings.SplitSeq(m[2], ", ") {
			es.sets[m[1]] = append(es.sets[m[1]], strings.Split(e, " . "))
		}
	}
	// + loop_back and no_endpoints, which explain does not read (it
	// reads the kernel's real servers, which IPVS decides by).
	if len(es.sets) != len(explainSets)+2 {
		t.Fatalf("renderRules wrote %d sets, explain knows %v:\n%s", len(es.sets), explainSets, table)
	}
	for line := range strings.SplitSeq(table[strings.Index(table, "chain mark_prerouting"):], "\n") {
		if strings.Contains(line, "@cluster_ips") && !strings.Contains(line, "@pod_cidrs") {
			es.masqAllClusterIPs = true
		}
	}
	if vs, ok := d.Servers[k]; ok {
		es.found = true
		es.server = kService{Key: k, Scheduler: vs.Scheduler, Flags: vs.Flags, Timeout: vs.Timeout}
		for r, w := range vs.Reals {
			es.reals = append(es.reals, kReal{Key: r, Weight: w})
		}
	}
	return es
}

// TestExplainIPVS walks packets through the rules renderRules writes and
// the virtual servers buildDesired makes: each verdict, the candidates of
// the scheduler, persistence, and who masquerades.
func TestExplainIPVS(t *testing.T) {
	client := netip.MustParseAddrPort("192.0.2.50:40000")
	pod := netip.MustParseAddrPort("10.244.7.9:40000")
	ap := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	two := func() *model.State { return state(webPort(ep(ep1, true), ep(ep2, false))) }
	ranged := func() *model.State {
		sp := webPort(ep(ep1, true))
		sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
		return state(sp)
	}
	type want struct {
		action, verdict, masq string
		backend               netip.AddrPort
		candidates            []netip.AddrPort
	}
	for _, c := range []struct {
		name  string
		st    *model.State
		p     model.ExplainPacket
		src   netip.Addr // the host's source (FromHost)
		conns []Conn
		edit  func(*explainState)
		want  want
	}{
		{name: "one endpoint, from outside the pods: masqueraded", st: state(webPort(ep(ep1, true))),
			p:    model.ExplainPacket{From: client, To: ap(vip, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", ap(ep1, 8080), []netip.AddrPort{ap(ep1, 8080)}}},
		{name: "two endpoints, from a pod", st: two(),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "", netip.AddrPort{}, []netip.AddrPort{ap(ep1, 8080), ap(ep2, 8080)}}},
		{name: "a real server of weight 0 is no candidate", st: two(),
			p: model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP},
			edit: func(es *explainState) {
				es.reals[slices.IndexFunc(es.reals, func(r kReal) bool { return r.Key.Addr == ep1 })].Weight = 0
			},
			want: want{"translate", "forward_new", "", ap(ep2, 8080), []netip.AddrPort{ap(ep2, 8080)}}},
		{name: "hairpin: the pod is its own backend", st: state(webPort(ep(ep1, true))),
			p:    model.ExplainPacket{From: ap(ep1, 40000), To: ap(vip, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", ap(ep1, 8080), []netip.AddrPort{ap(ep1, 8080)}}},
		{name: "masqueradeAll", st: func() *model.State { s := two(); s.MasqueradeAll = true; return s }(),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", netip.AddrPort{}, []netip.AddrPort{ap(ep1, 8080), ap(ep2, 8080)}}},
		{name: "NodePort: external, eTP=Cluster", st: two(),
			p:    model.ExplainPacket{From: client, To: ap(nodeIP, 30080), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", netip.AddrPort{}, []netip.AddrPort{ap(ep1, 8080), ap(ep2, 8080)}}},
		{name: "a VIP's port no Service has", st: two(),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 81), Proto: model.TCP},
			want: want{action: "reject", verdict: "reject_wrong_port"}},
		{name: "UDP to a TCP port", st: two(),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.UDP},
			want: want{action: "reject", verdict: "reject_wrong_port"}},
		{name: "an address no Service has", st: two(),
			p:    model.ExplainPacket{From: pod, To: netip.MustParseAddrPort("198.51.100.250:80"), Proto: model.TCP},
			want: want{action: "pass", verdict: "pass"}},
		{name: "no endpoints", st: state(webPort()),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP},
			want: want{action: "reject", verdict: "reject_no_endpoints"}},
		{name: "outside the source ranges", st: ranged(),
			p:    model.ExplainPacket{From: netip.MustParseAddrPort("198.51.100.20:40000"), To: ap(lbIP, 80), Proto: model.TCP},
			want: want{action: "drop", verdict: "drop_source_range"}},
		{name: "inside the source ranges", st: ranged(),
			p:    model.ExplainPacket{From: client, To: ap(lbIP, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", ap(ep1, 8080), []netip.AddrPort{ap(ep1, 8080)}}},
		{name: "the node to its own LB IP, source the LB IP", st: ranged(), src: lbIP,
			p:    model.ExplainPacket{FromHost: true, To: ap(lbIP, 80), Proto: model.TCP},
			want: want{"translate", "forward_new", "netfilter", ap(ep1, 8080), []netip.AddrPort{ap(ep1, 8080)}}},
		{name: "an open connection", st: two(),
			p:     model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP, Established: true},
			conns: []Conn{{Protocol: model.TCP, Client: pod, Virtual: ap(vip, 80), Dest: ap(ep2, 8080), State: "ESTABLISHED"}},
			want:  want{action: "translate", verdict: "forward_established", backend: ap(ep2, 8080)}},
		{name: "a segment of no connection", st: two(),
			p:    model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP, Established: true},
			want: want{action: "pass", verdict: "pass_no_ipvs_connection"}},
		{name: "a persistence template", st: func() *model.State {
			s := two()
			s.Services[webName].Affinity = model.Affinity{ClientIP: true, TimeoutSeconds: 60}
			return s
		}(),
			p:     model.ExplainPacket{From: pod, To: ap(vip, 80), Proto: model.TCP},
			conns: []Conn{{Protocol: model.TCP, Client: ap(pod.Addr(), 0), Virtual: ap(vip, 80), Dest: ap(ep2, 8080), State: "NONE"}},
			want:  want{action: "translate", verdict: "forward_persistent", backend: ap(ep2, 8080)}},
	} {
		k := vsKey{Addr: c.p.To.Addr(), Proto: c.p.Proto, Port: c.p.To.Port()}
		es := explainStateOf(t, c.st, k, c.conns...)
		if c.edit != nil {
			c.edit(es)
		}
		src := c.p.From.Addr()
		if c.p.FromHost {
			src = c.src
		}
		x := es.explain(c.p, src)
		got := want{x.Action, x.Verdict, x.Masquerade, x.Backend, x.Candidates}
		if got.action != c.want.action || got.verdict != c.want.verdict || got.masq != c.want.masq || got.backend != c.want.backend ||
			!slices.Equal(got.candidates, c.want.candidates) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if x.Why == "" {
			t.Errorf("%s: verdict %s has no reason", c.name, x.Verdict)
		}
	}
}
