// Package ipvs is xvs's fallback datapath: the same model.State realised in
// kernel IPVS, as kube-proxy's IPVS mode does it.
//
// Every Service frontend (ClusterIP, NodePort on each node address, external
// IP, LoadBalancer IP) becomes a virtual server in NAT (masquerade) mode
// with the Service's endpoints as real servers; ClusterIPs, external and LB
// IPs sit on a dummy interface (kube-ipvs0) so the node accepts them. The
// scheduler is the Service's IPVS scheduler; ClientIP affinity is IPVS
// persistence. Removed TCP real servers drain at weight 0 (graceful
// termination); stale UDP conntrack entries are deleted. Masquerade and
// filtering live in nftables tables of xvs's own (see rules.go).
//
// Unlike kube-proxy, xvs never flushes IPVS: it changes and removes only the
// virtual servers it created (recorded in a state file, or on its dummy
// interface), so other IPVS users on the node keep theirs.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/xvs-lb/xvs/model"
)

// Defaults.
const (
	DefaultDevice = "kube-ipvs0"
	// StateDir holds the state files, one per network namespace (IPVS
	// state is per namespace): ipvs-state-<netns inode>.json.
	StateDir = "/run/xvs"
	// DefaultDrainInterval is how often draining real servers are checked
	// (kube-proxy: 1 min; shorter here so weight-0 entries go sooner).
	DefaultDrainInterval = 5 * time.Second
)

// Config configures the IPVS datapath. The zero value of each field means
// its default.
type Config struct {
	// Scheduler is the default IPVS scheduler (ipvs.scheduler); rr if empty.
	Scheduler string
	// StrictARP sets arp_ignore=1 and arp_announce=2 (ipvs.strictARP).
	StrictARP bool
	// ExcludeCIDRs are never cleaned up (ipvs.excludeCIDRs).
	ExcludeCIDRs []netip.Prefix
	// TCPTimeout, TCPFinTimeout, UDPTimeout are ipvsadm --set (0 keeps the kernel's).
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// Device is the dummy interface holding the VIPs (kube-ipvs0).
	Device string
	// StateFile records the virtual servers xvs created, so a restarted
	// agent and `xvs cleanup` touch only those (default: one file per
	// network namespace under StateDir).
	StateFile string
	// DrainInterval is how often weight-0 real servers are checked for
	// remaining connections.
	DrainInterval time.Duration
	// NoRules skips the nftables masquerade and filter rules (tests of
	// the IPVS part alone).
	NoRules bool
	Log     *slog.Logger
}

func (c *Config) defaults() {
	if c.Device == "" {
		c.Device = DefaultDevice
	}
	if c.StateFile == "" {
		c.StateFile = defaultStateFile()
	}
	if c.DrainInterval <= 0 {
		c.DrainInterval = DefaultDrainInterval
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Datapath realises a model.State in kernel IPVS (model.Datapath).
type Datapath struct {
	cfg  Config
	k    kernel
	rule ruleApplier
	ct   conntrackCleaner

	mu sync.Mutex
	// owned are the virtual servers xvs created, ownedVIPs the addresses
	// it bound to the dummy interface, createdDevice whether it created
	// that interface (the state file records them). Nothing else is
	// xvs's: kube-proxy's IPVS mode uses the same interface name, and its
	// virtual servers and addresses stay whatever xvs does.
	owned         map[vsKey]bool
	ownedVIPs     map[netip.Addr]bool
	createdDevice bool
	// draining are TCP real servers at weight 0 waiting for their
	// connections to end.
	draining map[vsKey]map[rsKey]time.Time
	// schedOK caches scheduler probes.
	schedOK  map[string]error
	udp      map[vsKey]bool // UDP frontends of the last sync
	problems []string
	// ruleFailures counts failed writes of the nftables rules; ctTook is
	// how long the last sync's stale UDP conntrack cleanup took.
	ruleFailures uint64
	ctTook       time.Duration

	stop chan struct{}
	done chan struct{}
}

// New opens kernel IPVS in the caller's network namespace, probes the
// default scheduler, sets the sysctls kube-proxy sets, and starts the drain
// loop for graceful termination. It fails at once, naming what is missing,
// when the kernel has no IPVS.
func New(cfg Config) (*Datapath, error) {
	cfg.defaults()
	mk, err := newMobyKernel(cfg.Device)
	if err != nil {
		return nil, err
	}
	d, err := newDatapath(cfg, mk, nftRules{}, netlinkConntrack{})
	if err != nil {
		mk.Close()
		return nil, err
	}
	if err := setSysctls(cfg, cfg.Log); err != nil {
		d.Close()
		return nil, err
	}
	if err := setTimeouts(mk, cfg); err != nil {
		d.Close()
		return nil, err
	}
	go d.drainLoop()
	return d, nil
}

func newDatapath(cfg Config, k kernel, r ruleApplier, ct conntrackCleaner) (*Datapath, error) {
	cfg.defaults()
	d := recordOf(cfg, k)
	d.rule, d.ct = r, ct
	d.draining, d.schedOK, d.udp = map[vsKey]map[rsKey]time.Time{}, map[string]error{}, map[vsKey]bool{}
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	if err := d.loadOwned(); err != nil {
		return nil, err
	}
	if err := d.probeScheduler(schedulerFor(&model.ServicePort{}, cfg.Scheduler)); err != nil {
		return nil, err
	}
	return d, nil
}

// Mode names the datapath, as /proxyMode reports it.
func (d *Datapath) Mode() string { return string(model.ModeIPVS) }

// List reads the virtual servers this agent programmed, with the kernel's
// counters (the per-Service metrics; `xvs list` reads the same through
// List).
func (d *Datapath) List() ([]ServiceView, error) { return List(d.cfg) }

// RuleWriteFailures counts the syncs whose nftables rules could not be
// written (kube-proxy's iptables-restore failures).
func (d *Datapath) RuleWriteFailures() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ruleFailures
}

// ConntrackReconcileTime is how long the last sync spent deleting the
// conntrack entries of removed UDP endpoints.
func (d *Datapath) ConntrackReconcileTime() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctTook
}

