package agent

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	flagzv1beta1 "k8s.io/apiserver/pkg/server/flagz/api/v1beta1"
	statuszv1beta1 "k8s.io/apiserver/pkg/server/statusz/api/v1beta1"
)

func get(t *testing.T, h http.Handler, path, accept string) (int, http.Header, string) {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	body, _ := io.ReadAll(w.Result().Body)
	return w.Code, w.Result().Header, string(body)
}

// TestMetricsServerZpages: the metrics server has kube-proxy's /flagz and
// /statusz: the command line as parsed (defaults included, a given flag
// with its value) and the process's status, as text by default and as
// the config.k8s.io objects when asked for them; a bare application/json
// is refused; ComponentFlagz=false and ComponentStatusz=false take the
// pages away, as in kube-proxy.
func TestMetricsServerZpages(t *testing.T) {
	o, _, err := parseAgentArgs([]string{"--hostname-override=node-a", "--metrics-bind-address=127.0.0.1:10249"})
	if err != nil {
		t.Fatal(err)
	}
	mux, err := metricsMux(&o.Config, o.flags, "ebpf", http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}

	code, hdr, text := get(t, mux, "/flagz", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("/flagz: %d %s", code, hdr.Get("Content-Type"))
	}
	for _, re := range []string{`(?m)^xvs flagz$`, `(?m)^hostname-override(:|: |=| )node-a$`,
		`(?m)^metrics-bind-address(:|: |=| )127\.0\.0\.1:10249$`, `(?m)^proxy-mode(:|: |=| )$`, `(?m)^ipvs-scheduler(:|: |=| )$`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("/flagz text has no match for %s:\n%s", re, text)
		}
	}
	code, hdr, body := get(t, mux, "/flagz", "application/json;as=Flagz;v=v1beta1;g=config.k8s.io")
	var fz flagzv1beta1.Flagz
	if code != 200 || hdr.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(body), &fz) != nil {
		t.Fatalf("/flagz json: %d %s %s", code, hdr.Get("Content-Type"), body)
	}
	if fz.Kind != "Flagz" || fz.APIVersion != "config.k8s.io/v1beta1" || fz.Name != "xvs" ||
		fz.Flags["hostname-override"] != "node-a" || fz.Flags["metrics-per-backend"] != "true" {
		t.Errorf("/flagz json: %+v", fz)
	}
	if code, hdr, _ := get(t, mux, "/flagz", "application/json;as=Flagz;v=v1alpha1;g=config.k8s.io"); code != 200 || hdr.Get("Warning") == "" {
		t.Errorf("/flagz v1alpha1: %d, Warning %q", code, hdr.Get("Warning"))
	}
	if code, _, _ := get(t, mux, "/flagz", "application/json"); code != http.StatusNotAcceptable {
		t.Errorf("/flagz with a bare application/json: %d, want 406", code)
	}

	code, _, text = get(t, mux, "/statusz", "text/plain")
	if code != 200 || !regexp.MustCompile(`(?m)^Paths(:|: |=| ) /configz /flagz /healthz /metrics /proxyMode /statusz$`).MatchString(text) ||
		!regexp.MustCompile(`(?m)^Go version(:|: |=| ) go1\.`).MatchString(text) {
		t.Errorf("/statusz: %d\n%s", code, text)
	}
	code, _, body = get(t, mux, "/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io")
	var sz statuszv1beta1.Statusz
	if code != 200 || json.Unmarshal([]byte(body), &sz) != nil || sz.Kind != "Statusz" || sz.StartTime.IsZero() ||
		sz.BinaryVersion == "" || len(sz.Paths) != 6 {
		t.Errorf("/statusz json: %d %s", code, body)
	}
	if code, _, body := get(t, mux, "/healthz", ""); code != 200 || body != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}

	o, _, err = parseAgentArgs([]string{"--feature-gates=ComponentFlagz=false,ComponentStatusz=false"})
	if err != nil {
		t.Fatal(err)
	}
	if mux, err = metricsMux(&o.Config, o.flags, "ebpf", http.NotFoundHandler()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/flagz", "/statusz"} {
		if code, _, _ := get(t, mux, p, ""); code != 404 {
			t.Errorf("%s with its gate off: %d, want 404", p, code)
		}
	}
}

// TestProfilingLoopbackOnly: with enableProfiling the pprof pages answer
// clients on the node's loopback (the node itself, kubectl port-forward)
// and refuse every other address the metrics server listens on.
func TestProfilingLoopbackOnly(t *testing.T) {
	o, _, err := parseAgentArgs([]string{"--hostname-override=node-a", "--metrics-bind-address=0.0.0.0:10249", "--profiling"})
	if err != nil {
		t.Fatal(err)
	}
	mux, err := metricsMux(&o.Config, o.flags, "ebpf", http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from string
		want int
	}{
		{"127.0.0.1:40000", 200}, {"[::1]:40000", 200}, {"[::ffff:127.0.0.1]:40000", 200},
		{"192.0.2.7:40000", 403}, {"[2001:db8::7]:40000", 403}, {"[::ffff:192.0.2.7]:40000", 403}, {"bogus", 403},
	} {
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/symbol"} {
			r := httptest.NewRequest(http.MethodGet, path, nil)
			r.RemoteAddr = c.from
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			if w.Code != c.want {
				t.Errorf("%s from %s: %d, want %d", path, c.from, w.Code, c.want)
			}
		}
	}
	// The metrics stay everyone's.
	r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
	r.RemoteAddr = "192.0.2.7:40000"
	w := httptest.NewRecorder()
	if mux.ServeHTTP(w, r); w.Code != 200 {
		t.Errorf("/healthz from 192.0.2.7: %d", w.Code)
	}
}
