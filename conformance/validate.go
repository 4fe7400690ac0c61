package conformance

import (
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

// SectionsOf extracts the SEMANTICS.md section numbers a description names.
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

// validate checks everything the format requires and fills the parsed
// fields. It reports every problem, not only the first.
func (s *Scenario) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if s.Name == "" {
		bad("name: required")
	} else if !kebab.MatchString(s.Name) {
		bad("name %q: want kebab-case", s.Name)
	}
	s.Sections = SectionsOf(s.Description)
	if s.Node.Name == "" {
		bad("node.name: required")
	}
	if len(s.Node.Addresses) == 0 {
		bad("node.addresses: at least one address is required")
	}
	for _, a := range s.Node.Addresses {
		ip, err := parseAddrOrPrefix(a)
		if err != nil {
			bad("node.addresses: %v", err)
			continue
		}
		s.nodeAddrs = append(s.nodeAddrs, ip)
	}
	var err error
	if s.podCIDRs, err = parsePrefixes(s.Cluster.PodCIDRs); err != nil {
		bad("cluster.podCIDRs: %v", err)
	}
	if s.serviceCIDRs, err = parsePrefixes(s.Cluster.ServiceCIDRs); err != nil {
		bad("cluster.serviceCIDRs: %v", err)
	}
	if s.Proxy.ClusterCIDR != nil && strings.TrimSpace(*s.Proxy.ClusterCIDR) != "" {
		if _, err := parsePrefixes(strings.Split(*s.Proxy.ClusterCIDR, ",")); err != nil {
			bad("proxy.clusterCIDR: %v", err)
		}
	}
	switch s.Proxy.DetectLocalMode {
	case "", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
	default:
		bad("proxy.detectLocalMode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", s.Proxy.DetectLocalMode)
	}
	for _, m := range s.Modes {
		if canonicalMode(m) == "" {
			bad("modes: unknown mode %q (bpf, ebpf or ipvs)", m)
		}
	}

	objs := map[objKey]bool{}
	for i, raw := range s.Objects {
		k, err := keyOf(raw)
		if err != nil {
			bad("objects[%d]: %v", i, err)
			continue
		}
		objs[k] = true
	}

	if len(s.Probes) > 0 && len(s.Steps) > 0 {
		bad("probes and steps: use one or the other (steps replace top-level probes)")
	}
	names := map[string]bool{}
	nprobes := 0
	checkProbes := func(where string, ps []Probe) {
		for i := range ps {
			nprobes++
			if err := ps[i].validate(); err != nil {
				bad("%s[%d] %q: %v", where, i, ps[i].Name, err)
			}
			names[ps[i].Name] = true
		}
	}
	checkProbes("probes", s.Probes)
	holds := map[string]bool{}
	for i := range s.Steps {
		st := &s.Steps[i]
		where := fmt.Sprintf("steps[%d]", i)
		set := 0
		for _, b := range []bool{st.Probes != nil, st.Apply != nil, st.Delete != nil, st.Hold != nil, st.Check != nil, st.Sleep != nil} {
			if b {
				set++
			}
		}
		if set != 1 {
			bad("%s: a step holds exactly one of probes, apply, delete, hold, check, sleep (has %d)", where, set)
			continue
		}
		switch {
		case st.Probes != nil:
			checkProbes(where+".probes", st.Probes)
		case st.Apply != nil:
			for j, raw := range st.Apply {
				k, err := keyOf(raw)
				if err != nil {
					bad("%s.apply[%d]: %v", where, j, err)
					continue
				}
				objs[k] = true
			}
		case st.Delete != nil:
			for j, r := range st.Delete {
				k := r.key()
				if r.Kind == "" || r.Name == "" {
					bad("%s.delete[%d]: kind and name are required", where, j)
				} else if !objs[k] {
					bad("%s.delete[%d]: no %s %s/%s exists at this point", where, j, k.Kind, k.Namespace, k.Name)
				}
				delete(objs, k)
			}
		case st.Hold != nil:
			h := st.Hold
			if h.Name == "" {
				bad("%s.hold: name is required", where)
			} else if holds[h.Name] {
				bad("%s.hold: name %q used twice", where, h.Name)
			}
			holds[h.Name] = true
			if !h.From.IP.IsValid() {
				bad("%s.hold: from is required", where)
			}
			if h.to, err = parseTo(h.To); err != nil {
				bad("%s.hold: %v", where, err)
			} else if h.From.IP.IsValid() && h.From.IP.Is4() != h.to.Addr().Is4() {
				bad("%s.hold: from %s and to %s are of different families", where, h.From.IP, h.to)
			}
		case st.Check != nil:
			if !holds[st.Check.Held] {
				bad("%s.check: no earlier hold named %q", where, st.Check.Held)
			}
			if st.Check.Alive == nil {
				bad("%s.check: alive (true or false) is required", where)
			}
		case st.Sleep != nil:
			if *st.Sleep < 0 || time.Duration(*st.Sleep) > 10*time.Minute {
				bad("%s.sleep: %v out of range (0..10m)", where, time.Duration(*st.Sleep))
			}
		}
	}
	if nprobes == 0 && len(holds) == 0 {
		bad("no probes: a scenario must probe something")
	}
	for m, ovs := range s.Overrides {
		if canonicalMode(m) == "" {
			bad("overrides: unknown mode %q", m)
		}
		for i, o := range ovs {
			switch {
			case o.Probe == "":
				bad("overrides.%s[%d]: probe is required", m, i)
			case !names[o.Probe]:
				bad("overrides.%s[%d]: no probe named %q", m, i, o.Probe)
			}
			if o.Expect.IsZero() {
				bad("overrides.%s[%d]: expect is required", m, i)
			}
			if strings.TrimSpace(o.Why) == "" {
				bad("overrides.%s[%d]: why is required (say why the mode knowingly differs)", m, i)
			}
		}
	}
	return errors.Join(errs...)
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
	return errors.Join(errs...)
}

func (p *Probe) tries() int {
	if p.Tries > 0 {
		return p.Tries
	}
	return DefaultTries
}

func (p *Probe) timeout() time.Duration {
	if p.Timeout > 0 {
		return time.Duration(p.Timeout)
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
