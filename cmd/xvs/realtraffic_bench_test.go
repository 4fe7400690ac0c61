package main

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// BenchmarkPrivMasqueradeCPS: new TCP connections per second (connect,
// read the server's greeting, close) from 16 workers through node A to the
// pod on node B, masqueraded and not, in one run: a pod to the ClusterIP
// (not masqueraded; with --masquerade-all, masqueraded) and an external
// client to the NodePort (eTP=Cluster: always masqueraded). Client ports
// 1024-65535 with tcp_tw_reuse, as in the measurement, so client
// tuples come back while their previous flow is in TIME_WAIT. Each case
// runs for XVS_CPS_WINDOW (default 60s) and reports conn/s and failures.
//
//	go test -run '^$' -bench PrivMasqueradeCPS -benchtime 1x ./cmd/xvs/
func BenchmarkPrivMasqueradeCPS(b *testing.B) {
	window := 60 * time.Second
	if v := os.Getenv("XVS_CPS_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		window = d
	}
	clusterIP := netip.MustParseAddrPort("172.30.0.30:80")
	for _, c := range []struct {
		name   string
		extra  []string
		client func(w *multiNode) (*lab.NS, netip.AddrPort)
	}{
		{"pod-clusterip-unmasqueraded", nil, func(w *multiNode) (*lab.NS, netip.AddrPort) { return w.PodA, clusterIP }},
		{"pod-clusterip-masquerade-all", []string{"--masquerade-all"}, func(w *multiNode) (*lab.NS, netip.AddrPort) { return w.PodA, clusterIP }},
		{"external-nodeport-masqueraded", nil, func(w *multiNode) (*lab.NS, netip.AddrPort) {
			return w.Client, netip.AddrPortFrom(mnNodeA, 30080)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := newBenchWorld(b, c.extra...)
			ns, dst := c.client(w)
			if err := ns.Sysctl("net/ipv4/ip_local_port_range", "1024 65535", "net/ipv4/tcp_tw_reuse", "1"); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			ok, failed := connectLoad(ns, dst, 16, window)
			b.StopTimer()
			b.ReportMetric(float64(ok)/window.Seconds(), "conn/s")
			b.ReportMetric(float64(failed), "failures")
		})
	}
}

func newBenchWorld(b *testing.B, extra ...string) *multiNode {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatal("needs root")
	}
	bin, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	w, err := newMultiNode("mnb", bin)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	if err := w.startAgents(extra...); err != nil {
		b.Fatal(err)
	}
	return w
}

// connectLoad runs workers that connect to dst from ns, read one line and
// close, until window ends; it returns the connections that completed and
// those that failed.
func connectLoad(ns *lab.NS, dst netip.AddrPort, workers int, window time.Duration) (ok, failed int64) {
	var okN, failN atomic.Int64
	end := time.Now().Add(window)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The whole loop runs on a thread in the client's namespace,
			// so every socket is created there.
			ns.Do(func() error {
				for time.Now().Before(end) {
					c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
					if err != nil {
						failN.Add(1)
						continue
					}
					c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
						failN.Add(1)
					} else {
						okN.Add(1)
					}
					c.Close()
				}
				return nil
			})
		}()
	}
	wg.Wait()
	return okN.Load(), failN.Load()
}