// Problems lists what the last sync could not program as asked.
func (d *Datapath) Problems() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.problems)
}

// Close stops the drain loop. IPVS state stays in place (a restarted agent
// takes it over); Cleanup removes it.
func (d *Datapath) Close() {
	select {
	case <-d.stop:
		return
	default:
	}
	close(d.stop)
	if mk, ok := d.k.(*mobyKernel); ok {
		// The drain loop only runs when New started it.
		select {
		case <-d.done:
		case <-time.After(time.Second):
		}
		mk.Close()
	}
}

// probeScheduler creates and deletes a throw-away virtual server with the
// scheduler, as kube-proxy does (198.51.100.0:20000, TEST-NET-2): the only
// reliable check that the kernel has it (ip_vs_<name> loadable). A kernel
// without it answers ENOENT; the result is cached per scheduler.
func (d *Datapath) probeScheduler(name string) error {
	if err, ok := d.schedOK[name]; ok {
		return err
	}
	probe := kService{Key: vsKey{Addr: netip.MustParseAddr("198.51.100.0"), Proto: model.TCP, Port: 20000}, Scheduler: name}
	err := d.k.AddService(probe)
	if err == nil {
		// Read it back: the kernel must report the scheduler it was given.
		var list []kService
		list, err = d.k.Services()
		if err == nil {
			err = fmt.Errorf("probe virtual server %s not listed after creation", probe.Key)
			for _, s := range list {
				if s.Key == probe.Key {
					err = nil
					if s.Scheduler != name {
						err = fmt.Errorf("kernel reports scheduler %q for a probe created with %q", s.Scheduler, name)
					}
				}
			}
		}
		if derr := d.k.DelService(probe.Key); derr != nil && err == nil {
			err = derr
		}
	}
	if err != nil {
		err = fmt.Errorf("IPVS scheduler %q is not usable (kernel module ip_vs_%s?): %w", name, name, err)
	}
	d.schedOK[name] = err
	return err
}

func (d *Datapath) excluded(a netip.Addr) bool {
	for _, p := range d.cfg.ExcludeCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Sync makes kernel IPVS, the dummy interface, the rules and conntrack
// match st. Errors are collected: one bad virtual server does not stop
// the others, and a retry redoes only what still differs.
func (d *Datapath) Sync(ctx context.Context, st *model.State) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()

	local, err := d.k.OtherLocalAddrs()
	if err != nil {
		return err
	}
	want := buildDesired(st, d.cfg.Scheduler, local)
	d.problems = slices.Clone(want.Problems)
	d.checkSchedulers(want)

	// Rules first: a frontend must never answer before its filtering
	// (source ranges, KUBE-IPVS-FILTER) and masquerade are in place.
	if !d.cfg.NoRules {
		if err := d.rule.Apply(renderRules(st, want, d.cfg)); err != nil {
			d.ruleFailures++
			return err
		}
	}
	created, err := d.k.EnsureDevice()
	if err != nil {
		return err
	}
	d.createdDevice = d.createdDevice || created
	goneUDP, errs, err := d.syncServers(want)
	if err != nil {
		return err // what IPVS holds is unknown: no VIP before its server
	}
	errs = append(errs, d.syncVIPs(want)...)
	if err := d.saveOwned(); err != nil {
		errs = append(errs, err)
	}
	ctStart := time.Now()
	if err := d.ct.CleanupUDP(want.Serving, goneUDP); err != nil {
		// Stale entries cost a UDP client a retry; not worth a failed sync.
		d.problems = append(d.problems, "stale UDP conntrack cleanup: "+err.Error())
	}
	d.ctTook = time.Since(ctStart)
	d.udp = map[vsKey]bool{}
	for k := range want.Serving {
		d.udp[k] = true
	}
	return errors.Join(errs...)
}

