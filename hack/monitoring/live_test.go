package monitoring

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/util/teststorage"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

var dashboardPNG = flag.String("dashboard-png", "", "TestPrivDashboardLive: also render the dashboard over the run into this PNG (make dashboard)")

// quietPanels are the panels a run of the file source, with no failure and
// no bad input, leaves empty, and why. The test checks they are empty, so
// the list stays true.
var quietPanels = map[string]string{
	"Network programming latency": "the file source has no EndpointSlice trigger times (the API source's kube tests cover the metric)",
}

// Alerts the run must fire once the Service has lost its endpoints (and
// keeps being connected to); every other alert must stay inactive
// throughout.
var brokenAlerts = []string{"XvsRejectingConnections", "XvsServiceLostBackends"}

const metricsAddr = "127.0.0.1:10249"

// TestPrivDashboardLive: a live agent, real traffic (connections, bulk
// transfers, UDP) through the demo Service, /metrics scraped every second
// into a Prometheus TSDB. Every dashboard panel's query returns data over
// the run, except the quiet ones, which return none. Prometheus's rule
// engine evaluates the alerts at every scrape: none is even pending while
// the Service is healthy. Then the Service loses its endpoints while
// clients keep connecting: the alerts for that go pending, and fire once
// their `for` has passed (evaluated again that much after the last scrape,
// the node still reporting what it reported last); no other alert fires.
func TestPrivDashboardLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the live dashboard test needs root (network namespaces, BPF); run it as root")
	}
	panels, err := LoadDashboard(DashboardPath, "4s") // scrapes every second
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := LoadAlerts(RulesPath)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := NewRules(alerts)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "xvs")
	if out, err := exec.Command("go", "-C", "../..", "build", "-o", bin, "./cmd/xvs").CombinedOutput(); err != nil {
		t.Fatalf("build xvs: %v\n%s", err, out)
	}
	w := harness.StartSingle(t, "mon", bin, "--metrics-bind-address", metricsAddr)
	if err := w.WaitProgrammed(len(harness.DemoPodIPs), 60*time.Second); err != nil {
		t.Fatal(err)
	}

	// Clients: new connections at about 50/s, a bulk transfer now and
	// then, a UDP exchange, all through the VIP.
	tcp := netip.AddrPortFrom(harness.DemoVIP, 80)
	udp := netip.AddrPortFrom(harness.DemoVIP, 53)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			<-tick.C
			r := lab.ProbeTCP(w.Client, harness.DemoClientIP, tcp, time.Second)
			switch r.Verdict {
			case lab.OK:
				ok.Add(1)
			case lab.Refused:
				refused.Add(1)
			}
			if i%10 == 0 {
				lab.ProbeUDP(w.Client, harness.DemoClientIP, udp, 200*time.Millisecond)
			}
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			// Fails (and is not counted) once the Service has no endpoints.
			_, _ = lab.Transfer(w.Client, netip.AddrPortFrom(harness.DemoClientIP, 0), tcp, lab.TransferSpec{Download: 4 << 20, Upload: 1 << 20})
			time.Sleep(500 * time.Millisecond)
		}
	})
	defer func() { stop(); wg.Wait() }()

	r := NewRecorder(teststorage.New(t), "xvs", "node")
	scrape := func() {
		t.Helper()
		now := time.Now()
		code, _, body, err := lab.HTTPGet(w.Node.NS, "http://"+metricsAddr+"/metrics")
		if err != nil || code != 200 {
			t.Fatalf("scrape: %d %v", code, err)
		}
		if err := r.Add([]byte(body), now); err != nil {
			t.Fatal(err)
		}
	}
	eval := func(ts time.Time) (active, firing []string) {
		t.Helper()
		firing, err := rs.Eval(r, ts)
		if err != nil {
			t.Fatal(err)
		}
		return rs.Active(), firing
	}

	const healthy, broken = 20, 20
	for i := range healthy {
		time.Sleep(time.Second)
		scrape()
		if active, _ := eval(r.Last); len(active) > 0 {
			t.Errorf("healthy Service, scrape %d: alerts %v active", i, active)
		}
	}
	t.Logf("healthy: %d connections answered, %d refused", ok.Load(), refused.Load())
	broke := time.Now()
	if err := w.WriteService(nil); err != nil {
		t.Fatal(err)
	}
	var active []string
	for range broken {
		time.Sleep(time.Second)
		scrape()
		active, _ = eval(r.Last)
	}
	t.Logf("after the break: %d connections answered, %d refused in all", ok.Load(), refused.Load())
	if refused.Load() == 0 {
		t.Fatal("no connection was refused after the Service lost its endpoints")
	}
	slices.Sort(active)
	if !slices.Equal(active, brokenAlerts) {
		t.Errorf("alerts active at the last scrape: %v, want %v (pending)", active, brokenAlerts)
	}
	// The node keeps reporting what it reported last: evaluate again as
	// the longest hold passes.
	var hold time.Duration
	for _, a := range alerts {
		if slices.Contains(brokenAlerts, a.Name) {
			hold = max(hold, a.For)
		}
	}
	var firing []string
	for ts := r.Last.Add(15 * time.Second); !ts.After(r.Last.Add(hold + 15*time.Second)); ts = ts.Add(15 * time.Second) {
		_, firing = eval(ts)
	}
	slices.Sort(firing)
	if !slices.Equal(firing, brokenAlerts) {
		t.Errorf("alerts firing %v after the hold, want %v", firing, brokenAlerts)
	}

	// Every panel shows the run, but the quiet ones.
	for _, p := range panels {
		points := 0
		for _, q := range p.Queries {
			m, err := r.Range(q.Expr, time.Second)
			if err != nil {
				t.Fatalf("panel %q: %q: %v", p.Title, q.Expr, err)
			}
			for _, s := range m {
				points += len(s.Floats)
			}
		}
		why, quiet := quietPanels[p.Title]
		switch {
		case quiet && points > 0:
			t.Errorf("panel %q is listed as quiet (%s) but shows %d points", p.Title, why, points)
		case !quiet && points == 0:
			t.Errorf("panel %q shows nothing over the run", p.Title)
		}
	}
	if *dashboardPNG != "" {
		title := fmt.Sprintf("xvs dashboard (deploy/monitoring) over a live run: one node, Service demo/web; its endpoints removed at %.0f s (make dashboard)",
			broke.Sub(r.First).Seconds())
		if err := Render(r, panels, title, *dashboardPNG); err != nil {
			t.Fatal(err)
		}
		t.Logf("rendered %s", *dashboardPNG)
	}
}
