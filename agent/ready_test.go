package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/healthcheck"
)

func TestReadyzAfterFirstSync(t *testing.T) {
	h := healthcheck.NewProxyHealth(time.Minute, healthcheck.Counters{})
	srv := readyHandler(h)
	get := func(path string) int {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	if c := get("/healthz"); c != http.StatusOK {
		t.Fatalf("/healthz before any sync: %d, want 200 (kube-proxy's behaviour)", c)
	}
	if c := get("/readyz"); c != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the first sync: %d, want 503", c)
	}
	h.Updated()
	if c := get("/readyz"); c != http.StatusOK {
		t.Fatalf("/readyz after the first sync: %d, want 200", c)
	}
	h.SyncNode(nil) // the Node was deleted: ineligible
	if c := get("/readyz"); c != http.StatusServiceUnavailable {
		t.Fatalf("/readyz on an ineligible node: %d, want 503", c)
	}
	if c := get("/livez"); c != http.StatusOK {
		t.Fatalf("/livez on an ineligible node: %d, want 200", c)
	}
}