// checkSchedulers replaces each scheduler the kernel cannot load by the
// default one, saying so.
func (d *Datapath) checkSchedulers(want *desired) {
	for _, k := range want.sortedKeys() {
		vs := want.Servers[k]
		if err := d.probeScheduler(vs.Scheduler); err != nil {
			def := schedulerFor(&model.ServicePort{}, d.cfg.Scheduler)
			d.problems = append(d.problems, fmt.Sprintf("%s: %v; using %s", vs.Owner, err, def))
			vs.Scheduler = def
			vs.Flags &^= flagMHPort
			if def == "mh" {
				vs.Flags |= flagMHPort
			}
		}
	}
}

// syncServers adds or updates the wanted virtual servers with their real
// servers, then removes those xvs created that are no longer wanted. It
// returns the UDP ones gone (their conntrack entries go too), the errors
// of single servers, and an error when IPVS cannot be read at all.
func (d *Datapath) syncServers(want *desired) (goneUDP map[vsKey]bool, errs []error, err error) {
	have, err := d.k.Services()
	if err != nil {
		return nil, nil, err
	}
	haveByKey := map[vsKey]kService{}
	for _, s := range have {
		haveByKey[s.Key] = s
	}
	// Virtual servers first, so a VIP never answers before its service
	// exists (a connection in between would be accepted by no one).
	for _, k := range want.sortedKeys() {
		vs := want.Servers[k]
		ks := kService{Key: k, Scheduler: vs.Scheduler, Flags: vs.Flags, Timeout: vs.Timeout}
		cur, ok := haveByKey[k]
		switch {
		case !ok:
			if err := d.k.AddService(ks); err != nil {
				errs = append(errs, err)
				continue
			}
		case cur.Scheduler != ks.Scheduler || cur.Flags != ks.Flags || cur.Timeout != ks.Timeout:
			if err := d.k.UpdateService(ks); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		d.owned[k] = true
		if err := d.syncReals(vs, ok); err != nil {
			errs = append(errs, err)
		}
	}
	goneUDP = map[vsKey]bool{}
	for _, s := range have {
		k := s.Key
		if _, ok := want.Servers[k]; ok || !d.owned[k] || d.excluded(k.Addr) {
			continue
		}
		if err := d.k.DelService(k); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(d.owned, k)
		delete(d.draining, k)
		if k.Proto == model.UDP {
			goneUDP[k] = true
		}
	}
	for k := range d.owned {
		if _, ok := want.Servers[k]; !ok {
			if _, still := haveByKey[k]; !still {
				delete(d.owned, k)
			}
		}
	}
	for k := range d.udp {
		if _, ok := want.Servers[k]; !ok {
			goneUDP[k] = true
		}
	}
	return goneUDP, errs, nil
}

// syncVIPs binds the wanted VIPs to the dummy interface and unbinds those
// xvs bound that are no longer wanted; an address someone else put there
// (kube-proxy's) stays.
func (d *Datapath) syncVIPs(want *desired) (errs []error) {
	onDev, err := d.k.DeviceAddrs()
	if err != nil {
		errs = append(errs, err)
	}
	for a := range want.VIPs {
		if !slices.Contains(onDev, a) {
			if err := d.k.AddDeviceAddr(a); err != nil {
				errs = append(errs, err)
				continue
			}
			d.ownedVIPs[a] = true
		}
	}
	for _, a := range onDev {
		if !want.VIPs[a] && d.ownedVIPs[a] && !d.excluded(a) {
			if err := d.k.DelDeviceAddr(a); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(d.ownedVIPs, a)
		}
	}
	for a := range d.ownedVIPs {
		if !want.VIPs[a] && !slices.Contains(onDev, a) {
			delete(d.ownedVIPs, a) // gone behind our back
		}
	}
	return errs
}
