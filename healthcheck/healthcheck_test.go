package healthcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func get(t *testing.T, h http.Handler, path string) (int, http.Header, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", path, rec.Body.String(), err)
	}
	return rec.Code, rec.Header(), body
}

// TestProxyHealth: kube-proxy's /healthz and /livez semantics: healthy at
// start, unhealthy once a queued change waits past the timeout, healthy
// again after a sync; node deletion and the autoscaler taint fail /healthz
// but not /livez.
func TestProxyHealth(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	codes := map[string][]int{}
	h := NewProxyHealth(time.Minute, Counters{
		Healthz: func(c int) { codes["healthz"] = append(codes["healthz"], c) },
		Livez:   func(c int) { codes["livez"] = append(codes["livez"], c) },
	})
	h.now = clk.now
	srv := h.Handler()

	check := func(step string, wantHealthz, wantLivez int, eligible bool) {
		t.Helper()
		code, hdr, body := get(t, srv, "/healthz")
		if code != wantHealthz {
			t.Errorf("%s: /healthz %d, want %d", step, code, wantHealthz)
		}
		if hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", step, hdr)
		}
		for _, k := range []string{"lastUpdated", "currentTime", "nodeEligible", "healthy", "status"} {
			if _, ok := body[k]; !ok {
				t.Errorf("%s: /healthz body lacks %s: %v", step, k, body)
			}
		}
		if body["nodeEligible"] != eligible {
			t.Errorf("%s: nodeEligible %v", step, body["nodeEligible"])
		}
		if code == 200 && body["lastUpdated"] != body["currentTime"] {
			t.Errorf("%s: healthy lastUpdated %v != currentTime %v", step, body["lastUpdated"], body["currentTime"])
		}
		if body["healthy"] != (code == 200) {
			t.Errorf("%s: healthy %v with code %d", step, body["healthy"], code)
		}
		st, _ := body["status"].(map[string]any)
		v4, _ := st["IPv4"].(map[string]any)
		if v4 == nil || v4["healthy"] != (wantLivez == 200) {
			t.Errorf("%s: status %v", step, body["status"])
		}
		code, _, body = get(t, srv, "/livez")
		if code != wantLivez {
			t.Errorf("%s: /livez %d, want %d", step, code, wantLivez)
		}
		if _, ok := body["nodeEligible"]; ok {
			t.Errorf("%s: /livez reports nodeEligible", step)
		}
	}
	check("start", 200, 200, true)
	h.QueuedUpdate()
	clk.t = clk.t.Add(59 * time.Second)
	check("queued, not late", 200, 200, true)
	h.QueuedUpdate() // does not move the oldest pending change
	clk.t = clk.t.Add(2 * time.Second)
	check("queued, late", 503, 503, true)
	if h.IsHealthy() {
		t.Error("IsHealthy while late")
	}
	h.Updated()
	check("synced", 200, 200, true)

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	node.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	h.SyncNode(node)
	check("autoscaler taint", 503, 200, false)
	node.Spec.Taints = nil
	h.SyncNode(node)
	check("taint removed", 200, 200, true)
	now := metav1.Now()
	node.DeletionTimestamp = &now
	h.SyncNode(node)
	check("node being deleted", 503, 200, false)
	h.SyncNode(nil)
	check("node gone", 503, 200, false)
	h.SyncNode(&v1.Node{})

	h.SetFamilies([]string{"IPv4", "IPv6"})
	if _, _, body := get(t, srv, "/livez"); len(body["status"].(map[string]any)) != 2 {
		t.Errorf("dual-stack status %v", body["status"])
	}

	if got := fmt.Sprint(codes["healthz"]); got != "[200 200 503 200 503 200 503 503]" {
		t.Errorf("healthz counts %s", got)
	}
	if got := fmt.Sprint(codes["livez"]); got != "[200 200 503 200 200 200 200 200 200]" {
		t.Errorf("livez counts %s", got)
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func fetch(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestServiceHealth: real listeners on loopback answer kube-proxy's JSON
// with its headers; 200 only with local endpoints and a healthy proxy;
// Services going away close their port; a bind failure is reported once.
func TestServiceHealth(t *testing.T) {
	healthy := true
	type failure struct {
		svc  types.NamespacedName
		port uint16
	}
	var failures []failure
	s := NewServiceHealth(func() bool { return healthy }, func(n types.NamespacedName, p uint16, err error) {
		failures = append(failures, failure{n, p})
	})
	defer s.Close()
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	port := freePort(t)
	s.Sync(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 2}}, lo)
	url := fmt.Sprintf("http://127.0.0.1:%d/any/path", port)

	code, hdr, body := fetch(t, url)
	if code != 200 || hdr.Get("X-Load-Balancing-Endpoint-Weight") != "2" ||
		hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("2 local endpoints: %d %v", code, hdr)
	}
	var got struct {
		Service struct {
			Namespace, Name string
		} `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if got.Service.Namespace != "ns" || got.Service.Name != "web" || got.LocalEndpoints != 2 || !got.ServiceProxyHealthy {
		t.Fatalf("body %+v", got)
	}

	s.Sync(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 0}}, lo)
	if code, hdr, body := fetch(t, url); code != 503 || hdr.Get("X-Load-Balancing-Endpoint-Weight") != "0" ||
		!strings.Contains(body, `"localEndpoints": 0`) {
		t.Fatalf("no local endpoints: %d %v %s", code, hdr, body)
	}
	s.Sync(map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 1}}, lo)
	healthy = false
	if code, _, body := fetch(t, url); code != 503 || !strings.Contains(body, `"serviceProxyHealthy": false`) {
		t.Fatalf("unhealthy proxy: %d %s", code, body)
	}
	healthy = true

	// A second Service on a port someone else holds: reported once,
	// retried, and served once the port is free.
	blocker, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := uint16(blocker.Addr().(*net.TCPAddr).Port)
	api := types.NamespacedName{Namespace: "ns", Name: "api"}
	want := map[types.NamespacedName]Service{web: {Port: port, LocalEndpoints: 1}, api: {Port: busy, LocalEndpoints: 1}}
	s.Sync(want, lo)
	s.Sync(want, lo)
	if len(failures) != 1 || failures[0] != (failure{api, busy}) {
		t.Fatalf("bind failures %v", failures)
	}
	blocker.Close()
	s.Sync(want, lo)
	if code, _, _ := fetch(t, fmt.Sprintf("http://127.0.0.1:%d/", busy)); code != 200 {
		t.Fatalf("after the port freed up: %d", code)
	}

	// Deleting web closes its port.
	s.Sync(map[types.NamespacedName]Service{api: {Port: busy, LocalEndpoints: 1}}, lo)
	if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		t.Fatal("web's health check port still open after the Service went away")
	}
	if p := s.Ports(); len(p) != 1 || p[api] != busy {
		t.Fatalf("ports %v", p)
	}
}

// TestProxyHealthBehind: work besides the syncs that waits past the
// timeout (devices waiting for the programs) fails /livez and /healthz,
// and they recover once it is done.
func TestProxyHealthBehind(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h := NewProxyHealth(time.Minute, Counters{})
	h.now = clk.now
	var since time.Time
	h.AddBehind(func() time.Time { return since })
	srv := h.Handler()
	expect := func(step string, want int) {
		t.Helper()
		for _, path := range []string{"/livez", "/healthz"} {
			if code, _, _ := get(t, srv, path); code != want {
				t.Errorf("%s: %s %d, want %d", step, path, code, want)
			}
		}
	}
	expect("nothing waits", 200)
	since = clk.t
	clk.t = clk.t.Add(59 * time.Second)
	expect("a device waits 59 s", 200)
	clk.t = clk.t.Add(time.Second)
	expect("a device waits a minute", 503)
	since = time.Time{}
	expect("attached", 200)
}
