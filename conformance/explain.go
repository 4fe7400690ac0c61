package conformance

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// The explain check: in ebpf mode, before each probe from a pod or an
// outside client, `xvs explain`'s answer (maps.Explain: the datapath's own
// program over copies of the agent's maps) is taken, and once the probe
// has passed (its outcome is then the expectation) the answer must say
// the same: a translation to one of the expected members, or the REJECT,
// DROP or PASS observed. Host probes are explained as the socket hooks
// decide (xvs explain --from-host); other probes with a fixed source port
// would need that port's conntrack state, which the tries themselves
// change (a host socket has no conntrack entry).

// explainer is the run's maps.Explainer, its copies refreshed from the
// scenario's agent at every probe step (the program is loaded once a run:
// verifying it costs seconds, in the VMs tens of them). nil when the check
// does not apply.
func (r *scenarioRun) explainer() (*maps.Explainer, string) {
	if r.opts.Mode != string(model.ModeEBPF) {
		return nil, ""
	}
	o := r.opts
	if o.explain != nil {
		err := o.explain.Refresh(r.w.pinPath)
		if err == nil {
			return o.explain, ""
		}
		o.explain.Close()
		o.explain = nil
		if !errors.Is(err, maps.ErrExplainerStale) {
			return nil, "ERROR: " + err.Error()
		}
	}
	x, err := maps.NewExplainer(r.w.pinPath)
	if err != nil {
		return nil, "ERROR: " + err.Error()
	}
	o.explain = x
	return x, ""
}

// explainFor explains a probe's first packet, or returns nil when the
// check does not apply.
func explainFor(x *maps.Explainer, xerr string, p *Probe, c client) (*maps.Explanation, string) {
	host := c.role == RoleHost
	if (x == nil && xerr == "") || (p.SourcePort != 0 && !host) || (p.proto != "TCP" && p.proto != "UDP") {
		return nil, ""
	}
	if x == nil {
		return nil, xerr // the explainer could not be made
	}
	proto, _ := model.ParseProtocol(p.proto)
	pkt := maps.ExplainPacket{From: netip.AddrPortFrom(c.src, 40999), To: p.to, Proto: proto}
	if host {
		pkt = maps.ExplainPacket{FromHost: true, To: p.to, Proto: proto}
	}
	e, err := x.Explain(pkt)
	if err != nil {
		return nil, "ERROR: " + err.Error()
	}
	return e, ""
}

// judgeExplain compares an explanation with the expectation a probe met.
// A REJECT is also right when the datapath translates to a closed
// endpoint port (version 4), whose kernel is the one that refuses.
func judgeExplain(x *maps.Explanation, exp Expect, closed map[netip.AddrPort]bool) (string, bool) {
	got := fmt.Sprintf("%s (%s)", x.Action, x.Verdict)
	if x.Action == "translate" {
		got = fmt.Sprintf("translate to %s (%s)", x.Backend, x.Verdict)
	}
	switch exp.Verdict {
	case Reject:
		return got, x.Action == "reject" || (x.Action == "translate" && closed[x.Backend])
	case Drop:
		return got, x.Action == "drop"
	case Pass:
		return got, x.Action == "pass"
	}
	return got, x.Action == "translate" && slices.Contains(exp.Members, x.Backend)
}

// reportExplain records the explain check of a probe, as a result of its
// own (ProbeResult.Explain).
func (r *scenarioRun) reportExplain(step int, name, expected, got string, pass bool) {
	r.report(step, "explain "+name, expected, got, "", pass)
	r.res.Probes[len(r.res.Probes)-1].Explain = true
}
