package controller

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/xvs-lb/xvs/model"
)

// parseService extracts the per-Service settings, or returns nil when the
// Service is not programmed. Bad fields are reported and, where possible,
// the rest of the Service still works.
func (e *env) parseService(svc *Service) (*svcInfo, []Problem) {
	var probs []Problem
	var report reportFunc = func(format string, args ...any) {
		probs = append(probs, serviceProblem(svc, fmt.Sprintf(format, args...)))
	}
	info := &svcInfo{namespace: svc.Namespace, name: svc.Name}

	if !info.parseClusterIPs(svc, report) {
		return nil, probs
	}
	info.parseExternalAddrs(svc, e.refusedExternalIP, report)

	var reason string
	if info.affinity, reason = affinity(svc); reason != "" {
		report("%s", reason)
	}
	info.scheduler = e.cfg.Scheduler
	if s, ok := svc.Annotations[AnnotationScheduler]; ok {
		if KnownScheduler(s) {
			info.scheduler = s
		} else {
			report("annotation %s: unknown scheduler %s: using %q", AnnotationScheduler, quoteInput(s), e.cfg.Scheduler)
		}
	}
	if w, ok := svc.Annotations[AnnotationWeights]; ok {
		var reasons []string
		info.weights, reasons = parseWeights(w)
		info.podWeights = make(map[PodName]uint16, len(info.weights))
		for k, w := range info.weights {
			info.podWeights[PodNameOf(k)] = w
		}
		for _, r := range reasons {
			report("annotation %s: %s", AnnotationWeights, r)
		}
	}
	info.internalLocal, info.externalLocal = policies(svc)
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && info.externalLocal {
		// kube-proxy's NeedsHealthCheck: only LoadBalancer Services with
		// eTP=Local get a health check server.
		switch hc := svc.Spec.HealthCheckNodePort; {
		case hc == 0:
			report("externalTrafficPolicy Local without healthCheckNodePort: no health check served")
		case hc < 0 || hc > 65535:
			report("healthCheckNodePort %d out of range: no health check served", hc)
		default:
			info.healthCheckNodePort = uint16(hc)
		}
	}
	return info, probs
}

// reportFunc records a Problem about the Service being parsed.
type reportFunc func(format string, args ...any)

// parseClusterIPs fills families and clusterIP. It returns false when the
// Service is not programmed: headless (not a mistake, so not reported) or
// without a usable ClusterIP (reported: the API server always sets one).
func (info *svcInfo) parseClusterIPs(svc *Service, report reportFunc) bool {
	// spec.clusterIPs is authoritative; hand-written manifests often only
	// set the older spec.clusterIP.
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) > 0 && ips[0] == v1.ClusterIPNone {
		return false
	}
	for _, s := range ips {
		a, err := parseAddr(s)
		if err != nil {
			report("clusterIP: %v: Service not programmed", err)
			return false
		}
		f := familyIndex(a)
		if info.clusterIP[f].IsValid() {
			report("clusterIPs: second address of the same family %s ignored", a)
			continue
		}
		info.clusterIP[f] = a
		info.families = append(info.families, f)
	}
	if len(info.families) == 0 {
		report("no clusterIP: Service not programmed")
		return false
	}
	return true
}

// refusedExternalIP says why an externalIP is not served ("" when it is):
// inside a service CIDR, unless the configuration allows it.
func (e *env) refusedExternalIP(a netip.Addr) string {
	if e.cfg.AllowExternalIPsInServiceCIDRs {
		return ""
	}
	for _, p := range e.serviceCIDRs {
		if p.Contains(a) {
			return fmt.Sprintf("inside the service CIDR %s, where the API server allocates ClusterIPs: not served "+
				"(the agent's --allow-external-ips-in-service-cidrs serves it)", p)
		}
	}
	return ""
}

