package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/xvs-lb/xvs/model"
)

// NodePortAddressesPrimary is the kube-proxy nodePortAddresses value meaning
// "the node's primary IP of each family" (also our default, as in nftables).
const NodePortAddressesPrimary = "primary"

// Well-known labels and annotations read by the translation.
const (
	// LabelServiceProxyName selects which proxy handles a Service
	// (kube-proxy's apis.LabelServiceProxyName; not exported by k8s.io/api).
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// AnnotationScheduler overrides Config.Scheduler for one Service.
	AnnotationScheduler = "xvs.io/scheduler"
	// AnnotationWeights sets scheduler weights (wrr, wlc, sed, nq, mh) of
	// a Service's endpoints: comma-separated "key=weight", where key is an
	// endpoint address or the name of its targetRef (the pod); weights are
	// 1..65535, unlisted endpoints weigh 1. Example: "web-0=3,10.0.1.7=2".
	AnnotationWeights = "xvs.io/weights"

	defaultAffinityTimeout = 10800 // seconds; v1.DefaultClientIPServiceAffinitySeconds
	maxAffinityTimeout     = 86400 // seconds; API validation upper bound
)

// KnownScheduler reports whether name is an accepted scheduler
// (model.Schedulers). An unknown name in an annotation is reported and the
// default used instead, so that one bad Service cannot make a datapath
// refuse the whole State.
func KnownScheduler(name string) bool {
	_, ok := model.LookupScheduler(name)
	return ok
}

// Config is the node-wide configuration of the translation; the field names
// follow KubeProxyConfiguration where one exists.
type Config struct {
	// NodeName is this node's name: endpoints whose nodeName equals it are
	// local, and topology hints are matched against it.
	NodeName string
	// NodePortAddresses selects the NodePort addresses among the node
	// addresses: "primary" (the first address of each family) or CIDRs.
	// Empty means "primary", the nftables default.
	NodePortAddresses []string
	// ServiceProxyName: when empty, only Services without the
	// service.kubernetes.io/service-proxy-name label are handled; when set,
	// only those whose label equals it.
	ServiceProxyName string
	// Scheduler is the default scheduler of every Service ("" = random);
	// see KnownScheduler.
	Scheduler string
	// ServiceCIDRs and PodCIDRs are copied into the State.
	ServiceCIDRs []netip.Prefix
	PodCIDRs     []netip.Prefix
	// MasqueradeAll is copied into the State.
	MasqueradeAll bool
	// NodeAddresses, when set, replaces the addresses of the Node object
	// (InternalIPs, then ExternalIPs). Order matters: the first address of
	// each family is the primary one. An agent that wants CIDR
	// nodePortAddresses to cover every local IP (as kube-proxy does) passes
	// all of them here, primary first.
	NodeAddresses []netip.Addr
	// MaxFrontendsPerService caps what one Service may ask for: its
	// frontends (address:port of every port, over ClusterIPs, NodePort
	// addresses, externalIPs and LoadBalancer IPs). A Service over it is
	// refused whole, so that one tenant's Service cannot fill the maps
	// (or IPVS's tables) that every other Service needs. 0: no limit.
	MaxFrontendsPerService int
	// AllowExternalIPsInServiceCIDRs serves externalIPs inside the service
	// CIDRs (ServiceCIDRs and ServiceCIDR objects), which are refused
	// otherwise: the API server allocates ClusterIPs there, so such an
	// externalIP is either a mistake or a claim on another Service's
	// address (CVE-2020-8554).
	AllowExternalIPsInServiceCIDRs bool
}

// DefaultMaxFrontendsPerService is the agent's default
// MaxFrontendsPerService: far above what an application Service asks for
// (10 ports on 2 ClusterIPs, 20 node addresses and 10 LB IPs are 320),
// and 1/16 of the default frontend ID space.
const DefaultMaxFrontendsPerService = 4096

