package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/xvs-lb/xvs/lab"
)

// try is the outcome of one connection (TCP) or one datagram exchange
// (UDP) from a fresh socket.
type try struct {
	verdict lab.Verdict
	reply   lab.Reply
	err     error
	note    string // what a version 2 try moved ("20MiB down in 1.2s")
}

// outcome names a try the way expectations do: a member ip:port, PASS
// (reached its original destination), REJECT, DROP, or ERROR.
func (t try) outcome(to netip.AddrPort) string {
	switch t.verdict {
	case lab.OK:
		if t.reply.Local == to {
			return Pass
		}
		return t.reply.Local.String()
	case lab.Refused:
		return Reject
	case lab.Timeout:
		return Drop
	}
	return "ERROR"
}

func (w *world) dial(c client, p *Probe) try {
	if t, ok := w.v2Try(c, p); ok {
		return t
	}
	to, timeout := p.to, p.timeout()
	switch proto := p.proto; proto {
	case "TCP":
		r := lab.ProbeTCP(c.ns, c.src, to, timeout)
		return try{verdict: r.Verdict, reply: r.Reply, err: r.Err}
	case "UDP":
		r := lab.ProbeUDP(c.ns, c.src, to, timeout)
		return try{verdict: r.Verdict, reply: r.Reply, err: r.Err}
	case "SCTP":
		return probeSCTP(c.ns, c.src, to, timeout)
	}
	return try{verdict: lab.Failed, err: fmt.Errorf("%s probes are not supported by this runner", p.proto)}
}

// ProbeResult is one evaluated probe (or hold or check).
type ProbeResult struct {
	Step     int    `json:"step"` // 0 for top-level probes, else 1-based step index
	Probe    string `json:"probe"`
	Expected string `json:"expected"`
	Observed string `json:"observed"`
	Pass     bool   `json:"pass"`
	Override string `json:"override,omitempty"` // the why of an applied override
	Agent    bool   `json:"agent,omitempty"`    // a check of the agent's own endpoints (agentcheck.go), not a scenario probe
	Explain  bool   `json:"explain,omitempty"`  // xvs explain's answer for the probe before it ran (explain.go)
	Monitor  bool   `json:"monitor,omitempty"`  // xvs monitor's event for a probe explain said is dropped or refused (monitor.go)
}

// runProbe makes the probe's tries and judges them against exp.
//
// A list expects every try on a member and, over the tries, every member
// reached, or, with ClientIP affinity, every try on the same member. DROP
// tries run in parallel (each waits the full timeout) unless they share a
// fixed source port; the others run one after the other (affinity depends
// on order) and stop at the first try that already fails the probe, so a
// broken datapath costs one timeout per probe, not sixteen.
func (w *world) runProbe(p *Probe, exp Expect, affinity bool) (observed string, pass bool) {
	c, err := w.clientFor(p.From)
	if err != nil {
		return "ERROR: " + err.Error(), false
	}
	if why, ok := w.unsupported[listenKey{p.to, p.proto}]; ok {
		return "ERROR: " + why, false
	}
	n := p.tries()
	var tries []try
	if exp.Verdict == Drop && p.SourcePort == 0 {
		tries = make([]try, n)
		var wg sync.WaitGroup
		for i := range tries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tries[i] = w.dial(c, p)
			}()
		}
		wg.Wait()
	} else {
		for range n {
			t := w.dial(c, p)
			tries = append(tries, t)
			if w.failsProbe(p, exp, affinity, c, tries) {
				break
			}
		}
	}
	return w.judge(p, exp, affinity, c, tries, n)
}

// failsProbe reports whether the latest try already fails the probe.
func (w *world) failsProbe(p *Probe, exp Expect, affinity bool, c client, tries []try) bool {
	t := tries[len(tries)-1]
	o := t.outcome(p.to)
	switch {
	case exp.Verdict != "" && exp.Verdict != Pass:
		return o != exp.Verdict
	case exp.Verdict == Pass:
		if o != Pass {
			return true
		}
	default:
		if !slices.Contains(exp.Members, t.reply.Local) || t.verdict != lab.OK {
			return true
		}
		if affinity && t.reply.Local != tries[0].reply.Local {
			return true
		}
	}
	if p.Masquerade != nil {
		if ok, _ := w.masqOK(*p.Masquerade, c, t.reply.Peer.Addr()); !ok {
			return true
		}
	}
	return false
}

// masqOK checks the peer a backend saw: a node address when masquerade is
// expected, the client's own address when not.
func (w *world) masqOK(want bool, c client, peer netip.Addr) (bool, string) {
	isNode := slices.Contains(w.sc.nodeAddrs, peer)
	who := "other"
	switch {
	case peer == c.src:
		who = "client"
	case isNode:
		who = "node"
	}
	if want {
		return isNode, who
	}
	return peer == c.src, who
}

// judge summarises all tries: "10.0.0.1:80×9 10.0.0.2:80×7 peer=client".
func (w *world) judge(p *Probe, exp Expect, affinity bool, c client, tries []try, planned int) (string, bool) {
	counts := map[string]int{}
	var order []string
	peers := map[string]int{}
	var peerOrder []string
	var firstErr error
	var note string
	pass := true
	for _, t := range tries {
		if note == "" {
			note = t.note
		}
		o := t.outcome(p.to)
		if counts[o] == 0 {
			order = append(order, o)
		}
		counts[o]++
		if t.verdict == lab.OK && p.Masquerade != nil {
			ok, who := w.masqOK(*p.Masquerade, c, t.reply.Peer.Addr())
			key := who + "(" + t.reply.Peer.Addr().String() + ")"
			if peers[key] == 0 {
				peerOrder = append(peerOrder, key)
			}
			peers[key]++
			pass = pass && ok
		}
		if t.verdict == lab.Failed && firstErr == nil {
			firstErr = t.err
		}
	}
	switch {
	case exp.Verdict != "":
		pass = pass && len(order) == 1 && order[0] == exp.Verdict
	default:
		for _, o := range order {
			ap, err := netip.ParseAddrPort(o)
			pass = pass && err == nil && slices.Contains(exp.Members, ap)
		}
		if affinity {
			pass = pass && len(order) == 1
		} else {
			pass = pass && len(order) == len(exp.Members)
		}
	}
	pass = pass && len(tries) == planned

	var b strings.Builder
	for i, o := range order {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s×%d", o, counts[o])
	}
	if len(peerOrder) > 0 {
		b.WriteString(" peer=")
		b.WriteString(strings.Join(peerOrder, ","))
	}
	if len(tries) < planned {
		fmt.Fprintf(&b, " (stopped after %d of %d tries)", len(tries), planned)
	}
	if affinity {
		b.WriteString(" [ClientIP affinity]")
	}
	if note != "" {
		fmt.Fprintf(&b, " (%s)", note)
	}
	if firstErr != nil {
		fmt.Fprintf(&b, " (%v)", firstErr)
	}
	return b.String(), pass
}

// expectedString renders an expectation with its masquerade requirement.
func expectedString(p *Probe, exp Expect, affinity bool) string {
	s := exp.String()
	if p.Masquerade != nil && (exp.Verdict == "" || exp.Verdict == Pass) {
		s += fmt.Sprintf(" masquerade=%v", *p.Masquerade)
	}
	if affinity && exp.Verdict == "" {
		s += " (all on one member: ClientIP affinity)"
	}
	if exp.Verdict == "" || exp.Verdict == Pass {
		s += p.trafficString()
	}
	return s
}
