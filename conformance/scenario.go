// Package conformance runs scenario files (FORMAT.md in this directory, a copy of
// the team's shared contract) against a datapath with real traffic in
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
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/xvs-lb/xvs/model"
)

// Scenario is one file: one node's view of a cluster, the Kubernetes
// objects that exist, and probes with the outcome the semantics require.
type Scenario struct {
	Version     int                   `json:"version"` // 1 (default), 2, 3 or 4
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
	// Closed (version 4) are endpoint address:ports the runner starts no
	// listener on: the endpoint's kernel refuses them (a TCP RST, an ICMP
	// port unreachable for UDP).
	Closed []string `json:"closed"`

	// File is the path the scenario was read from.
	File string `json:"-"`
	// Sections are the docs/semantics.md sections the description names
	// ("SEMANTICS 3.4, 3.8: ..."), in order of appearance.
	Sections []string `json:"-"`

	// Parsed forms, filled by validate.
	nodeAddrs    []netip.Addr
	podCIDRs     []netip.Prefix
	serviceCIDRs []netip.Prefix
	closed       map[netip.AddrPort]bool
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
	Timeout    Duration `json:"timeout"` // FORMAT's "probe timeout" (default 1s, SCTP 3.5s)

	// Version 2 (traffic.go).
	SourcePort uint16    `json:"sourcePort"`
	Transfer   *Transfer `json:"transfer"`
	Stream     *Stream   `json:"stream"`
	Datagram   ByteSize  `json:"datagram"`

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

	// Version 2 (traffic.go).
	Session *Session `json:"session"`
	Await   *Await   `json:"await"`
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

	// Version 2 (traffic.go).
	SourcePort uint16    `json:"sourcePort"`
	Bulk       *HeldBulk `json:"bulk"`

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

// From is a probe's source: an address, or {ip, role, router, mtu}.
type From struct {
	IP   netip.Addr
	Role Role
	// Router and MTU (version 4, external clients): the client sits one
	// router further out, behind a link of this MTU (0: the default),
	// and the router answers packets too big for it with ICMP errors
	// from Router.
	Router netip.Addr
	MTU    int
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
		IP     string `json:"ip"`
		Role   string `json:"role"`
		Router string `json:"router"`
		MTU    int    `json:"mtu"`
	}
	if err := strictJSON(b, &o); err != nil {
		return fmt.Errorf("from: want an address or {ip, role, router, mtu}: %w", err)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(o.IP))
	if err != nil {
		return fmt.Errorf("from.ip: %w", err)
	}
	r := Role(o.Role)
	switch r {
	case RoleAuto:
		if o.Router == "" {
			return errors.New("from: role is required without router")
		}
	case RoleHost, RolePod, RoleRemotePod, RoleExternal:
	default:
		return fmt.Errorf("from.role %q: want host, pod, remote-pod or external", o.Role)
	}
	*f = From{IP: a.Unmap(), Role: r, MTU: o.MTU}
	if o.Router != "" {
		if f.Router, err = netip.ParseAddr(strings.TrimSpace(o.Router)); err != nil {
			return fmt.Errorf("from.router: %w", err)
		}
		f.Router = f.Router.Unmap()
	}
	return nil
}

func (f From) MarshalJSON() ([]byte, error) {
	if f.Role == RoleAuto && !f.Router.IsValid() {
		return json.Marshal(f.IP.String())
	}
	o := map[string]any{"ip": f.IP.String()}
	if f.Role != RoleAuto {
		o["role"] = string(f.Role)
	}
	if f.Router.IsValid() {
		o["router"] = f.Router.String()
	}
	if f.MTU != 0 {
		o["mtu"] = f.MTU
	}
	return json.Marshal(o)
}

func (f From) String() string {
	s := f.IP.String()
	if f.Role != RoleAuto {
		s += "(" + string(f.Role) + ")"
	}
	if f.Router.IsValid() {
		s += fmt.Sprintf(" via %s", f.Router)
		if f.MTU != 0 {
			s += fmt.Sprintf(" mtu %d", f.MTU)
		}
	}
	return s
}

// usesV4 names the version 4 fields of a source.
func (f From) usesV4() []string {
	var out []string
	if f.Router.IsValid() {
		out = append(out, "from.router")
	}
	if f.MTU != 0 {
		out = append(out, "from.mtu")
	}
	return out
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
			return fmt.Errorf("duration %q: want e.g. 2s or 500ms", s)
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
	// DefaultSCTPTimeout is an SCTP probe's: an association's INIT is
	// sent again only after net.sctp.rto_initial (3 s), where a TCP SYN
	// is sent again after 1 s, so one INIT lost to a busy machine (a TCG
	// guest beside another) would fail a try that a second INIT answers.
	DefaultSCTPTimeout = 3500 * time.Millisecond
)

// Mode names. FORMAT.md calls the eBPF datapath "bpf"; the CLI says
// "ebpf". Both spellings are accepted in `modes:` and `overrides:`.
const (
	ModeEBPF = string(model.ModeEBPF)
	ModeIPVS = string(model.ModeIPVS)
)

// canonicalMode maps a mode spelling to the CLI's name, or "".
func canonicalMode(m string) string {
	m = strings.ToLower(strings.TrimSpace(m))
	if m == "bpf" { // FORMAT.md's spelling
		return ModeEBPF
	}
	if mode, ok := model.ParseMode(m); ok {
		return string(mode)
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

// objKey identifies an object the way `kubectl apply` matches it.
type objKey struct {
	Kind, Namespace, Name string
}

// supportedKinds are the kinds FORMAT.md allows in objects (ServiceCIDR
// from version 3 on: the validator checks the version).
var supportedKinds = map[string]string{
	"Service":       "v1",
	"EndpointSlice": "discovery.k8s.io/v1",
	"Node":          "v1",
	"ServiceCIDR":   "networking.k8s.io/v1",
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
		return objKey{}, fmt.Errorf("kind %q: only Service, EndpointSlice, Node and (version 3) ServiceCIDR", m.Kind)
	case m.APIVersion != want:
		return objKey{}, fmt.Errorf("%s: apiVersion %q, want %s", m.Kind, m.APIVersion, want)
	case m.Metadata.Name == "":
		return objKey{}, fmt.Errorf("%s: metadata.name is required", m.Kind)
	}
	return objKey{m.Kind, namespaceOf(m.Kind, m.Metadata.Namespace), m.Metadata.Name}, nil
}

// namespaceOf applies kubectl's rules: Nodes and ServiceCIDRs are
// cluster-scoped, other objects default to "default".
func namespaceOf(kind, ns string) string {
	if kind == "Node" || kind == "ServiceCIDR" {
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
