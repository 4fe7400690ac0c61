// Package conformance runs scenario files (../shared/conformance/FORMAT.md,
// copied in docs/CONFORMANCE.md) against a datapath with real traffic in
// network namespaces, and reports pass and fail per probe.
//
// The format is the contract: the runner accepts any directory of such
// files, not only our corpus. Fields the format does not define are
// refused (a typo such as "expcet" must not silently weaken a scenario),
// and a file that does not follow the format is reported as a failed
// scenario with its path and the reason, while the rest still run.
package conformance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Scenario is one file: one node's view of a cluster, the Kubernetes
// objects that exist, and probes with the outcome the semantics require.
type Scenario struct {
	Name        string                `json:"name"`
	Description string                `json:"description"`
	Node        NodeSpec              `json:"node"`
	Cluster     ClusterSpec           `json:"cluster"`
	Proxy       ProxySpec             `json:"proxy"`
	Modes       []string              `json:"modes"`
	Objects     []json.RawMessage     `json:"objects"`
	Probes      []Probe               `json:"probes"`
	Overrides   map[string][]Override `json:"overrides"`
	Steps       []Step                `json:"steps"`

	// File is the path the scenario was read from.
	File string `json:"-"`
	// Sections are the SEMANTICS.md sections the description names
	// ("SEMANTICS 3.4, 3.8: ..."), in order of appearance.
	Sections []string `json:"-"`

	// Parsed forms, filled by validate.
	nodeAddrs    []netip.Addr
	podCIDRs     []netip.Prefix
	serviceCIDRs []netip.Prefix
}

// NodeSpec is the node under test.
type NodeSpec struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"` // "192.168.0.2/24" or "192.168.0.2"; first = primary
}

// ClusterSpec holds the cluster-wide ranges.
type ClusterSpec struct {
	PodCIDRs     []string `json:"podCIDRs"`
	ServiceCIDRs []string `json:"serviceCIDRs"`
}

// ProxySpec holds KubeProxyConfiguration fields, flat, with kube-proxy's
// names. Unset means kube-proxy's default, except ClusterCIDR, which
// defaults to cluster.podCIDRs (nil) and means "no local-traffic detector"
// when set to "".
type ProxySpec struct {
	NodePortAddresses []string `json:"nodePortAddresses"`
	ClusterCIDR       *string  `json:"clusterCIDR"`
	DetectLocalMode   string   `json:"detectLocalMode"`
	MasqueradeAll     *bool    `json:"masqueradeAll"`
	Scheduler         string   `json:"scheduler"`
}

// Probe is a set of real connections (tries) with the required outcome.
type Probe struct {
	Name       string   `json:"name"`
	From       From     `json:"from"`
	To         string   `json:"to"`
	Protocol   string   `json:"protocol"`
	Expect     Expect   `json:"expect"`
	Masquerade *bool    `json:"masquerade"`
	Tries      int      `json:"tries"`
	Timeout    Duration `json:"timeout"` // FORMAT's "probe timeout (default 1s)"

	to    netip.AddrPort
	proto string
}

// Override replaces a probe's expectation in one mode, with the reason.
type Override struct {
	Probe  string `json:"probe"`
	Expect Expect `json:"expect"`
	Why    string `json:"why"`
}

// Step is one action of a sequence; exactly one field is set.
type Step struct {
	Probes []Probe           `json:"probes"`
	Apply  []json.RawMessage `json:"apply"`
	Delete []ObjectRef       `json:"delete"`
	Hold   *Hold             `json:"hold"`
	Check  *Check            `json:"check"`
	Sleep  *Duration         `json:"sleep"`
}

// ObjectRef names an object to delete.
type ObjectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
}

// Hold opens a TCP connection and keeps it for later checks.
type Hold struct {
	Name string `json:"name"`
	From From   `json:"from"`
	To   string `json:"to"`

	to netip.AddrPort
}

// Check asserts that a held connection still exchanges data (or not).
type Check struct {
	Held  string `json:"held"`
	Alive *bool  `json:"alive"`
}

// Role is where a client sits.
type Role string

