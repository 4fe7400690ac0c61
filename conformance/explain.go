package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// The explain check: before each probe, `xvs explain`'s answer (ebpf:
// maps.Explain, the datapath's own program over copies of the agent's
// maps; ipvs: ipvs.Explain, the kernel's IPVS state and xvs's rules) is
// taken, and once the probe has passed (its outcome is then the
// expectation) the answer must say the same: a translation to one of the
// expected members, or the REJECT, DROP or PASS observed. Host probes are
// explained as a socket of the node (xvs explain --from-host); other
// probes with a fixed source port would need that port's conntrack state,
// which the tries themselves change (a host socket has no conntrack
// entry).

// explainFunc is xvs explain for one packet.
type explainFunc func(model.ExplainPacket) (*model.Explanation, error)

// explainer is the run's explain: in ebpf mode the run's maps.Explainer,
// its copies refreshed from the scenario's agent at every probe step (the
// program is loaded once a run: verifying it costs seconds, in the VMs
// tens of them); in ipvs mode `xvs explain` itself, run in the node's
// network namespace, where the kernel's IPVS state and xvs's rules are.
// nil when the check does not apply.
func (r *scenarioRun) explainer() (explainFunc, string) {
	switch r.opts.Mode {
	case ModeIPVS:
		return r.explainIPVS, ""
	case ModeEBPF:
	default:
		return nil, ""
	}
	o := r.opts
	if o.explain != nil {
		err := o.explain.Refresh(r.w.pinPath)
		if err == nil {
			return o.explain.Explain, ""
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
	return x.Explain, ""
}

func (r *scenarioRun) explainIPVS(p model.ExplainPacket) (*model.Explanation, error) {
	args := []string{"explain", "--proxy-mode", ModeIPVS, "-o", "json", "--to", p.To.String() + "/" + strings.ToLower(p.Proto.String())}
	if p.FromHost {
		args = append(args, "--from-host")
	}
	if p.From.IsValid() { // a host socket's: the address it is bound to
		args = append(args, "--from", p.From.String())
	}
	out, err := lab.Run(r.w.node.NS, r.opts.Bin, args...)
	if err != nil {
		return nil, fmt.Errorf("xvs %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	var x model.Explanation
	if err := json.Unmarshal(out, &x); err != nil {
		return nil, fmt.Errorf("xvs explain -o json: %w", err)
	}
	return &x, nil
}

// explainFor explains a probe's first packet, or returns nil when the
// check does not apply.
func explainFor(x explainFunc, xerr string, p *Probe, c client) (*model.Explanation, string) {
	host := c.role == RoleHost
	if (x == nil && xerr == "") || (p.SourcePort != 0 && !host) || (p.proto != "TCP" && p.proto != "UDP") {
		return nil, ""
	}
	if x == nil {
		return nil, xerr // the explainer could not be made
	}
	proto, _ := model.ParseProtocol(p.proto)
	pkt := model.ExplainPacket{From: netip.AddrPortFrom(c.src, 40999), To: p.to, Proto: proto}
	if host {
		// The probe's socket is bound to its source address.
		pkt = model.ExplainPacket{FromHost: true, From: netip.AddrPortFrom(c.src, 0), To: p.to, Proto: proto}
	}
	e, err := x(pkt)
	if err != nil {
		return nil, "ERROR: " + err.Error()
	}
	return e, ""
}

// judgeExplain compares an explanation with the expectation a probe met.
// A REJECT is also right when the datapath translates to a closed
// endpoint port (version 4), whose kernel is the one that refuses.
//
// An IPVS answer to a new connection may name every real server the
// kernel's scheduler may pick (Candidates) instead of one: each must then
// be right (an expected member; for a REJECT, a closed port).
func judgeExplain(x *model.Explanation, exp Expect, closed map[netip.AddrPort]bool) (string, bool) {
	got := fmt.Sprintf("%s (%s)", x.Action, x.Verdict)
	backends := []netip.AddrPort{x.Backend}
	if x.Action == "translate" {
		got = fmt.Sprintf("translate to %s (%s)", x.Backend, x.Verdict)
		if !x.Backend.IsValid() {
			backends = x.Candidates
			got = fmt.Sprintf("translate to one of %v (%s)", x.Candidates, x.Verdict)
		}
	}
	all := func(ok func(netip.AddrPort) bool) bool {
		return x.Action == "translate" && len(backends) > 0 && !slices.ContainsFunc(backends, func(b netip.AddrPort) bool { return !ok(b) })
	}
	switch exp.Verdict {
	case Reject:
		return got, x.Action == "reject" || all(func(b netip.AddrPort) bool { return closed[b] })
	case Drop:
		return got, x.Action == "drop"
	case Pass:
		return got, x.Action == "pass"
	}
	return got, all(func(b netip.AddrPort) bool { return slices.Contains(exp.Members, b) })
}

// reportExplain records the explain check of a probe, as a result of its
// own (ProbeResult.Explain).
func (r *scenarioRun) reportExplain(step int, name, expected, got string, pass bool) {
	r.report(step, "explain "+name, expected, got, "", pass)
	r.res.Probes[len(r.res.Probes)-1].Explain = true
}
