package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/healthcheck"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/model"
)

type syncerConfig struct {
	log        *slog.Logger
	tracker    *controller.Tracker
	dp         Datapath
	metrics    *xmetrics.Metrics
	syncPeriod time.Duration
	// fullSyncPeriod is how often a full sync runs (0: an hour).
	fullSyncPeriod time.Duration
	ccfg           controller.Config
	kube           *kubeClient // nil with the file source
	// servicesFile is where the Services file is published (publish.go;
	// "": not published).
	servicesFile string
	// adopt: after the first sync, take over the connections another
	// proxy translated (adopt.go).
	adopt bool
	// firstSyncMaxRemoved is --first-sync-max-removed (firstsync.go).
	firstSyncMaxRemoved float64
}

// syncer is the body of the sync loop: Tracker.Build, Datapath.Sync, then
// the bookkeeping kube-proxy does around a sync (health, metrics, health
// check servers, problem reports). The runner calls sync; the sources call
// onEvent / onFileChange.
type syncer struct {
	syncerConfig
	health    *healthcheck.ProxyHealth
	svcHealth healthServers
	// trigger asks the runner for a sync (set once the runner exists).
	trigger func()
	// staleCounted is what the reconciler counter holds of the
	// datapath's StaleFlowsDeleted, by family.
	staleCounted [2]uint64
	// rulesCounted is what the restore-failure counter holds of the
	// datapath's RuleWriteFailures.
	rulesCounted uint64

	mu sync.Mutex
	// triggers are the EndpointSlice last-change-trigger-times of changes
	// not yet synced: network programming latency ends at their sync.
	triggers []trigger
	// pending counts changes not yet synced, by kind.
	pendingServices, pendingEndpoints int

	// Touched only by sync (the runner's goroutine).
	lastFull time.Time
	// lastRewrite is when the datapath last rewrote all its entries.
	lastRewrite time.Time
	reported    map[controller.Problem]bool
	dpProbs     map[string]bool
	// dpEvented are the datapath problems an Event has been recorded for.
	dpEvented map[string]bool
	summary   stateSummary
	// synced is set by the first sync that reached the datapath.
	synced bool
	// restoreGC puts the garbage collector's target back once a full
	// sync (or the start, until the first sync) is over; nil when it is
	// not lowered. Set before the runner starts, then only by sync.
	restoreGC func()
}

// healthServers is what the syncer needs of healthcheck.ServiceHealth.
type healthServers interface {
	Sync(want map[types.NamespacedName]healthcheck.Service, addrs []netip.Addr)
	Close()
}

type trigger struct {
	at     time.Time
	family string
}

func newSyncer(cfg syncerConfig) *syncer {
	if cfg.fullSyncPeriod == 0 {
		cfg.fullSyncPeriod = defaultFullSyncPeriod
	}
	s := &syncer{syncerConfig: cfg, reported: map[controller.Problem]bool{}, dpProbs: map[string]bool{},
		summary: stateSummary{names: newFrontendNames()}}
	if cfg.servicesFile != "" {
		s.summary.pub = newServicesPublisher(cfg.log, cfg.servicesFile)
	}
	m := cfg.metrics
	// kube-proxy's health timeout is twice syncPeriod.
	s.health = healthcheck.NewProxyHealth(2*cfg.syncPeriod, healthcheck.Counters{
		Healthz: func(code int) { m.ProxyHealthzTotal.WithLabelValues(strconv.Itoa(code)).Inc() },
		Livez:   func(code int) { m.ProxyLivezTotal.WithLabelValues(strconv.Itoa(code)).Inc() },
	})
	s.svcHealth = healthcheck.NewServiceHealth(s.health.IsHealthy, func(svc types.NamespacedName, port uint16, err error) {
		cfg.log.Error("Cannot start the health check server of a Service", "service", svc, "port", port, "err", err)
		if cfg.kube != nil {
			cfg.kube.serviceEvent(svc, "Warning", "FailedToStartServiceHealthcheck",
				"node %s failed to start healthcheck %q on port %d: %v", cfg.ccfg.NodeName, svc.String(), port, err)
		}
	})
	return s
}

