package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xvs-lb/xvs/lab"
)

// The agent's own endpoints (SEMANTICS 3.20, 3.21) are checked after every
// scenario, in every mode, from the node's namespace, where kube-proxy's
// defaults put them: healthzBindAddress 0.0.0.0:10256 (/healthz, /livez)
// and metricsBindAddress 127.0.0.1:10249 (/metrics, /proxyMode). FORMAT v1
// has no HTTP probe, so the expectations come from the scenario's objects
// as they stand at the end (the Node's eligibility, the Services with a
// Local policy and no local endpoint), computed here on their own rather
// than by the agent's code, and each check is one more result line.
const (
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
	// toBeDeletedTaint is the Cluster Autoscaler's taint (KEP-3836).
	toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"
	// Check names, as they appear in result lines.
	checkLivez    = "agent /livez"
	checkHealthz  = "agent /healthz"
	checkMode     = "agent /proxyMode"
	checkSync     = "agent /metrics sync"
	checkNoLocal  = "agent /metrics no_local_endpoints"
	httpTimeout   = 3 * time.Second
	httpRetryWait = 3 * time.Second // a server not listening yet is retried this long
)

// agentChecks runs the checks and reports one line each. The agent
// updates its metrics just after the datapath write the sentinel sees, so
// a check that does not match yet is asked again for up to settleTime;
// the line shows the last answer.
func (r *scenarioRun) agentChecks() {
	w := r.w
	exp := expectAgent(w.objs, w.sc)
	get := func(addr, path string) (int, []byte, error) { return nsGet(w.node.NS, "http://"+addr+path) }

	r.agentReport(checkLivez, "200", func() (string, bool) {
		code, body, err := get(healthzAddr, "/livez")
		return httpObserved(code, body, err, false), err == nil && code == http.StatusOK
	})

	want := "200 nodeEligible=true"
	if !exp.eligible {
		want = "503 nodeEligible=false"
	}
	r.agentReport(checkHealthz, want+" ("+exp.why+")", func() (string, bool) {
		code, body, err := get(healthzAddr, "/healthz")
		return judgeHealthz(code, body, err, exp.eligible)
	})

	r.agentReport(checkMode, "200 "+r.opts.Mode, func() (string, bool) {
		code, body, err := get(metricsAddr, "/proxyMode")
		return httpObserved(code, body, err, true), err == nil && code == http.StatusOK && strings.TrimSpace(string(body)) == r.opts.Mode
	})

	metrics := func(judge func(m metricsText) (string, bool)) func() (string, bool) {
		return func() (string, bool) {
			code, body, err := get(metricsAddr, "/metrics")
			if err != nil || code != http.StatusOK {
				return httpObserved(code, body, err, false), false
			}
			return judge(parseMetrics(body))
		}
	}
	r.agentReport(checkSync, "last_timestamp>0 duration_count>0", metrics(func(m metricsText) (string, bool) {
		ts := m.max("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
		n := m.max("kubeproxy_sync_proxy_rules_duration_seconds_count")
		return fmt.Sprintf("last_timestamp=%s duration_count=%s", fmtMetric(ts), fmtMetric(n)), ts > 0 && n > 0
	}))
	r.agentReport(checkNoLocal, exp.noLocal.String(), metrics(func(m metricsText) (string, bool) {
		got := noLocalCounts{}
		for _, s := range m.series("kubeproxy_sync_proxy_rules_no_local_endpoints_total") {
			if s.value != 0 {
				got[[2]string{s.labels["traffic_policy"], s.labels["ip_family"]}] = int(s.value)
			}
		}
		return got.String(), got.String() == exp.noLocal.String()
	}))
}

// settleTime bounds how long a check that does not match is asked again.
const settleTime = 2 * time.Second

// settle runs check until it passes or settleTime has passed.
func settle(check func() (string, bool)) (string, bool) {
	deadline := time.Now().Add(settleTime)
	for {
		obs, pass := check()
		if pass || time.Now().After(deadline) {
			return obs, pass
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentReport settles one check and reports its line, marked as an agent
// check.
func (r *scenarioRun) agentReport(name, expected string, check func() (string, bool)) {
	observed, pass := settle(check)
	r.report(0, name, expected, observed, "", pass)
	r.res.Probes[len(r.res.Probes)-1].Agent = true
}

// httpObserved describes an answer: the status code and, with body, the
// body's first line.
func httpObserved(code int, body []byte, err error, withBody bool) string {
	if err != nil {
		return "ERROR: " + oneLine(err.Error())
	}
	if withBody {
		return fmt.Sprintf("%d %s", code, oneLine(string(body)))
	}
	return strconv.Itoa(code)
}

// judgeHealthz checks kube-proxy's /healthz answer: the status code, and a
// JSON body with lastUpdated (what the e2e "should check kube-proxy urls"
// looks for) and nodeEligible matching the Node.
func judgeHealthz(code int, body []byte, err error, eligible bool) (string, bool) {
	if err != nil {
		return "ERROR: " + oneLine(err.Error()), false
	}
	var b map[string]json.RawMessage
	if jerr := json.Unmarshal(body, &b); jerr != nil {
		return fmt.Sprintf("%d body not JSON: %s", code, oneLine(string(body))), false
	}
	var ne *bool
	if raw, ok := b["nodeEligible"]; ok {
		json.Unmarshal(raw, &ne)
	}
	obs := strconv.Itoa(code)
	if ne != nil {
		obs += " nodeEligible=" + strconv.FormatBool(*ne)
	} else {
		obs += " (no nodeEligible)"
	}
	_, hasLast := b["lastUpdated"]
	if !hasLast {
		obs += " (no lastUpdated)"
	}
	wantCode := http.StatusOK
	if !eligible {
		wantCode = http.StatusServiceUnavailable
	}
	return obs, code == wantCode && hasLast && ne != nil && *ne == eligible
}

// nsGet makes one HTTP GET from inside ns. A refused connection is retried
// for a moment: the agent's servers may start just after its first sync.
func nsGet(ns *lab.NS, url string) (int, []byte, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: httpTimeout}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: httpTimeout}
	deadline := time.Now().Add(httpRetryWait)
	for {
		resp, err := client.Get(url)
		if err == nil {
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			resp.Body.Close()
			return resp.StatusCode, body, rerr
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			return 0, nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentExpect is what the agent's endpoints must say about the objects.
type agentExpect struct {
	eligible bool
	why      string // what decided eligibility
	noLocal  noLocalCounts
}

// noLocalCounts is kubeproxy_sync_proxy_rules_no_local_endpoints_total by
// (traffic_policy, ip_family); absent means 0.
type noLocalCounts map[[2]string]int

func (c noLocalCounts) String() string {
	var parts []string
	for k, v := range c {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s/%s=%d", k[0], k[1], v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// expectAgent derives the expectations from the objects that exist (and
// the Node the runner supplies when they hold none).
func expectAgent(objs *objectSet, sc *Scenario) agentExpect {
	exp := agentExpect{eligible: true, why: "Node supplied by the runner", noLocal: noLocalCounts{}}
	if raw, ok := objs.raw[objKey{"Node", "", sc.Node.Name}]; ok {
		var n v1.Node
		exp.why = "Node without deletionTimestamp or the autoscaler's taint"
		if json.Unmarshal(raw, &n) != nil {
			exp.why = "Node does not decode"
		}
		if n.DeletionTimestamp != nil {
			exp.eligible, exp.why = false, "Node has a deletionTimestamp"
		}
		for _, t := range n.Spec.Taints {
			if t.Key == toBeDeletedTaint {
				exp.eligible, exp.why = false, "Node has the "+toBeDeletedTaint+" taint"
			}
		}
	}
	slicesBySvc := map[[2]string][]*discoveryv1.EndpointSlice{}
	for _, sl := range objs.slices() {
		name := sl.Labels[discoveryv1.LabelServiceName]
		k := [2]string{sl.Namespace, name}
		slicesBySvc[k] = append(slicesBySvc[k], sl)
	}
	for _, svc := range objs.services() {
		countNoLocal(exp.noLocal, svc, slicesBySvc[[2]string{svc.Namespace, svc.Name}], sc.Node.Name)
	}
	return exp
}

// countNoLocal adds the ports of svc that kube-proxy counts in
// no_local_endpoints_total, per IP family as its per-family proxiers do:
// a port whose policy (internal, or external on an externally reachable
// port) is Local, that has usable endpoints of the family somewhere
// (Ready, or serving and terminating: SEMANTICS 3.10), and none of them on
// this node. A port without usable endpoints at all is not counted (it is
// rejected, SEMANTICS 3.12).
func countNoLocal(c noLocalCounts, svc *v1.Service, sls []*discoveryv1.EndpointSlice, node string) {
	if !programmed(svc) {
		return
	}
	iLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	eLocal := svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	if !iLocal && !eLocal {
		return
	}
	for _, fam := range serviceFamilies(svc) {
		external := false
		for _, a := range svc.Spec.ExternalIPs {
			external = external || familyOf(a) == fam
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			proxy := in.IPMode != nil && *in.IPMode == v1.LoadBalancerIPModeProxy
			external = external || (!proxy && familyOf(in.IP) == fam)
		}
		for _, p := range svc.Spec.Ports {
			has, local := portEndpoints(sls, p, fam, node)
			if !has || local {
				continue
			}
			if iLocal {
				c[[2]string{"internal", fam}]++
			}
			if eLocal && (external || p.NodePort != 0) {
				c[[2]string{"external", fam}]++
			}
		}
	}
}

// programmed applies SEMANTICS 3.1 (the runner never sets a
// serviceProxyName, so a Service with the label is another proxy's).
func programmed(svc *v1.Service) bool {
	if svc.Spec.Type == v1.ServiceTypeExternalName || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return false
	}
	if _, ok := svc.Labels["service.kubernetes.io/headless"]; ok {
		return false
	}
	_, other := svc.Labels["service.kubernetes.io/service-proxy-name"]
	return !other
}

// serviceFamilies lists the families of the Service's ClusterIPs.
func serviceFamilies(svc *v1.Service) []string {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []string
	for _, ip := range ips {
		if f := familyOf(ip); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

func familyOf(ip string) string {
	a, err := netip.ParseAddr(strings.TrimSpace(ip))
	switch {
	case err != nil:
		return ""
	case a.Unmap().Is4():
		return "IPv4"
	}
	return "IPv6"
}

// portEndpoints reports whether the Service port p has usable endpoints of
// family fam, and whether one of them is on node. Slices match the port by
// name and protocol; conditions default as the API says (ready unset is
// ready, serving unset is ready, terminating unset is false).
func portEndpoints(sls []*discoveryv1.EndpointSlice, p v1.ServicePort, fam, node string) (has, local bool) {
	proto := p.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	for _, sl := range sls {
		if string(sl.AddressType) != fam {
			continue
		}
		matches := false
		for _, sp := range sl.Ports {
			name, sproto := "", v1.ProtocolTCP
			if sp.Name != nil {
				name = *sp.Name
			}
			if sp.Protocol != nil && *sp.Protocol != "" {
				sproto = *sp.Protocol
			}
			matches = matches || (name == p.Name && sproto == proto && sp.Port != nil)
		}
		if !matches {
			continue
		}
		for _, ep := range sl.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ready
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			if len(ep.Addresses) == 0 || !(ready || serving && terminating) {
				continue
			}
			has = true
			local = local || (ep.NodeName != nil && *ep.NodeName == node)
		}
	}
	return has, local
}

// metricSeries is one sample line of the Prometheus text format.
type metricSeries struct {
	name   string
	labels map[string]string
	value  float64
}

type metricsText []metricSeries

// parseMetrics reads the sample lines of the text exposition format
// (comments skipped; label values without escaped quotes or commas, as
// the series checked here have).
func parseMetrics(b []byte) metricsText {
	var out metricsText
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s := metricSeries{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i > 0 && line[i] == '{' {
			j := strings.IndexByte(line, '}')
			if j < i {
				continue
			}
			s.name = line[:i]
			for _, kv := range strings.Split(line[i+1:j], ",") {
				k, v, ok := strings.Cut(kv, "=")
				if ok {
					s.labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
				}
			}
			rest = line[j+1:]
		} else if i > 0 {
			s.name, rest = line[:i], line[i:]
		} else {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

func (m metricsText) series(name string) []metricSeries {
	var out []metricSeries
	for _, s := range m {
		if s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// max is the largest value of name's series; -1 when there is none.
func (m metricsText) max(name string) float64 {
	v := -1.0
	for _, s := range m.series(name) {
		v = max(v, s.value)
	}
	return v
}

func fmtMetric(v float64) string {
	if v < 0 {
		return "absent"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