// Validate reports configuration errors that kube-proxy would refuse at
// start-up. The translation itself tolerates them (it reports a Problem and
// ignores the bad entry) so that a State can always be computed.
func (c Config) Validate() error {
	var errs []error
	_, probs := c.nodePortSelector()
	for _, p := range probs {
		errs = append(errs, errors.New(p.Reason))
	}
	if !KnownScheduler(c.Scheduler) {
		errs = append(errs, fmt.Errorf("unknown scheduler %q", c.Scheduler))
	}
	return errors.Join(errs...)
}

// selects applies kube-proxy's informer label selector: no headless label,
// and the service-proxy-name label matching ours. kube-proxy applies it to
// both Services and EndpointSlices (the EndpointSlice controller copies
// Service labels onto slices), so we do too.
func (c *Config) selects(labels map[string]string) bool {
	if _, ok := labels[v1.IsHeadlessService]; ok {
		return false
	}
	name, ok := labels[LabelServiceProxyName]
	if c.ServiceProxyName == "" {
		return !ok
	}
	return ok && name == c.ServiceProxyName
}

// SelectNodePortAddresses returns the NodePort addresses among addrs (the
// node's addresses, primary first), as the translation picks them; bad
// NodePortAddresses entries are ignored (Validate reports them).
func (c Config) SelectNodePortAddresses(addrs []netip.Addr) []netip.Addr {
	sel, _ := c.nodePortSelector()
	return sel.selectNodePortAddrs(addrs)
}

// nodePortSelector is the parsed form of NodePortAddresses.
type nodePortSelector struct {
	primary bool
	cidrs   []netip.Prefix
}

// nodePortSelector parses NodePortAddresses, reporting (and ignoring) bad
// entries.
func (c *Config) nodePortSelector() (nodePortSelector, []Problem) {
	var sel nodePortSelector
	var probs []Problem
	if len(c.NodePortAddresses) == 0 {
		sel.primary = true
		return sel, nil
	}
	for _, s := range c.NodePortAddresses {
		s = strings.TrimSpace(s)
		if s == NodePortAddressesPrimary {
			sel.primary = true
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			probs = append(probs, configProblem("nodePortAddresses: %q is neither %q nor a CIDR", s, NodePortAddressesPrimary))
			continue
		}
		sel.cidrs = append(sel.cidrs, p.Masked())
	}
	if sel.primary && len(c.NodePortAddresses) > 1 {
		// kube-proxy's validation: "primary" must be the only value.
		probs = append(probs, configProblem("nodePortAddresses: %q must be the only value", NodePortAddressesPrimary))
	}
	return sel, probs
}

// selectNodePortAddrs picks the NodePort addresses among the node addresses.
// A family for which no CIDR is listed (and "primary" is not given) matches
// every address of that family: kube-proxy builds one selector per family
// and defaults an empty one to 0.0.0.0/0 or ::/0. Loopback addresses are
// never used (nftables parity, and CVE-2020-8558).
func (sel nodePortSelector) selectNodePortAddrs(addrs []netip.Addr) []netip.Addr {
	var listed [2]bool
	for _, p := range sel.cidrs {
		listed[familyIndex(p.Addr())] = true
	}
	var out []netip.Addr
	var seenPrimary [2]bool
	for _, a := range addrs {
		f := familyIndex(a)
		isPrimary := !seenPrimary[f]
		seenPrimary[f] = true
		if a.IsLoopback() || containsAddr(out, a) {
			continue
		}
		if (sel.primary && isPrimary) || (!sel.primary && !listed[f]) || prefixesContain(sel.cidrs, a) {
			out = append(out, a)
		}
	}
	return out
}

// familyIndex is 0 for IPv4 and 1 for IPv6, the index used by per-family
// arrays throughout the package.
func familyIndex(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 0
	}
	return 1
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, b := range list {
		if a == b {
			return true
		}
	}
	return false
}

func prefixesContain(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