// onEvent is the informer source's callback.
func (s *syncer) onEvent(ev controller.Event) {
	if ev.Kind == "Node" {
		s.health.SyncNode(ev.Node)
	}
	if !ev.Changed {
		return
	}
	s.mu.Lock()
	switch ev.Kind {
	case "Service":
		s.pendingServices++
		s.metrics.ServiceChangesTotal.Inc()
	case "EndpointSlice":
		s.pendingEndpoints++
		s.metrics.EndpointChangesTotal.Inc()
		if !ev.TriggerTime.IsZero() {
			fam := xmetrics.IPv4
			if ev.AddressType == discoveryv1.AddressTypeIPv6 {
				fam = xmetrics.IPv6
			}
			s.triggers = append(s.triggers, trigger{at: ev.TriggerTime, family: fam})
		}
	}
	s.metrics.ServiceChangesPending.Set(float64(s.pendingServices))
	s.metrics.EndpointChangesPending.Set(float64(s.pendingEndpoints))
	s.mu.Unlock()
	s.queued()
}

// onFileChange is the file source's callback: some manifest changed.
func (s *syncer) onFileChange() { s.queued() }

func (s *syncer) queued() {
	s.health.QueuedUpdate()
	now := float64(time.Now().UnixNano()) / 1e9
	for _, f := range s.families(nil) {
		s.metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(f).Set(now)
	}
	if s.trigger != nil {
		s.trigger()
	}
}

// defaultFullSyncPeriod is kube-proxy's FullSyncPeriod: how often every
// Service is re-evaluated and every datapath entry rewritten, which bounds
// how long an entry changed behind the agent's back can survive.
const defaultFullSyncPeriod = time.Hour

// sync builds the State and applies it. A full sync (every Service
// translated again, every datapath entry rewritten) runs at start (the
// Tracker's first Build), after a failure, on a Node change (both by the
// Tracker) and every fullSyncPeriod (here). Every other run, at each change
// and at least every syncPeriod, is partial: the datapath gets the State
// and applies what changed (in ebpf mode O(changed), nothing at all when
// nothing changed, beyond retrying what a full map refused; in ipvs mode a
// comparison with the kernel's tables, which restores what was removed
// behind the agent's back).
func (s *syncer) sync(ctx context.Context) error {
	start := time.Now()
	if s.lastFull.IsZero() || start.Sub(s.lastFull) >= s.fullSyncPeriod {
		s.tracker.ForceFullSync()
		s.lowerGC()
	}
	// Changes counted before Build are in this State; later ones wait
	// for the next sync.
	s.mu.Lock()
	triggers := s.triggers
	s.triggers = nil
	svcs, eps := s.pendingServices, s.pendingEndpoints
	s.mu.Unlock()

	b := s.tracker.Build()
	if b.Full {
		s.lowerGC()
	}
	s.reportProblems(b.Problems)
	if err := s.guardFirstSync(ctx, b.State); err != nil {
		s.log.Error("Not applying the first sync; the datapath keeps what it has", "err", err)
		s.metrics.FirstSyncHeld.Inc()
		s.retryLater(triggers)
		return err
	}
	if b.Full && start.Sub(s.lastRewrite) >= s.fullSyncPeriod {
		// The datapath rewrites every entry too, repairing maps changed
		// behind our back.
		if f, ok := s.dp.(fullSyncForcer); ok {
			f.ForceFullSync()
		}
		s.lastRewrite = start
	}
	fams := s.families(b.State)
	var ad *adoption
	if !s.synced && s.adopt {
		ad = s.prepareAdoption()
	}
	err := s.dp.Sync(ctx, b.State)
	s.countRuleFailures(fams)
	if err != nil {
		s.log.Error("Datapath sync failed; retrying with a full sync", "err", err)
		s.metrics.SyncFailuresTotal.WithLabelValues(s.dp.Mode()).Inc()
		s.retryLater(triggers)
		return err
	}
	if ad != nil {
		s.finishAdoption(ad)
	}
	s.synced = true
	s.reportDatapathProblems(s.dp.Problems())
	end := time.Now()
	if b.Full {
		s.lastFull = end
		// A full sync translated every Service again: hand the garbage
		// back to the system now rather than keep it until the next
		// collection (at 100k Services, hundreds of MiB).
		debug.FreeOSMemory()
	}
	s.raiseGC()
	s.recordSync(b, fams, triggers, svcs, eps, start, end)
	return nil
}

