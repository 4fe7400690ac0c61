package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// BenchmarkPrivMasqueradeCPS: new TCP connections per second (connect,
// read the server's greeting, close) from 16 workers through node A to a
// Service of three pods on node B, masqueraded and not, in one run: a pod to the ClusterIP
// (not masqueraded; with --masquerade-all, masqueraded) and an external
// client to the NodePort (eTP=Cluster: always masqueraded). Client ports
// 1024-65535 with tcp_tw_reuse, as in the measurement, so client
// tuples come back while their previous flow is in TIME_WAIT. Each case
// runs for XVS_CPS_WINDOW (default 60s) and reports conn/s and failures.
//
//	go test -run '^$' -bench PrivMasqueradeCPS -benchtime 1x ./cmd/xvs/
func BenchmarkPrivMasqueradeCPS(b *testing.B) {
	window := cpsWindow(b)
	clusterIP := netip.MustParseAddrPort("172.30.0.50:80")
	for _, c := range []struct {
		name   string
		extra  []string
		client func(w *harness.Multi) (*lab.NS, netip.AddrPort)
	}{
		{"pod-clusterip-unmasqueraded", nil, func(w *harness.Multi) (*lab.NS, netip.AddrPort) { return w.PodA, clusterIP }},
		{"pod-clusterip-masquerade-all", []string{"--masquerade-all"}, func(w *harness.Multi) (*lab.NS, netip.AddrPort) { return w.PodA, clusterIP }},
		{"external-nodeport-masqueraded", nil, func(w *harness.Multi) (*lab.NS, netip.AddrPort) {
			return w.Client, netip.AddrPortFrom(harness.MultiNodeA, 30090)
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
			for name, pin := range w.Pins {
				vs, err := agentVerdicts(pin)
				if err != nil {
					b.Fatal(err)
				}
				for v, n := range vs {
					if strings.HasPrefix(v, "drop") {
						b.Logf("%s: %s %d packets", name, v, n)
					}
				}
				if name == "node-a" {
					b.ReportMetric(float64(vs["drop_snat_ports_exhausted"]), "snat-exhausted")
				}
			}
		})
	}
}

