package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
)

var kebab = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// sectionRe finds "SEMANTICS 3.4" / "§3.4" and the numbers that follow.
var (
	sectionHead = regexp.MustCompile(`(?:SEMANTICS|§)\s*((?:§?\d+\.\d+)(?:\s*(?:,|and|&|/)\s*§?\d+\.\d+)*)`)
	sectionNum  = regexp.MustCompile(`\d+\.\d+`)
)

// SectionsOf extracts the docs/semantics.md section numbers a description names.
func SectionsOf(desc string) []string {
	var out []string
	for _, m := range sectionHead.FindAllStringSubmatch(desc, -1) {
		for _, n := range sectionNum.FindAllString(m[1], -1) {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// validator collects every problem of a scenario, not only the first.
type validator struct {
	s        *Scenario
	errs     []error
	objs     map[objKey]bool // objects that exist at the current point
	names    map[string]bool // probe names, for overrides
	holds    map[string]bool
	bulk     map[string]bool // holds with data flowing
	sessions map[string]bool
	nprobes  int
}

func (v *validator) bad(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

// validate checks everything the format requires and fills the parsed
// fields.
func (s *Scenario) validate() error {
	v := &validator{s: s, objs: map[objKey]bool{}, names: map[string]bool{}, holds: map[string]bool{},
		bulk: map[string]bool{}, sessions: map[string]bool{}}
	v.header()
	for i, raw := range s.Objects {
		k, err := keyOf(raw)
		if err != nil {
			v.bad("objects[%d]: %v", i, err)
			continue
		}
		v.needV3Kind(fmt.Sprintf("objects[%d]", i), k)
		v.objs[k] = true
	}
	if len(s.Probes) > 0 && len(s.Steps) > 0 {
		v.bad("probes and steps: use one or the other (steps replace top-level probes)")
	}
	v.probes("probes", s.Probes)
	for i := range s.Steps {
		v.step(fmt.Sprintf("steps[%d]", i), &s.Steps[i])
	}
	if v.nprobes == 0 && len(v.holds) == 0 && len(v.sessions) == 0 {
		v.bad("no probes: a scenario must probe something")
	}
	v.sources()
	v.closedPorts()
	v.overrides()
	return errors.Join(v.errs...)
}

// sources checks the version 4 fields of every probe's, hold's and
// session's source: an external client behind a router of its own family
// and a link MTU the family allows, one MTU per router.
func (v *validator) sources() {
	mtus := map[netip.Addr]int{}
	for _, f := range v.s.flows() {
		fr := f.from
		used := fr.usesV4()
		if len(used) == 0 {
			continue
		}
		if v.s.Version < Version4 {
			v.bad("from %s: %s need version: 4", fr.IP, strings.Join(used, ", "))
			continue
		}
		if !fr.Router.IsValid() {
			v.bad("from %s: mtu needs a router (the far end of the narrow link)", fr.IP)
			continue
		}
		if fr.Role != RoleAuto && fr.Role != RoleExternal {
			v.bad("from %s: only an external client can sit behind a router (role %s)", fr.IP, fr.Role)
		}
		if fr.Router.Is4() != fr.IP.Is4() || fr.Router == fr.IP {
			v.bad("from %s: router %s must be another address of the same family", fr.IP, fr.Router)
		}
		lo := 576
		if fr.IP.Is6() {
			lo = 1280
		}
		if fr.MTU != 0 && (fr.MTU < lo || fr.MTU > 9000) {
			v.bad("from %s: mtu %d out of range (%d..9000)", fr.IP, fr.MTU, lo)
		}
		if m, ok := mtus[fr.Router]; ok && m != fr.MTU {
			v.bad("from %s: router %s has mtu %d elsewhere: one link per router", fr.IP, fr.Router, m)
		}
		mtus[fr.Router] = fr.MTU
	}
}

// closedPorts parses closed: endpoint address:ports (version 4) of some
// EndpointSlice in the scenario.
func (v *validator) closedPorts() {
	s := v.s
	if len(s.Closed) == 0 {
		return
	}
	if s.Version < Version4 {
		v.bad("closed: needs version: 4")
		return
	}
	eps := map[netip.AddrPort]bool{}
	for _, e := range collectEndpoints(s) {
		for _, p := range e.ports {
			eps[netip.AddrPortFrom(e.addr, p.port)] = true
		}
	}
	s.closed = map[netip.AddrPort]bool{}
	for i, c := range s.Closed {
		ap, err := netip.ParseAddrPort(strings.TrimSpace(c))
		if err != nil {
			v.bad("closed[%d]: %v", i, err)
			continue
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if !eps[ap] {
			v.bad("closed[%d]: %s is no endpoint address and port of an EndpointSlice here", i, ap)
		}
		s.closed[ap] = true
	}
}

// header checks name, node, cluster, proxy and modes.
func (v *validator) header() {
	s := v.s
	switch s.Version {
	case 0, Version1, Version2, Version3, Version4:
	default:
		v.bad("version %d: this runner reads versions 1, 2, 3 and 4", s.Version)
	}
	if s.Name == "" {
		v.bad("name: required")
	} else if !kebab.MatchString(s.Name) {
		v.bad("name %q: want kebab-case", s.Name)
	}
	s.Sections = SectionsOf(s.Description)
	if s.Node.Name == "" {
		v.bad("node.name: required")
	}
	if len(s.Node.Addresses) == 0 {
		v.bad("node.addresses: at least one address is required")
	}
	for _, a := range s.Node.Addresses {
		ip, err := parseAddrOrPrefix(a)
		if err != nil {
			v.bad("node.addresses: %v", err)
			continue
		}
		s.nodeAddrs = append(s.nodeAddrs, ip)
	}
	var err error
	if s.podCIDRs, err = parsePrefixes(s.Cluster.PodCIDRs); err != nil {
		v.bad("cluster.podCIDRs: %v", err)
	}
	if s.serviceCIDRs, err = parsePrefixes(s.Cluster.ServiceCIDRs); err != nil {
		v.bad("cluster.serviceCIDRs: %v", err)
	}
	if s.Proxy.ClusterCIDR != nil && strings.TrimSpace(*s.Proxy.ClusterCIDR) != "" {
		if _, err := parsePrefixes(strings.Split(*s.Proxy.ClusterCIDR, ",")); err != nil {
			v.bad("proxy.clusterCIDR: %v", err)
		}
	}
	switch s.Proxy.DetectLocalMode {
	case "", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
	default:
		v.bad("proxy.detectLocalMode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", s.Proxy.DetectLocalMode)
	}
	for _, m := range s.Modes {
		if canonicalMode(m) == "" {
			v.bad("modes: unknown mode %q (bpf, ebpf or ipvs)", m)
		}
	}
}

func (v *validator) probes(where string, ps []Probe) {
	for i := range ps {
		v.nprobes++
		if err := ps[i].validate(); err != nil {
			v.bad("%s[%d] %q: %v", where, i, ps[i].Name, err)
		}
		v.needV2(fmt.Sprintf("%s[%d]", where, i), ps[i].usesV2())
		v.names[ps[i].Name] = true
	}
}

// step checks one step, following which objects exist so that a delete
// of something absent is caught.
func (v *validator) step(where string, st *Step) {
	set := 0
	for _, b := range []bool{st.Probes != nil, st.Apply != nil, st.Delete != nil, st.Hold != nil, st.Check != nil, st.Sleep != nil, st.Session != nil, st.Await != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		v.bad("%s: a step holds exactly one of probes, apply, delete, hold, check, sleep, session, await (has %d)", where, set)
		return
	}
	switch {
	case st.Probes != nil:
		v.probes(where+".probes", st.Probes)
	case st.Apply != nil:
		v.apply(where, st.Apply)
	case st.Delete != nil:
		v.delete(where, st.Delete)
	case st.Hold != nil:
		v.hold(where, st.Hold)
	case st.Check != nil:
		if !v.holds[st.Check.Held] {
			v.bad("%s.check: no earlier hold named %q", where, st.Check.Held)
		}
		if st.Check.Alive == nil {
			v.bad("%s.check: alive (true or false) is required", where)
		}
	case st.Session != nil:
		v.session(where, st.Session)
	case st.Await != nil:
		if !v.sessions[st.Await.Session] {
			v.bad("%s.await: no earlier session named %q", where, st.Await.Session)
		}
		for _, err := range checkAwait(st.Await.Expect, st.Await.Within) {
			v.bad("%s.await: %v", where, err)
		}
		v.needV2(where, []string{"await"})
	case st.Sleep != nil:
		if *st.Sleep < 0 || time.Duration(*st.Sleep) > 10*time.Minute {
			v.bad("%s.sleep: %v out of range (0..10m)", where, time.Duration(*st.Sleep))
		}
	}
}

func (v *validator) apply(where string, objs []json.RawMessage) {
	for j, raw := range objs {
		k, err := keyOf(raw)
		if err != nil {
			v.bad("%s.apply[%d]: %v", where, j, err)
			continue
		}
		v.needV3Kind(fmt.Sprintf("%s.apply[%d]", where, j), k)
		v.objs[k] = true
	}
}

func (v *validator) delete(where string, refs []ObjectRef) {
	for j, r := range refs {
		k := r.key()
		if r.Kind == "" || r.Name == "" {
			v.bad("%s.delete[%d]: kind and name are required", where, j)
		} else if !v.objs[k] {
			v.bad("%s.delete[%d]: no %s %s/%s exists at this point", where, j, k.Kind, k.Namespace, k.Name)
		}
		delete(v.objs, k)
	}
}

// hold checks a held connection and parses its destination.
func (v *validator) hold(where string, h *Hold) {
	if h.Name == "" {
		v.bad("%s.hold: name is required", where)
	} else if v.holds[h.Name] {
		v.bad("%s.hold: name %q used twice", where, h.Name)
	}
	v.holds[h.Name] = true
	if !h.From.IP.IsValid() {
		v.bad("%s.hold: from is required", where)
	}
	var err error
	if h.to, err = parseTo(h.To); err != nil {
		v.bad("%s.hold: %v", where, err)
	} else if h.From.IP.IsValid() && h.From.IP.Is4() != h.to.Addr().Is4() {
		v.bad("%s.hold: from %s and to %s are of different families", where, h.From.IP, h.to)
	}
	var v2 []string
	if h.SourcePort != 0 {
		v2 = append(v2, "sourcePort")
	}
	if h.Bulk != nil {
		v2 = append(v2, "bulk")
		v.bulk[h.Name] = true
		if h.Bulk.Rate > 100<<20 {
			v.bad("%s.hold.bulk.rate %s: at most 100MiB (per second)", where, h.Bulk.Rate)
		}
	}
	v.needV2(where+".hold", v2)
}

func (v *validator) session(where string, s *Session) {
	if v.sessions[s.Name] {
		v.bad("%s.session: name %q used twice", where, s.Name)
	}
	v.sessions[s.Name] = true
	for _, err := range s.validate() {
		v.bad("%s.session %q: %v", where, s.Name, err)
	}
	v.needV2(where, []string{"session"})
}

// needV2 refuses version 2 fields in a file that does not say version: 2,
// so a scenario's meaning never depends on which runner reads it.
func (v *validator) needV2(where string, fields []string) {
	if len(fields) > 0 && v.s.Version < Version2 {
		v.bad("%s: %s need version: 2", where, strings.Join(fields, ", "))
	}
}

// needV3Kind refuses a ServiceCIDR object in a file before version 3.
func (v *validator) needV3Kind(where string, k objKey) {
	if k.Kind == "ServiceCIDR" && v.s.Version < Version3 {
		v.bad("%s: kind ServiceCIDR needs version: 3", where)
	}
}

func (v *validator) overrides() {
	for m, ovs := range v.s.Overrides {
		if canonicalMode(m) == "" {
			v.bad("overrides: unknown mode %q", m)
		}
		for i, o := range ovs {
			switch {
			case o.Probe == "":
				v.bad("overrides.%s[%d]: probe is required", m, i)
			case !v.names[o.Probe]:
				v.bad("overrides.%s[%d]: no probe named %q", m, i, o.Probe)
			}
			if o.Expect.IsZero() {
				v.bad("overrides.%s[%d]: expect is required", m, i)
			}
			if strings.TrimSpace(o.Why) == "" {
				v.bad("overrides.%s[%d]: why is required (say why the mode knowingly differs)", m, i)
			}
		}
	}
}

func (p *Probe) validate() error {
	var errs []error
	if p.Name == "" {
		errs = append(errs, errors.New("name is required"))
	}
	if !p.From.IP.IsValid() {
		errs = append(errs, errors.New("from is required"))
	}
	var err error
	if p.to, err = parseTo(p.To); err != nil {
		errs = append(errs, err)
	} else if p.From.IP.IsValid() && p.From.IP.Is4() != p.to.Addr().Is4() {
		errs = append(errs, fmt.Errorf("from %s and to %s are of different families", p.From.IP, p.to))
	}
	switch p.proto = strings.ToUpper(strings.TrimSpace(p.Protocol)); p.proto {
	case "":
		p.proto = "TCP"
	case "TCP", "UDP", "SCTP":
	default:
		errs = append(errs, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", p.Protocol))
	}
	if p.Expect.IsZero() {
		errs = append(errs, errors.New("expect is required"))
	}
	if p.Tries < 0 || p.Tries > 1000 {
		errs = append(errs, fmt.Errorf("tries %d out of range (1..1000)", p.Tries))
	}
	if p.Timeout < 0 || time.Duration(p.Timeout) > time.Minute {
		errs = append(errs, fmt.Errorf("timeout %v out of range", time.Duration(p.Timeout)))
	}
	errs = append(errs, p.validateV2()...)
	return errors.Join(errs...)
}

func (p *Probe) tries() int {
	if p.Tries > 0 {
		return p.Tries
	}
	return DefaultTries
}

func (p *Probe) timeout() time.Duration {
	switch {
	case p.Timeout > 0:
		return time.Duration(p.Timeout)
	case p.proto == "SCTP":
		return DefaultSCTPTimeout
	}
	return DefaultTimeout
}

func parseTo(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, errors.New("to is required")
	}
	ap, err := netip.ParseAddrPort(strings.TrimSpace(s))
	if err != nil {
		return ap, fmt.Errorf("to %q: want ip:port ([v6]:port): %w", s, err)
	}
	if ap.Port() == 0 {
		return ap, fmt.Errorf("to %q: port 0", s)
	}
	return unmapAP(ap), nil
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func parseAddrOrPrefix(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, err
		}
		return p.Addr().Unmap(), nil
	}
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err
}

func parsePrefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