// lowerGC lowers the garbage collector's target for a full sync
// (controller.LowerGCTarget); a failed one stays lowered for its retry.
func (s *syncer) lowerGC() {
	if s.restoreGC == nil {
		s.restoreGC = controller.LowerGCTarget()
	}
}

// raiseGC sets the target for the time until the next full sync, after a
// sync that reached the datapath (controller.SteadyGCPercent: Go's default
// for a small heap, less headroom for a large one, or the operator's GOGC).
func (s *syncer) raiseGC() {
	if s.restoreGC != nil {
		s.restoreGC()
		s.restoreGC = nil
	}
}

// retryLater makes the next sync a full one that also answers for this
// one's triggers (the network programming latency counts from them).
func (s *syncer) retryLater(triggers []trigger) {
	s.tracker.ForceFullSync()
	s.mu.Lock()
	s.triggers = append(triggers, s.triggers...)
	s.mu.Unlock()
}

// recordSync records a sync applied from start to end: the summary health and
// metrics read, the sync's own metrics, the changes it took off the
// pending counts, health, and the health-check servers.
func (s *syncer) recordSync(b controller.Sync, fams []string, triggers []trigger, svcs, eps int, start, end time.Time) {
	took := end.Sub(start)
	s.summary.update(b.State)
	if s.summary.pub != nil {
		s.summary.pub.changed()
	}
	s.countStaleFlows(fams)
	s.metrics.ObserveSync(fams, b.Full, took, end)
	if r, ok := s.dp.(conntrackReconciler); ok {
		for _, f := range fams {
			s.metrics.ConntrackReconcileLatency.WithLabelValues(f).Observe(r.ConntrackReconcileTime().Seconds())
		}
	}
	for _, t := range triggers {
		s.metrics.NetworkProgrammingLatency.WithLabelValues(t.family).Observe(end.Sub(t.at).Seconds())
	}
	s.mu.Lock()
	s.pendingServices -= svcs
	s.pendingEndpoints -= eps
	s.metrics.ServiceChangesPending.Set(float64(s.pendingServices))
	s.metrics.EndpointChangesPending.Set(float64(s.pendingEndpoints))
	s.mu.Unlock()
	s.health.SetFamilies(fams)
	s.health.Updated()
	s.metrics.ServicePorts.Set(float64(len(b.State.Services)))
	s.recordNoLocal(b.State)
	s.svcHealth.Sync(s.summary.healthCheckServices(), s.healthCheckAddrs(b.State))
	if b.Changed || b.Full {
		s.log.Debug("Synced", "servicePorts", len(b.State.Services), "full", b.Full, "took", took)
	}
}

// families lists the IP families the node serves (kube-proxy's ip_family
// label): those of its addresses and frontends, IPv4 when unknown.
func (s *syncer) families(st *model.State) []string {
	var has [2]bool
	mark := func(a netip.Addr) {
		if a.Unmap().Is4() {
			has[0] = true
		} else if a.IsValid() {
			has[1] = true
		}
	}
	for _, a := range s.ccfg.NodeAddresses {
		mark(a)
	}
	if st != nil {
		for _, a := range st.Node.Addresses {
			mark(a)
		}
		// sync brings the summary to st before it asks.
		has[0] = has[0] || s.summary.frontends[0] > 0
		has[1] = has[1] || s.summary.frontends[1] > 0
	}
	var out []string
	if has[0] || !has[1] {
		out = append(out, xmetrics.IPv4)
	}
	if has[1] {
		out = append(out, xmetrics.IPv6)
	}
	return out
}

// recordNoLocal sets kubeproxy_sync_proxy_rules_no_local_endpoints_total
// from the summary of st.
func (s *syncer) recordNoLocal(st *model.State) {
	for _, pol := range []string{"internal", "external"} {
		for _, f := range s.families(st) {
			s.metrics.NoLocalEndpointsTotal.WithLabelValues(pol, f).Set(float64(s.summary.noLocal[[2]string{pol, f}]))
		}
	}
}