const (
	RoleAuto      Role = ""           // inferred from the address (FORMAT "Roles of from")
	RoleHost      Role = "host"       // a process on the node
	RolePod       Role = "pod"        // a pod on this node
	RoleRemotePod Role = "remote-pod" // a pod on another node, behind the fabric
	RoleExternal  Role = "external"   // outside the cluster, behind the external interface
)

// From is a probe's source: an address, or {ip, role}.
type From struct {
	IP   netip.Addr
	Role Role
}

func (f *From) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("from: %w", err)
		}
		*f = From{IP: a.Unmap()}
		return nil
	}
	var o struct {
		IP   string `json:"ip"`
		Role string `json:"role"`
	}
	if err := strictJSON(b, &o); err != nil {
		return fmt.Errorf("from: want an address or {ip, role}: %w", err)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(o.IP))
	if err != nil {
		return fmt.Errorf("from.ip: %w", err)
	}
	r := Role(o.Role)
	switch r {
	case RoleHost, RolePod, RoleRemotePod, RoleExternal:
	default:
		return fmt.Errorf("from.role %q: want host, pod, remote-pod or external", o.Role)
	}
	*f = From{IP: a.Unmap(), Role: r}
	return nil
}

func (f From) MarshalJSON() ([]byte, error) {
	if f.Role == RoleAuto {
		return json.Marshal(f.IP.String())
	}
	return json.Marshal(map[string]string{"ip": f.IP.String(), "role": string(f.Role)})
}

func (f From) String() string {
	if f.Role == RoleAuto {
		return f.IP.String()
	}
	return f.IP.String() + "(" + string(f.Role) + ")"
}

// Outcome kinds of an expectation.
const (
	Reject = "REJECT"
	Drop   = "DROP"
	Pass   = "PASS"
)

// Expect is REJECT, DROP, PASS, or a list of ip:port members.
type Expect struct {
	Verdict string           // Reject, Drop or Pass; "" when Members is set
	Members []netip.AddrPort // sorted, unique
}

func (e *Expect) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		s = strings.TrimSpace(s)
		switch s {
		case Reject, Drop, Pass:
			*e = Expect{Verdict: s}
			return nil
		}
		// One member written as a scalar: unambiguous, so accepted.
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return fmt.Errorf("expect %q: want REJECT, DROP, PASS or a list of ip:port", s)
		}
		*e = Expect{Members: []netip.AddrPort{unmapAP(ap)}}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("expect: want REJECT, DROP, PASS or a list of ip:port")
	}
	if len(list) == 0 {
		return errors.New("expect: empty list (use REJECT or DROP for no backend)")
	}
	var ms []netip.AddrPort
	for _, s := range list {
		ap, err := netip.ParseAddrPort(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("expect member %q: %w", s, err)
		}
		ap = unmapAP(ap)
		if !slices.Contains(ms, ap) {
			ms = append(ms, ap)
		}
	}
	slices.SortFunc(ms, netip.AddrPort.Compare)
	*e = Expect{Members: ms}
	return nil
}

func (e Expect) MarshalJSON() ([]byte, error) { return json.Marshal(e.String()) }

// IsZero reports an absent expectation.
func (e Expect) IsZero() bool { return e.Verdict == "" && len(e.Members) == 0 }

func (e Expect) String() string {
	if e.Verdict != "" {
		return e.Verdict
	}
	parts := make([]string, len(e.Members))
	for i, m := range e.Members {
		parts[i] = m.String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Duration is a Go duration string ("2s", "500ms") or a number of seconds.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration: want \"2s\" or a number of seconds")
	}
	*d = Duration(n * float64(time.Second))
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Defaults from FORMAT.md.
const (
	DefaultTries   = 16
	DefaultTimeout = time.Second
)

// Mode names. FORMAT.md calls the eBPF datapath "bpf"; the CLI says
// "ebpf". Both spellings are accepted in `modes:` and `overrides:`.
const (
	ModeEBPF = "ebpf"
	ModeIPVS = "ipvs"
)

// canonicalMode maps a mode spelling to the CLI's name, or "".
func canonicalMode(m string) string {
	switch strings.ToLower(strings.TrimSpace(m)) {
	case "bpf", "ebpf":
		return ModeEBPF
	case "ipvs":
		return ModeIPVS
	}
	return ""
}

