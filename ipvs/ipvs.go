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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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

func defaultStateFile() string { return NamespaceFile("ipvs-state") } // among NamespaceFilePrefixes

// NamespaceFile is StateDir/<prefix>-<inode of the caller's network
// namespace>.json: xvs's records are per namespace, as what they describe
// is (IPVS, and an agent's Services).
func NamespaceFile(prefix string) string {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return filepath.Join(StateDir, prefix+".json")
	}
	return NamespaceFileOf(prefix, st.Ino)
}

// NamespaceFileOf is NamespaceFile for the namespace of inode ino.
func NamespaceFileOf(prefix string, ino uint64) string {
	return filepath.Join(StateDir, fmt.Sprintf("%s-%d.json", prefix, ino))
}

// NamespaceFilePrefixes are the records NamespaceFile names: the IPVS
// mode's state, and the agent's Services file (agent/publish.go). What
// removes a namespace removes them too (conformance's stale cleanup).
var NamespaceFilePrefixes = []string{"ipvs-state", "services"}

// HasState reports whether xvs's IPVS mode left state in the caller's
// network namespace: its state file, the record of what it created (a
// kube-ipvs0 alone is kube-proxy's). It does not load ip_vs.
func HasState(cfg Config) bool {
	cfg.defaults()
	_, err := os.Stat(cfg.StateFile)
	return err == nil
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

// stateRecord is the StateFile's content: what xvs created, which is all
// it ever removes.
type stateRecord struct {
	Servers []string `json:"virtualServers"`
	// VIPs are the addresses xvs bound to the dummy interface. A record
	// written before they were recorded has none: the addresses of its
	// virtual servers stand for them.
	VIPs []string `json:"vips,omitempty"`
	// CreatedDevice: xvs created the dummy interface (it was not there,
	// say from kube-proxy's IPVS mode, before).
	CreatedDevice bool `json:"createdDevice,omitempty"`
}

// loadOwned reads the state file. Only what it records is xvs's.
func (d *Datapath) loadOwned() error {
	b, err := os.ReadFile(d.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", d.cfg.StateFile, err)
	}
	var rec stateRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		d.cfg.Log.Warn("ignoring unreadable IPVS state file", "path", d.cfg.StateFile, "err", err)
	}
	for _, s := range rec.Servers {
		if k, err := parseVSKey(s); err == nil {
			d.owned[k] = true
			if rec.VIPs == nil {
				d.ownedVIPs[k.Addr] = true
			}
		}
	}
	for _, s := range rec.VIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			d.ownedVIPs[a.Unmap()] = true
		}
	}
	d.createdDevice = d.createdDevice || rec.CreatedDevice
	return nil
}

func (d *Datapath) saveOwned() error {
	rec := stateRecord{Servers: []string{}}
	keys := make([]vsKey, 0, len(d.owned))
	for k := range d.owned {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	for _, k := range keys {
		rec.Servers = append(rec.Servers, k.String())
	}
	rec.VIPs = []string{}
	for _, a := range slices.SortedFunc(maps.Keys(d.ownedVIPs), netip.Addr.Compare) {
		rec.VIPs = append(rec.VIPs, a.String())
	}
	rec.CreatedDevice = d.createdDevice
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.MkdirAll(filepath.Dir(d.cfg.StateFile), 0o755); err != nil {
		return err
	}
	tmp := d.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write IPVS state file: %w", err)
	}
	return os.Rename(tmp, d.cfg.StateFile)
}