// healthCheckAddrs: the health check servers listen on every address when
// nodePortAddresses is unset (kube-proxy), else on the NodePort addresses.
func (s *syncer) healthCheckAddrs(st *model.State) []netip.Addr {
	if len(s.ccfg.NodePortAddresses) == 0 {
		return nil
	}
	return s.ccfg.SelectNodePortAddresses(st.Node.Addresses)
}

// reportProblems logs each bad input once, when it appears, exports the
// current count per kind, and (with the API source) records a Warning
// Event on the offending Service or EndpointSlice.
func (s *syncer) reportProblems(probs []controller.Problem) {
	current := make(map[controller.Problem]bool, len(probs))
	byKind := map[string]int{"Service": 0, "EndpointSlice": 0, "Node": 0, "Config": 0, "File": 0}
	for _, p := range probs {
		current[p] = true
		byKind[p.Kind]++
		if s.reported[p] {
			continue
		}
		s.log.Warn("Skipping bad input", "kind", p.Kind, "object", p.Object, "file", p.File, "reason", p.Reason)
		if s.kube != nil {
			s.kube.problemEvent(p)
		}
	}
	s.reported = current
	for k, n := range byKind {
		s.metrics.Problems.WithLabelValues(k).Set(float64(n))
	}
}

func (s *syncer) reportDatapathProblems(probs []string) {
	current := make(map[string]bool, len(probs))
	for _, p := range probs {
		current[p] = true
		if !s.dpProbs[p] {
			s.log.Warn("Datapath cannot program part of the state", "problem", p)
		}
	}
	s.dpProbs = current
	s.metrics.Problems.WithLabelValues("Datapath").Set(float64(len(probs)))
	// A Warning Event on the Service for each new one (bounded per
	// object, like every Event of the agent's).
	if sp, ok := s.dp.(serviceProblems); ok && s.kube != nil {
		for name, ps := range sp.ServiceProblems() {
			for _, p := range ps {
				if !s.dpEvented[p] {
					s.kube.serviceEvent(types.NamespacedName{Namespace: name.Namespace, Name: name.Name},
						"Warning", "XvsDatapathProblem", "xvs on node %s: %s", s.ccfg.NodeName, p)
				}
			}
		}
		s.dpEvented = current
	}
}

// countStaleFlows adds the UDP/SCTP flows the datapath deleted for their
// removed endpoints since the last sync to kube-proxy's reconciler counter.
func (s *syncer) countStaleFlows(fams []string) {
	d, ok := s.dp.(staleFlowCounter)
	if !ok {
		return
	}
	n := d.StaleFlowsDeleted()
	for i, fam := range []string{xmetrics.IPv4, xmetrics.IPv6} {
		// The served families' series exist from the first sync, at 0,
		// as kube-proxy's do.
		if n[i] > s.staleCounted[i] || slices.Contains(fams, fam) {
			s.metrics.ConntrackDeletedTotal.WithLabelValues(fam).Add(float64(n[i] - s.staleCounted[i]))
		}
	}
	s.staleCounted = n
}

// countRuleFailures adds the datapath's new netfilter rule write failures
// to kube-proxy's restore-failure counter, for each family served.
func (s *syncer) countRuleFailures(fams []string) {
	w, ok := s.dp.(ruleWriter)
	if !ok {
		return
	}
	n := w.RuleWriteFailures()
	if n > s.rulesCounted {
		for _, f := range fams {
			s.metrics.RulesRestoreFailuresTotal.WithLabelValues(f).Add(float64(n - s.rulesCounted))
		}
	}
	s.rulesCounted = n
}

// guardFirstSync holds a suspicious first sync (agent_firstsync.go) from
// the API source until a direct list confirms it.
func (s *syncer) guardFirstSync(ctx context.Context, st *model.State) error {
	r, ok := s.dp.(recoveredDatapath)
	if s.synced || s.kube == nil || !ok {
		return nil
	}
	g := firstSyncGuard{maxRemoved: s.firstSyncMaxRemoved, proxyName: s.ccfg.ServiceProxyName}
	return g.check(s.log, st, r.RecoveredFrontends(), func() (*model.State, error) {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return s.kube.listState(lctx, s.ccfg)
	})
}
