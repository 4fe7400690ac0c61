package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// Options configure a run.
type Options struct {
	// explain is the run's explainer (explain.go), made at the first
	// ebpf probe step.
	explain *maps.Explainer

	// Mode is the datapath under test: ModeEBPF or ModeIPVS.
	Mode string
	// Bin is the xvs binary started as the agent in each node namespace.
	Bin string
	// NetfilterMode is ebpf mode's --netfilter-mode (pass or bypass; empty:
	// the agent's default, pass).
	NetfilterMode string
	// ExtraAgentArgs are appended to every agent's flags. For tests that
	// break the datapath on purpose (--debug-disable-rev-nat); a real run
	// leaves it empty.
	ExtraAgentArgs []string
	// Filter, when set, runs only scenarios whose name matches.
	Filter *regexp.Regexp
	// Skip, when set, leaves out scenarios whose name matches (a kernel
	// that cannot realise them, say); they are listed as skipped.
	Skip *regexp.Regexp
	// Out receives one line per probe and the summary (nil: discard).
	Out io.Writer
	// LogDir keeps each scenario's agent log; empty: a temporary
	// directory, removed at the end when every scenario passed.
	LogDir string
	// NoAgentChecks leaves out the checks of the agent's health and
	// metrics endpoints after each scenario (agentcheck.go).
	NoAgentChecks bool
	// SyncTimeout bounds the wait for the agent to apply a version of the
	// objects; the first one includes loading the datapath. Default 30s.
	SyncTimeout time.Duration
}

// Results is a whole run, machine-readable (`-o json`) and the input of
// the report.
type Results struct {
	Mode string `json:"mode"`
	// NetfilterMode is ebpf mode's --netfilter-mode when the run set one.
	NetfilterMode string           `json:"netfilterMode,omitempty"`
	Corpus        string           `json:"corpus"`
	Started       time.Time        `json:"started"`
	Duration      Duration         `json:"duration"`
	Kernel        string           `json:"kernel"`
	Build         string           `json:"build"` // VCS revision of the runner and agent binary ("+dirty": uncommitted changes)
	Scenarios     []ScenarioResult `json:"scenarios"`
	Passed        int              `json:"passed"` // probe lines that passed
	Failed        int              `json:"failed"` // probe lines that failed, malformed and broken scenarios included
}

// ScenarioResult is one scenario file.
type ScenarioResult struct {
	File     string        `json:"file"`
	Name     string        `json:"name"`
	Sections []string      `json:"sections,omitempty"`
	Status   string        `json:"status"` // pass, fail, skip, malformed, error
	Error    string        `json:"error,omitempty"`
	Duration Duration      `json:"duration"`
	Probes   []ProbeResult `json:"probes,omitempty"`
}

// Scenario statuses.
const (
	StatusPass      = "pass"
	StatusFail      = "fail"
	StatusSkip      = "skip"      // modes: excludes this mode
	StatusMalformed = "malformed" // the file does not follow the format
	StatusError     = "error"     // the world or the agent could not be set up
)

