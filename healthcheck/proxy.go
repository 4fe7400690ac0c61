// Package healthcheck serves kube-proxy's health endpoints: /healthz and
// /livez of the proxy itself (healthzBindAddress), and one server per
// externalTrafficPolicy=Local Service on its healthCheckNodePort, which
// cloud load balancers probe to find the nodes with local endpoints.
// Bodies, headers and status codes are kube-proxy's, so existing probes,
// load balancers and the e2e "should check kube-proxy urls" test work
// unchanged.
package healthcheck

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// ToBeDeletedTaint is the Cluster Autoscaler's taint on a node it is about
// to delete (KEP-3836: /healthz fails so load balancers drain the node).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Counters receives one count per /healthz or /livez answer, by status
// code (kubeproxy_proxy_healthz_total, kubeproxy_proxy_livez_total).
type Counters struct {
	Healthz func(code int)
	Livez   func(code int)
}

// ProxyHealth tracks whether the datapath keeps up with the API: healthy
// unless a change has been queued and not applied for longer than the
// health timeout. kube-proxy runs one tracker per IP family; xvs programs
// both families in one sync, so one tracker stands for both.
type ProxyHealth struct {
	timeout  time.Duration
	now      func() time.Time
	counters Counters

	mu sync.RWMutex
	// lastUpdated is the end of the last successful sync (zero before the
	// first); oldestQueued the first change not yet applied (zero when
	// none is pending).
	lastUpdated  time.Time
	oldestQueued time.Time
	nodeEligible bool
	families     []string
	// behind are other ways the proxy falls behind (devices waiting for
	// the programs): each returns the time since when, zero when it keeps
	// up.
	behind []func() time.Time
}

// AddBehind adds a way the proxy can fall behind besides its syncs: f
// returns since when the oldest piece of work has waited (zero when none
// waits), and the proxy is unhealthy, /livez and /healthz with it, when
// that is longer than the health timeout.
func (h *ProxyHealth) AddBehind(f func() time.Time) {
	h.mu.Lock()
	h.behind = append(h.behind, f)
	h.mu.Unlock()
}

// NewProxyHealth returns a tracker; kube-proxy uses twice syncPeriod as the
// timeout.
func NewProxyHealth(timeout time.Duration, c Counters) *ProxyHealth {
	return &ProxyHealth{timeout: timeout, now: time.Now, counters: c,
		// Eligible until the Node says otherwise, so that a starting
		// agent that has not seen its Node yet does not fail probes.
		nodeEligible: true}
}

// QueuedUpdate records that a change is waiting for the datapath.
func (h *ProxyHealth) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestQueued.IsZero() {
		h.oldestQueued = h.now()
	}
}

// Updated records a successful sync: everything queued so far is applied.
func (h *ProxyHealth) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oldestQueued = time.Time{}
	h.lastUpdated = h.now()
}

// SyncNode updates node eligibility from this node's object; nil (the Node
// was deleted) makes the node ineligible.
func (h *ProxyHealth) SyncNode(n *v1.Node) {
	eligible := n != nil && n.DeletionTimestamp.IsZero()
	if eligible {
		for _, t := range n.Spec.Taints {
			if t.Key == ToBeDeletedTaint {
				eligible = false
				break
			}
		}
	}
	h.mu.Lock()
	h.nodeEligible = eligible
	h.mu.Unlock()
}

// NodeEligible reports the last SyncNode verdict.
func (h *ProxyHealth) NodeEligible() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.nodeEligible
}

// IsHealthy is the proxy's own health, node eligibility aside.
func (h *ProxyHealth) IsHealthy() bool {
	ok, _ := h.health()
	return ok
}

func (h *ProxyHealth) health() (bool, time.Time) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now := h.now()
	late := func(since time.Time) bool { return !since.IsZero() && now.Sub(since) >= h.timeout }
	if late(h.oldestQueued) {
		return false, h.lastUpdated
	}
	for _, f := range h.behind {
		if late(f()) {
			return false, h.lastUpdated
		}
	}
	return true, h.lastUpdated
}

// Handler serves /healthz and /livez.
func (h *ProxyHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { h.serve(w, true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { h.serve(w, false) })
	return mux
}

// ProxierHealth is the health of one IP family in a Body.
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Body is kube-proxy's /healthz and /livez answer (v1.34+ layout: the old
// lastUpdated/currentTime/nodeEligible keys, plus healthy and the status
// per IP family). nodeEligible is only in /healthz answers.
type Body struct {
	LastUpdated  time.Time                `json:"lastUpdated"`
	CurrentTime  time.Time                `json:"currentTime"`
	NodeEligible *bool                    `json:"nodeEligible,omitempty"`
	Healthy      bool                     `json:"healthy"`
	Status       map[string]ProxierHealth `json:"status,omitempty"`
}

// SetFamilies sets the IP families the status lists ("IPv4", "IPv6"); one
// sync serves them all, so they share one verdict. Default: IPv4.
func (h *ProxyHealth) SetFamilies(families []string) {
	h.mu.Lock()
	h.families = append([]string(nil), families...)
	h.mu.Unlock()
}

// serve answers as kube-proxy does: 200 or 503 and a JSON Body whose
// top-level lastUpdated is "now" when healthy (older releases reported the
// last sync loop run, which was always recent on a healthy proxy; clients
// such as the e2e "should check kube-proxy urls" look for the key).
// /livez ignores node eligibility.
func (h *ProxyHealth) serve(w http.ResponseWriter, withNode bool) {
	healthy, lastUpdated := h.health()
	now := h.now()
	h.mu.RLock()
	families := h.families
	h.mu.RUnlock()
	if len(families) == 0 {
		families = []string{"IPv4"}
	}
	body := Body{LastUpdated: lastUpdated, CurrentTime: now, Healthy: healthy, Status: map[string]ProxierHealth{}}
	for _, f := range families {
		body.Status[f] = ProxierHealth{LastUpdated: lastUpdated, Healthy: healthy}
	}
	if withNode {
		eligible := h.NodeEligible()
		body.NodeEligible = &eligible
		body.Healthy = healthy && eligible
	}
	code := http.StatusOK
	if !body.Healthy {
		code = http.StatusServiceUnavailable
	} else {
		body.LastUpdated = now
	}
	count := h.counters.Livez
	if withNode {
		count = h.counters.Healthz
	}
	if count != nil {
		count(code)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
