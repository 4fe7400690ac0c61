package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"

	"github.com/xvs-lb/xvs/healthcheck"
)

// readyHandler serves /healthz and /livez (kube-proxy's, unchanged) and
// /readyz, the DaemonSet's readiness probe: ready means the first sync has
// programmed the datapath (the informers had synced and one sync succeeded)
// and /healthz is healthy now (no change pending longer than the timeout,
// the Node eligible). /healthz alone answers 200 from the moment the agent
// listens, before anything is programmed: a rolling update would then move
// on to the next node while this one still serves nothing.
func readyHandler(h *healthcheck.ProxyHealth) http.Handler {
	inner := h.Handler()
	mux := http.NewServeMux()
	mux.Handle("/healthz", inner)
	mux.Handle("/livez", inner)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil).WithContext(r.Context()))
		var body healthcheck.Body
		synced := false
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err == nil {
			// Status[family].LastUpdated is the end of the last
			// successful sync, zero before the first one.
			synced = len(body.Status) > 0
			for _, st := range body.Status {
				if st.LastUpdated.IsZero() {
					synced = false
				}
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		switch {
		case !synced:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: first sync not programmed yet\n"))
		case rec.Code != http.StatusOK:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: /healthz unhealthy\n"))
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	return mux
}