// RunsIn reports whether the scenario applies to mode (default: every mode).
func (s *Scenario) RunsIn(mode string) bool {
	if len(s.Modes) == 0 {
		return true
	}
	for _, m := range s.Modes {
		if canonicalMode(m) == canonicalMode(mode) {
			return true
		}
	}
	return false
}

// ExpectFor returns the probe's expectation in mode and the override's
// reason when one applies.
func (s *Scenario) ExpectFor(mode string, p *Probe) (Expect, string) {
	for m, ovs := range s.Overrides {
		if canonicalMode(m) != canonicalMode(mode) {
			continue
		}
		for _, o := range ovs {
			if o.Probe == p.Name {
				return o.Expect, o.Why
			}
		}
	}
	return p.Expect, ""
}

// MalformedError is a scenario file that does not follow the format.
type MalformedError struct {
	File string
	Err  error
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("%s: malformed scenario: %v", e.File, e.Err)
}
func (e *MalformedError) Unwrap() error { return e.Err }

// LoadDir reads every *.yaml / *.yml file of dir (not subdirectories), in
// name order. Files that do not parse or validate come back as errors
// (*MalformedError), never silently dropped; a name used twice makes the
// later file malformed.
func LoadDir(dir string) ([]*Scenario, []error, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	var out []*Scenario
	var bad []error
	seen := map[string]string{}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		path := filepath.Join(dir, n)
		s, err := LoadFile(path)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if prev, dup := seen[s.Name]; dup {
			bad = append(bad, &MalformedError{File: path, Err: fmt.Errorf("name %q is also used by %s", s.Name, prev)})
			continue
		}
		seen[s.Name] = path
		out = append(out, s)
	}
	return out, bad, nil
}

// LoadFile reads and validates one scenario file.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &MalformedError{File: path, Err: err}
	}
	s, err := Parse(data)
	if err != nil {
		return nil, &MalformedError{File: path, Err: err}
	}
	s.File = path
	return s, nil
}

// Parse decodes and validates one scenario. Unknown and duplicate fields
// are errors.
func Parse(data []byte) (*Scenario, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty file")
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("not a YAML mapping")
	}
	var s Scenario
	// sigs.k8s.io/yaml's strict mode catches duplicate keys; strictJSON
	// catches unknown fields at every level, including inside steps.
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return nil, cleanDecodeError(err)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// cleanDecodeError trims the JSON decoder's Go type names, which mean
// nothing to someone writing YAML.
func cleanDecodeError(err error) error {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: while decoding JSON: ")
	msg = strings.ReplaceAll(msg, "json: ", "")
	return errors.New(msg)
}

func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

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

// objKey identifies an object the way `kubectl apply` matches it.
type objKey struct {
	Kind, Namespace, Name string
}

// supportedKinds are the kinds FORMAT.md allows in objects.
var supportedKinds = map[string]string{
	"Service":       "v1",
	"EndpointSlice": "discovery.k8s.io/v1",
	"Node":          "v1",
}

func keyOf(raw json.RawMessage) (objKey, error) {
	var m struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return objKey{}, fmt.Errorf("not a Kubernetes object: %v", cleanDecodeError(err))
	}
	want, ok := supportedKinds[m.Kind]
	switch {
	case m.Kind == "":
		return objKey{}, errors.New("kind is required")
	case !ok:
		return objKey{}, fmt.Errorf("kind %q: only Service, EndpointSlice and Node", m.Kind)
	case m.APIVersion != want:
		return objKey{}, fmt.Errorf("%s: apiVersion %q, want %s", m.Kind, m.APIVersion, want)
	case m.Metadata.Name == "":
		return objKey{}, fmt.Errorf("%s: metadata.name is required", m.Kind)
	}
	return objKey{m.Kind, namespaceOf(m.Kind, m.Metadata.Namespace), m.Metadata.Name}, nil
}

// namespaceOf applies kubectl's rules: Nodes are cluster-scoped, other
// objects default to "default".
func namespaceOf(kind, ns string) string {
	if kind == "Node" {
		return ""
	}
	if ns == "" {
		return "default"
	}
	return ns
}

func (r ObjectRef) key() objKey { return objKey{r.Kind, namespaceOf(r.Kind, r.Namespace), r.Name} }

// sortedKeys returns m's keys in order, for deterministic output.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