// Run runs every scenario of dir, in name order, one after the other, and
// returns the results. The error is for the run itself (unreadable dir,
// bad options); failures are in the results. ctx cancellation stops after
// the current scenario is torn down.
func Run(ctx context.Context, dir string, opts Options) (*Results, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	if err := CleanupStale(); err != nil {
		fmt.Fprintf(opts.Out, "warning: leftovers of a crashed run: %s\n", oneLine(err.Error()))
	}
	scs, bad, err := LoadDir(dir)
	if err != nil {
		return nil, err
	}
	keepLogs := opts.LogDir != ""
	if opts.LogDir == "" {
		if opts.LogDir, err = os.MkdirTemp("", "xvs-conformance-logs-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(opts.LogDir, 0o755); err != nil {
		return nil, err
	}
	res := &Results{Mode: opts.Mode, NetfilterMode: opts.NetfilterMode, Corpus: dir, Started: time.Now().UTC(), Kernel: kernelRelease(), Build: buildRevision()}
	res.addMalformed(bad, &opts)
	for _, sc := range scs {
		if opts.Skip != nil && opts.Skip.MatchString(sc.Name) {
			fmt.Fprintf(opts.Out, "SKIP  %s | (--skip %s)\n", sc.Name, opts.Skip)
			continue
		}
		if !opts.selects(sc.Name) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		sr := runScenario(ctx, sc, &opts)
		sr.Duration = Duration(time.Since(start))
		res.add(sr)
	}
	if opts.explain != nil {
		opts.explain.Close()
	}
	res.Duration = Duration(time.Since(res.Started))
	fmt.Fprintf(opts.Out, "%d passed, %d failed\n", res.Passed, res.Failed)
	if !keepLogs {
		if res.Failed == 0 {
			os.RemoveAll(opts.LogDir)
		} else {
			fmt.Fprintf(opts.Out, "agent logs: %s\n", opts.LogDir)
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("interrupted: %w", err)
	}
	return res, nil
}

// complete checks the options a run needs and fills in the defaults.
func (o *Options) complete() error {
	switch o.Mode = canonicalMode(o.Mode); o.Mode {
	case ModeEBPF, ModeIPVS:
	default:
		return errors.New("mode: want ebpf or ipvs")
	}
	if o.Bin == "" {
		return errors.New("no xvs binary to run as the agent")
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 30 * time.Second
	}
	if os.Geteuid() != 0 {
		return errors.New("the runner needs root (network namespaces, BPF)")
	}
	return nil
}

// addMalformed records each scenario file the run selects that could not
// be read as a failure of its own.
func (res *Results) addMalformed(bad []error, opts *Options) {
	for _, e := range bad {
		var me *MalformedError
		file, reason := "", e.Error()
		if errors.As(e, &me) {
			file, reason = me.File, me.Err.Error()
		}
		name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(file), ".yaml"), ".yml")
		if !opts.selects(name) {
			continue
		}
		sr := ScenarioResult{File: file, Name: name, Status: StatusMalformed, Error: reason}
		fmt.Fprintf(opts.Out, "FAIL  %s | (malformed scenario) | %s | %s\n", name, file, oneLine(reason))
		res.Failed++
		res.Scenarios = append(res.Scenarios, sr)
	}
}