// parseExternalAddrs fills externalIPs, lbIPs and sourceRanges. Addresses
// of a family the Service has no ClusterIP in are later ignored silently,
// as kube-proxy does: that is normal while a Service changes families.
// An externalIP refused says why it is not served.
func (info *svcInfo) parseExternalAddrs(svc *Service, refused func(netip.Addr) string, report reportFunc) {
	for _, s := range svc.Spec.ExternalIPs {
		a, err := parseAddr(s)
		if err != nil {
			report("externalIPs: %v: ignored", err)
			continue
		}
		if why := refused(a); why != "" {
			report("externalIPs: %s is %s", a, why)
			continue
		}
		info.externalIPs[familyIndex(a)] = append(info.externalIPs[familyIndex(a)], a)
	}
	for _, ing := range svc.LoadBalancer {
		// ipMode Proxy: the load balancer delivers to the node with its own
		// address as destination, so capturing the IP would short-circuit
		// the LB's proxying (KEP-1860). Unset means VIP.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		if a, err := parseAddr(ing.IP); err != nil {
			report("status.loadBalancer.ingress: %v: ignored", err)
		} else {
			info.lbIPs[familyIndex(a)] = append(info.lbIPs[familyIndex(a)], a)
		}
	}
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := trimmedPrefix(s)
		if err != nil {
			report("loadBalancerSourceRanges: %s is not a CIDR: LoadBalancer IPs not served", quoteInput(s))
			info.lbWithheld = true
			continue
		}
		info.sourceRanges = append(info.sourceRanges, p)
	}
}

// policies returns (internalTrafficPolicy Local, externalTrafficPolicy
// Local) as kube-proxy's apiservice helpers read them: eTP only counts for
// Services that accept external traffic (NodePort, LoadBalancer, or with
// externalIPs); a ClusterIP-only Service ignores it.
func policies(svc *Service) (internal, external bool) {
	internal = svc.Spec.InternalTrafficPolicy != nil &&
		*svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	externallyTyped := svc.Spec.Type == v1.ServiceTypeNodePort ||
		svc.Spec.Type == v1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
	external = externallyTyped && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	return internal, external
}

// affinity reads sessionAffinity ClientIP; the timeout defaults to 10800 s
// (v1.DefaultClientIPServiceAffinitySeconds) when unset, as the API server
// would default it. An out-of-range timeout is reported and defaulted.
func affinity(svc *Service) (model.Affinity, string) {
	switch svc.Spec.SessionAffinity {
	case "", v1.ServiceAffinityNone:
		return model.Affinity{}, ""
	case v1.ServiceAffinityClientIP:
	default:
		return model.Affinity{}, fmt.Sprintf("unknown sessionAffinity %s: no affinity", quoteInput(string(svc.Spec.SessionAffinity)))
	}
	a := model.Affinity{ClientIP: true, TimeoutSeconds: defaultAffinityTimeout}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		t := *c.ClientIP.TimeoutSeconds
		if t < 1 || t > maxAffinityTimeout {
			return a, fmt.Sprintf("sessionAffinityConfig timeoutSeconds %d outside 1..%d: using %d", t, maxAffinityTimeout, defaultAffinityTimeout)
		}
		a.TimeoutSeconds = uint32(t)
	}
	return a, ""
}

// parseWeights reads the xvs.io/weights annotation; bad entries are
// reported and skipped (their endpoints weigh 1).
func parseWeights(s string) (map[string]uint16, []string) {
	out := map[string]uint16{}
	var reasons []string
	bad := 0
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		w, err := strconv.ParseUint(v, 10, 16)
		if !ok || k == "" || err != nil || w == 0 {
			// The first few are named; a flood of them is counted.
			if bad++; bad <= 3 {
				reasons = append(reasons, fmt.Sprintf("%s is not key=weight with weight 1..65535: skipped", quoteInput(item)))
			}
			continue
		}
		out[k] = uint16(w)
	}
	if bad > 3 {
		reasons = append(reasons, fmt.Sprintf("%d more entries are not key=weight: skipped", bad-3))
	}
	return out, reasons
}

// weigh applies the weights to endpoints by address or pod name.
func (info *svcInfo) weigh(eps []endpoint) {
	if len(info.weights) == 0 {
		return
	}
	for i := range eps {
		if w, ok := info.weights[eps[i].Addr.String()]; ok {
			eps[i].Weight = w
		} else if w, ok := info.podWeights[eps[i].target]; ok && eps[i].target != 0 {
			eps[i].Weight = w
		}
	}
}