func parseVSKey(s string) (vsKey, error) {
	var proto, ap string
	if _, err := fmt.Sscan(s, &proto, &ap); err != nil {
		return vsKey{}, fmt.Errorf("bad virtual server %q", s)
	}
	p, err := model.ParseProtocol(proto)
	if err != nil {
		return vsKey{}, err
	}
	a, err := netip.ParseAddrPort(ap)
	if err != nil {
		return vsKey{}, err
	}
	return vsKey{Addr: a.Addr(), Proto: p, Port: a.Port()}, nil
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

	var errs []error
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
	have, err := d.k.Services()
	if err != nil {
		return err
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
	// Remove the virtual servers xvs created that are no longer wanted.
	goneUDP := map[vsKey]bool{}
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

	// VIPs on the dummy interface.
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
	// Only the addresses xvs bound go: an address someone else put there
	// (kube-proxy's) stays.
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

// syncReals reconciles the real servers of one virtual server. A removed
// TCP real server with connections goes to weight 0 and drains; UDP and
// SCTP ones, and idle TCP ones, are deleted at once (kube-proxy's
// graceful_termination.go; expire_nodest_conn ends their flows).
func (d *Datapath) syncReals(vs *virtualServer, existed bool) error {
	var have []kReal
	if existed {
		var err error
		if have, err = d.k.Reals(vs.Key); err != nil {
			return err
		}
	}
	var errs []error
	haveBy := map[rsKey]kReal{}
	for _, r := range have {
		haveBy[r.Key] = r
	}
	keys := make([]rsKey, 0, len(vs.Reals))
	for r := range vs.Reals {
		keys = append(keys, r)
	}
	slices.SortFunc(keys, func(a, b rsKey) int {
		return netip.AddrPortFrom(a.Addr, a.Port).Compare(netip.AddrPortFrom(b.Addr, b.Port))
	})
	for _, r := range keys {
		w := vs.Reals[r]
		cur, ok := haveBy[r]
		switch {
		case !ok:
			if err := d.k.AddReal(vs.Key, kReal{Key: r, Weight: w}); err != nil {
				errs = append(errs, err)
			}
		case cur.Weight != w:
			// Also brings back a draining real server that is wanted again.
			if err := d.k.UpdateReal(vs.Key, kReal{Key: r, Weight: w}); err != nil {
				errs = append(errs, err)
			}
		}
		d.undrain(vs.Key, r)
	}
	for _, cur := range have {
		if _, ok := vs.Reals[cur.Key]; ok {
			continue
		}
		if err := d.retire(vs.Key, cur); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retire removes a real server, gracefully for TCP with connections.
func (d *Datapath) retire(k vsKey, r kReal) error {
	if k.Proto != model.TCP || r.Active+r.Inactive == 0 {
		d.undrain(k, r.Key)
		return d.k.DelReal(k, r.Key)
	}
	if r.Weight != 0 {
		if err := d.k.UpdateReal(k, kReal{Key: r.Key, Weight: 0}); err != nil {
			return err
		}
	}
	if d.draining[k] == nil {
		d.draining[k] = map[rsKey]time.Time{}
	}
	if _, ok := d.draining[k][r.Key]; !ok {
		d.draining[k][r.Key] = time.Now()
		d.cfg.Log.Info("real server draining", "service", k.String(), "real", r.Key.String(),
			"active", r.Active, "inactive", r.Inactive)
	}
	return nil
}

func (d *Datapath) undrain(k vsKey, r rsKey) {
	if m := d.draining[k]; m != nil {
		delete(m, r)
		if len(m) == 0 {
			delete(d.draining, k)
		}
	}
}

func (d *Datapath) drainLoop() {
	defer close(d.done)
	t := time.NewTicker(d.cfg.DrainInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			if err := d.drain(); err != nil {
				d.cfg.Log.Warn("graceful termination", "err", err)
			}
		}
	}
}

// drain deletes the draining real servers whose connections have ended.
func (d *Datapath) drain() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for k, reals := range d.draining {
		have, err := d.k.Reals(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for r := range reals {
			i := slices.IndexFunc(have, func(x kReal) bool { return x.Key == r })
			switch {
			case i < 0 || have[i].Weight > 0:
				// Gone, or wanted again.
				d.undrain(k, r)
			case have[i].Active+have[i].Inactive == 0:
				if err := d.k.DelReal(k, r); err != nil {
					errs = append(errs, err)
					continue
				}
				d.cfg.Log.Info("real server drained", "service", k.String(), "real", r.String())
				d.undrain(k, r)
			}
		}
	}
	return errors.Join(errs...)
}

// Draining reports the real servers waiting at weight 0, as "VS -> RS".
func (d *Datapath) Draining() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k, reals := range d.draining {
		for r := range reals {
			out = append(out, k.String()+" -> "+r.String())
		}
	}
	slices.Sort(out)
	return out
}