// add counts a scenario's probes (and a scenario that could not run) and
// keeps its result.
func (res *Results) add(sr ScenarioResult) {
	for _, p := range sr.Probes {
		if p.Pass {
			res.Passed++
		} else {
			res.Failed++
		}
	}
	if sr.Status == StatusError {
		res.Failed++
	}
	res.Scenarios = append(res.Scenarios, sr)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// runScenario realises one scenario, runs its probes or steps, and tears
// everything down whatever happened.
func runScenario(ctx context.Context, sc *Scenario, opts *Options) ScenarioResult {
	r := &scenarioRun{sc: sc, opts: opts, res: ScenarioResult{File: sc.File, Name: sc.Name, Sections: sc.Sections}}
	if !sc.RunsIn(opts.Mode) {
		r.res.Status = StatusSkip
		fmt.Fprintf(opts.Out, "SKIP  %s | modes %v exclude %s\n", sc.Name, sc.Modes, opts.Mode)
		return r.res
	}
	w, err := newWorld(sc, opts)
	if w != nil {
		defer func() {
			if err := w.close(opts.Bin); err != nil {
				fmt.Fprintf(opts.Out, "warning: %s: cleanup: %s\n", sc.Name, oneLine(err.Error()))
			}
		}()
	}
	if err == nil {
		err = w.start(ctx, opts)
	}
	if err != nil {
		r.res.Status = StatusError
		r.res.Error = err.Error()
		fmt.Fprintf(opts.Out, "FAIL  %s | (setup) | runnable scenario | %s\n", sc.Name, oneLine(err.Error()))
		return r.res
	}
	r.w = w
	defer r.closeMonitor()
	r.probes(0, sc.Probes)
	completed := true
	for i := range sc.Steps {
		if ctx.Err() != nil || !r.step(ctx, i+1, &sc.Steps[i]) {
			completed = false
			break
		}
	}
	if ended, aerr := w.agent.Exited(); ended {
		r.report(0, "agent", "running throughout", fmt.Sprintf("exited (%v): %s", aerr, oneLine(logTail(w.agent.Log, 3))), "", false)
	} else if completed && !opts.NoAgentChecks {
		// The agent's own endpoints for the objects as they now stand
		// (agentcheck.go).
		r.agentChecks()
	}
	r.res.Status = StatusPass
	for _, p := range r.res.Probes {
		if !p.Pass {
			r.res.Status = StatusFail
		}
	}
	return r.res
}

// scenarioRun is one scenario being run against its world.
type scenarioRun struct {
	sc   *Scenario
	opts *Options
	w    *world
	res  ScenarioResult
	// mon reads the agent's drop and reject events (monitor.go); monErr
	// says why it could not be opened.
	mon    model.MonitorSource
	monErr string
}

// report prints one probe line and records it.
func (r *scenarioRun) report(step int, name, expected, observed, why string, pass bool) {
	verdict := "PASS"
	if !pass {
		verdict = "FAIL"
	}
	label := name
	if step > 0 {
		label = fmt.Sprintf("step %d: %s", step, name)
	}
	if why != "" {
		expected += " (" + r.opts.Mode + " override: " + why + ")"
	}
	fmt.Fprintf(r.opts.Out, "%s  %s | %s | %s | %s\n", verdict, r.sc.Name, label, expected, observed)
	r.res.Probes = append(r.res.Probes, ProbeResult{Step: step, Probe: name, Expected: expected, Observed: observed, Pass: pass, Override: why})
}

func (r *scenarioRun) probes(step int, ps []Probe) {
	ex, exErr := r.explainer()
	if ex != nil {
		if r.opts.explain != nil {
			defer r.opts.explain.Forget()
		}
		// Listening before the probes run: their events are written as
		// they are dropped.
		r.monitor()
	}
	for i := range ps {
		p := &ps[i]
		exp, why := r.sc.ExpectFor(r.opts.Mode, p)
		aff := exp.Verdict == "" && affinityFor(r.w.objs.services(), r.sc.nodeAddrs, p.to, p.proto)
		var x *model.Explanation
		var xerr string
		if c, err := r.w.clientFor(p.From); err == nil {
			x, xerr = explainFor(ex, exErr, p, c)
		}
		obs, pass := r.w.runProbe(p, exp, aff)
		r.report(step, p.Name, expectedString(p, exp, aff), obs, why, pass)
		switch {
		case xerr != "":
			r.reportExplain(step, p.Name, expectedString(p, exp, aff), xerr, false)
		case x != nil && pass:
			got, ok := judgeExplain(x, exp, r.sc.closed)
			r.reportExplain(step, p.Name, expectedString(p, exp, aff), got, ok)
			if ok && (x.Action == "drop" || x.Action == "reject") {
				c, _ := r.w.clientFor(p.From)
				r.checkMonitor(step, p, c, x)
			}
		}
	}
}

// step runs step n; false stops the scenario (the agent could not apply
// a change, so later results would mean nothing).
func (r *scenarioRun) step(ctx context.Context, n int, st *Step) bool {
	w := r.w
	switch {
	case st.Probes != nil:
		r.probes(n, st.Probes)
	case st.Apply != nil || st.Delete != nil:
		var err error
		what := "apply"
		if st.Apply != nil {
			err = w.objs.apply(st.Apply)
		} else {
			what = "delete"
			w.objs.delete(st.Delete)
		}
		if err == nil {
			err = w.writeObjects()
		}
		if err == nil {
			err = w.waitSynced(ctx, r.opts.SyncTimeout)
		}
		if err != nil {
			r.report(n, what, "applied by the agent", "ERROR: "+oneLine(err.Error()), "", false)
			return false
		}
		w.changed = time.Now()
	case st.Hold != nil:
		obs, pass := w.hold(st.Hold)
		r.report(n, "hold "+st.Hold.Name, "connected to a backend", obs, "", pass)
	case st.Session != nil:
		obs, pass := w.startSession(st.Session)
		r.report(n, "session "+st.Session.Name, "answered by "+st.Session.Expect.String(), obs, "", pass)
	case st.Await != nil:
		obs, pass := w.await(st.Await)
		within := time.Duration(orDefault(st.Await.Within, Duration(DefaultWithin)))
		r.report(n, "await "+st.Await.Session, fmt.Sprintf("answered by %s within %v of the change, and only by it", st.Await.Expect, within), obs, "", pass)
	case st.Check != nil:
		obs, pass := w.check(st.Check)
		want := "alive"
		if !*st.Check.Alive {
			want = "broken"
		}
		r.report(n, "check "+st.Check.Held, want, obs, "", pass)
	case st.Sleep != nil:
		select {
		case <-time.After(time.Duration(*st.Sleep)):
		case <-ctx.Done():
		}
	}
	return true
}

// hold opens a TCP connection and keeps it open for later checks.
func (w *world) hold(h *Hold) (string, bool) {
	c, err := w.clientFor(h.From)
	if err != nil {
		return "ERROR: " + err.Error(), false
	}
	if h.Bulk != nil || h.SourcePort != 0 {
		return w.holdBulk(h, c)
	}
	r, conn, err := lab.DialTCP(c.ns, c.src, h.to, DefaultTimeout)
	if err != nil {
		t := try{verdict: lab.Classify(err), err: err}
		return fmt.Sprintf("%s (%v)", t.outcome(h.to), err), false
	}
	w.holds[h.Name] = conn
	return "connected to " + (try{verdict: lab.OK, reply: r}).outcome(h.to), true
}

// check sends data on a held connection and waits for the echo.
func (w *world) check(c *Check) (string, bool) {
	if hs, ok := w.held[c.Held]; ok {
		return checkBulk(hs, *c.Alive)
	}
	conn, ok := w.holds[c.Held]
	if !ok {
		return "ERROR: hold " + c.Held + " was never established", false
	}
	err := lab.EchoCheck(conn, DefaultTimeout)
	alive := err == nil
	obs := "alive"
	if !alive {
		obs = fmt.Sprintf("broken (%v)", err)
	}
	return obs, alive == *c.Alive
}

// newWorld builds the namespaces of a scenario; the world is returned even
// on error so the caller can tear down what exists.
func newWorld(sc *Scenario, opts *Options) (*world, error) {
	prefix := lab.UniquePrefix(stalePrefixTag)
	l, err := lab.New(prefix)
	if err != nil {
		return nil, err
	}
	w := &world{sc: sc, mode: opts.Mode, lab: l, objs: newObjectSet(), written: map[string][]byte{}, holds: map[string]net.Conn{},
		held: map[string]*lab.HeldStream{}, sessions: map[string]*session{}}
	w.pinPath = filepath.Join("/sys/fs/bpf", strings.TrimSuffix(prefix, "-"))
	if w.dir, err = os.MkdirTemp("", prefix+"objects-"); err != nil {
		return w, err
	}
	w.logPath = filepath.Join(opts.LogDir, sc.Name+".agent.log")
	if err := w.objs.apply(sc.Objects); err != nil {
		return w, err
	}
	if err := w.build(); err != nil {
		return w, fmt.Errorf("build namespaces: %w", err)
	}
	text, _ := os.ReadFile(sc.File)
	if err := w.startSentinel(text); err != nil {
		return w, err
	}
	return w, nil
}

// start writes the objects, starts the agent and waits for it to apply them.
func (w *world) start(ctx context.Context, opts *Options) error {
	if err := w.writeObjects(); err != nil {
		return err
	}
	args, err := agentArgs(w.sc, opts.Mode, w.dir, w.pinPath)
	if err != nil {
		return err
	}
	if opts.NetfilterMode != "" {
		args = append(args, "--netfilter-mode="+opts.NetfilterMode)
	}
	args = append(args, opts.ExtraAgentArgs...)
	if w.agent, err = lab.StartTied(w.node.NS, w.logPath, opts.Bin, args...); err != nil {
		return err
	}
	if err := w.waitSynced(ctx, opts.SyncTimeout); err != nil {
		return fmt.Errorf("%w; agent log tail: %s", err, oneLine(logTail(w.logPath, 5)))
	}
	return nil
}

// close stops the agent, removes its datapath and pins, and deletes every
// namespace and file of the world.
func (w *world) close(bin string) error {
	for _, c := range w.holds {
		c.Close()
	}
	for _, h := range w.held {
		h.Close()
	}
	for _, s := range w.sessions {
		s.us.Close()
	}
	if w.agent != nil {
		w.agent.Stop(5 * time.Second)
	}
	if w.node != nil && w.agent != nil {
		lab.Run(w.node.NS, bin, "cleanup", "--pin-path", w.pinPath)
	}
	errs := []error{os.RemoveAll(w.pinPath)}
	w.sentinel.close()
	for _, e := range w.sctp {
		e.close()
	}
	errs = append(errs, w.lab.Close())
	if w.dir != "" {
		errs = append(errs, os.RemoveAll(w.dir))
	}
	return errors.Join(errs...)
}

// selects reports whether the scenario called name is to run.
func (o *Options) selects(name string) bool {
	if o.Filter != nil && !o.Filter.MatchString(name) {
		return false
	}
	return o.Skip == nil || !o.Skip.MatchString(name)
}