// BenchmarkPrivSpreadCPS: the same load from a pod, not masqueraded, with
// each connection to the next of N ClusterIP Services of the same three
// pods (N = 1 and 1000), in both netfilter modes: what a per-Service cost
// in the datapath would show. XVS_CPS_WINDOW as above.
//
//	go test -run '^$' -bench PrivSpreadCPS -benchtime 1x ./cmd/xvs/
func BenchmarkPrivSpreadCPS(b *testing.B) {
	window := cpsWindow(b)
	for _, mode := range []string{"pass", "bypass"} {
		for _, n := range []int{1, 1000} {
			b.Run(fmt.Sprintf("%s-%d-services", mode, n), func(b *testing.B) {
				var m strings.Builder
				var dsts []netip.AddrPort
				for i := range n {
					ip := netip.AddrFrom4([4]byte{172, 30, 16 + byte(i/250), byte(1 + i%250)})
					dsts = append(dsts, netip.AddrPortFrom(ip, 80))
					fmt.Fprintf(&m, "---\napiVersion: v1\nkind: Service\nmetadata: {name: harness.Spread-%d, namespace: lab}\nspec:\n  clusterIP: %s\n  clusterIPs: [%s]\n  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}]\n", i, ip, ip)
					fmt.Fprintf(&m, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: harness.Spread-%d-1, namespace: lab, labels: {kubernetes.io/service-name: harness.Spread-%d}}\naddressType: IPv4\nendpoints: [{addresses: [10.244.1.21], nodeName: node-b}, {addresses: [10.244.1.22], nodeName: node-b}, {addresses: [10.244.1.23], nodeName: node-b}]\nports: [{name: tcp, port: 8080, protocol: TCP}]\n", i, i)
				}
				w := newBenchWorldWith(b, m.String(), "--netfilter-mode="+mode)
				deadline := time.Now().Add(30 * time.Second)
				for lab.ProbeTCP(w.PodA, harness.MultiPodA, dsts[len(dsts)-1], time.Second).Verdict != lab.OK {
					if time.Now().After(deadline) {
						b.Fatal("last harness.Spread Service never reachable")
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err := w.PodA.Sysctl("net/ipv4/ip_local_port_range", "1024 65535", "net/ipv4/tcp_tw_reuse", "1"); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				ok, failed := connectLoadTo(w.PodA, dsts, 16, window)
				b.StopTimer()
				b.ReportMetric(float64(ok)/window.Seconds(), "conn/s")
				b.ReportMetric(float64(failed), "failures")
				vs, err := agentVerdicts(w.Pins["node-a"])
				if err != nil {
					b.Fatal(err)
				}
				for v, n := range vs {
					b.Logf("node A: %s %d packets", v, n)
				}
			})
		}
	}
}

// cpsWindow is the measuring window of the CPS benchmarks: XVS_CPS_WINDOW,
// default 60 s.
func cpsWindow(b *testing.B) time.Duration {
	v := os.Getenv("XVS_CPS_WINDOW")
	if v == "" {
		return 60 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

func newBenchWorld(b *testing.B, extra ...string) *harness.Multi {
	b.Helper()
	return newBenchWorldWith(b, "", extra...)
}

// newBenchWorldWith is newBenchWorld with more manifests (more appended to
// the bench Service's).
func newBenchWorldWith(b *testing.B, more string, extra ...string) *harness.Multi {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatal("needs root")
	}
	bin, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	w, err := harness.NewMulti("mnb", bin)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	for i, ip := range benchPods {
		ns, err := w.Lab.AddPod(w.B, fmt.Sprintf("bench%d", i), ip)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := lab.StartBulk(ns, netip.AddrPortFrom(ip, 8080)); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(w.Dir, "bench.yaml"), []byte(benchManifests+more), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := w.StartAgents(extra...); err != nil {
		b.Fatal(err)
	}
	// Both agents program the bench Service too.
	deadline := time.Now().Add(10 * time.Second)
	for lab.ProbeTCP(w.PodA, harness.MultiPodA, netip.MustParseAddrPort("172.30.0.50:80"), time.Second).Verdict != lab.OK {
		if time.Now().After(deadline) {
			b.Fatal("bench Service never reachable")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return w
}

var benchPods = []netip.Addr{
	netip.MustParseAddr("10.244.1.21"), netip.MustParseAddr("10.244.1.22"), netip.MustParseAddr("10.244.1.23"),
}

// benchManifests: a NodePort Service (eTP=Cluster) of three pods on node B.
const benchManifests = `apiVersion: v1
kind: Service
metadata: {name: bench, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.50
  clusterIPs: [172.30.0.50]
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30090, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bench-1, namespace: lab, labels: {kubernetes.io/service-name: bench}}
addressType: IPv4
endpoints:
- {addresses: [10.244.1.21], nodeName: node-b}
- {addresses: [10.244.1.22], nodeName: node-b}
- {addresses: [10.244.1.23], nodeName: node-b}
ports:
- {name: tcp, port: 8080, protocol: TCP}
`

// connectLoad runs workers that connect to dst from ns, read one line and
// close, until window ends; it returns the connections that completed and
// those that failed.
func connectLoad(ns *lab.NS, dst netip.AddrPort, workers int, window time.Duration) (ok, failed int64) {
	return connectLoadTo(ns, []netip.AddrPort{dst}, workers, window)
}

// connectLoadTo is connectLoad over several destinations: worker w's k-th
// connection goes to dsts[(w + k*workers) % len(dsts)].
func connectLoadTo(ns *lab.NS, dsts []netip.AddrPort, workers int, window time.Duration) (ok, failed int64) {
	var okN, failN atomic.Int64
	end := time.Now().Add(window)
	var wg sync.WaitGroup
	for wk := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The whole loop runs on a thread in the client's namespace,
			// so every socket is created there.
			ns.Do(func() error {
				for k := 0; time.Now().Before(end); k++ {
					dst := dsts[(wk+k*workers)%len(dsts)]
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
