package main

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// chiSquareCritical are the chi-square critical values at significance
// 0.001 by degrees of freedom: a fair spread exceeds them once in a
// thousand runs.
var chiSquareCritical = map[int]float64{1: 10.828, 2: 13.816, 3: 16.266}

// chiSquare is Pearson's statistic of observed counts against expected
// shares (which sum to 1).
func chiSquare(observed []int, shares []float64) float64 {
	total := 0
	for _, o := range observed {
		total += o
	}
	var x float64
	for i, o := range observed {
		e := shares[i] * float64(total)
		x += (float64(o) - e) * (float64(o) - e) / e
	}
	return x
}

// reprogram rewrites the Service and waits until `xvs list` shows the
// scheduler, the affinity timeout and the endpoints asked for.
func reprogram(t *testing.T, w *harness.Single, eps []netip.Addr, o harness.ServiceOpts, sched string) {
	t.Helper()
	if err := w.WriteServiceWith(eps, o); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		sv, err := w.Programmed()
		if err == nil && sv != nil && sv.Scheduler == sched && int(sv.Affinity) == o.Affinity && len(sv.Backends) == len(eps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("scheduler %s, affinity %d, %d backends not programmed after 5s (have %+v, %v)", sched, o.Affinity, len(eps), sv, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// connectN makes n TCP connections from src and counts them per pod.
func connectN(t *testing.T, w *harness.Single, ns *lab.NS, src netip.Addr, n int) []int {
	t.Helper()
	counts := make([]int, len(harness.DemoPodIPs))
	for i := range n {
		r := lab.ProbeTCP(ns, src, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second)
		if r.Verdict != lab.OK {
			t.Fatalf("connection %d from %s: %v", i, src, r)
		}
		counts[podIndex(t, r.Reply.Local)]++
	}
	return counts
}

func podIndex(t *testing.T, ap netip.AddrPort) int {
	t.Helper()
	for i := range harness.DemoPodIPs {
		if podAddr(i) == ap {
			return i
		}
	}
	t.Fatalf("reply from %s, which is no pod", ap)
	return -1
}

// manyClients adds a client namespace with n addresses from 198.51.100.0/24.
func manyClients(t *testing.T, w *harness.Single, n int) (*lab.NS, []netip.Addr) {
	t.Helper()
	var addrs []netip.Addr
	for i := range n {
		addrs = append(addrs, netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)}))
	}
	ns, err := w.Lab.AddClient(w.Node, "many", addrs...)
	if err != nil {
		t.Fatal(err)
	}
	return ns, addrs
}

// TestPrivSchedulersRealTraffic: the IPVS schedulers with real TCP
// connections from client namespaces through the node to three pods.
func TestPrivSchedulersRealTraffic(t *testing.T) {
	w := newWorld(t)
	even := []float64{1. / 3, 1. / 3, 1. / 3}

	t.Run("random", func(t *testing.T) {
		reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{}, "random")
		c := connectN(t, w, w.Client, harness.DemoClientIP, 300)
		x := chiSquare(c, even)
		t.Logf("random: %v, chi-square %.2f (critical %.2f at 0.001)", c, x, chiSquareCritical[2])
		if x > chiSquareCritical[2] {
			t.Fatalf("random harness.Spread %v is not uniform (chi-square %.2f)", c, x)
		}
	})

	t.Run("rr", func(t *testing.T) {
		reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": "rr"}}, "rr")
		c := connectN(t, w, w.Client, harness.DemoClientIP, 300)
		t.Logf("rr: %v", c)
		for i, n := range c {
			if n != 100 {
				t.Fatalf("rr gave pod %d %d of 300 connections, want exactly 100: %v", i, n, c)
			}
		}
	})

	t.Run("wrr", func(t *testing.T) {
		weights := fmt.Sprintf("%s=3,%s=2,%s=1", harness.DemoPodIPs[0], harness.DemoPodIPs[1], harness.DemoPodIPs[2])
		reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": "wrr", "xvs.io/weights": weights}}, "wrr")
		c := connectN(t, w, w.Client, harness.DemoClientIP, 300)
		x := chiSquare(c, []float64{3. / 6, 2. / 6, 1. / 6})
		t.Logf("wrr 3:2:1: %v, chi-square %.2f", c, x)
		// One cycle is 6 connections, so 300 are 50 whole cycles.
		if c[0] != 150 || c[1] != 100 || c[2] != 50 {
			t.Fatalf("wrr 3:2:1 over 300 connections gave %v, want [150 100 50]", c)
		}
	})

	t.Run("lc", func(t *testing.T) {
		reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": "lc"}}, "lc")
		var held []net.Conn
		on := map[int][]net.Conn{}
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		hold := func() int {
			r, c, err := lab.DialTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			i := podIndex(t, r.Local)
			on[i] = append(on[i], c)
			return i
		}
		for range 6 {
			hold()
		}
		if len(on[0]) != 2 || len(on[1]) != 2 || len(on[2]) != 2 {
			t.Fatalf("lc harness.Spread 6 held connections as %d/%d/%d, want 2 each", len(on[0]), len(on[1]), len(on[2]))
		}
		// Pod 1 lets go of both its connections: it now holds the fewest,
		// so the next two new connections go there.
		for _, c := range on[1] {
			c.Close()
		}
		on[1] = nil
		time.Sleep(200 * time.Millisecond) // the FINs pass the node
		for i := range 2 {
			if got := hold(); got != 1 {
				t.Fatalf("new connection %d went to pod %d, not to pod 1 which holds the fewest", i, got)
			}
		}
	})

	many, addrs := manyClients(t, w, 48)
	for _, sched := range []string{"sh", "mh"} {
		t.Run(sched, func(t *testing.T) {
			reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": sched}}, sched)
			reached := map[int]bool{}
			for _, a := range addrs[:16] {
				c := connectN(t, w, many, a, 5)
				n := 0
				for i, k := range c {
					if k > 0 {
						n++
						reached[i] = true
					}
				}
				if n != 1 {
					t.Fatalf("%s: client %s harness.Spread over %v, want one backend", sched, a, c)
				}
			}
			if len(reached) < 2 {
				t.Fatalf("%s: 16 clients all reached one backend", sched)
			}
		})
	}

	t.Run("mh-removal", func(t *testing.T) {
		before := map[netip.Addr]int{}
		for _, a := range addrs {
			r := lab.ProbeTCP(many, a, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second)
			if r.Verdict != lab.OK {
				t.Fatal(r)
			}
			before[a] = podIndex(t, r.Reply.Local)
		}
		reprogram(t, w, harness.DemoPodIPs[:2], harness.ServiceOpts{Annotations: map[string]string{"xvs.io/scheduler": "mh"}}, "mh")
		moved, hadRemoved := 0, 0
		for _, a := range addrs {
			r := lab.ProbeTCP(many, a, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second)
			if r.Verdict != lab.OK {
				t.Fatal(r)
			}
			if before[a] == 2 {
				hadRemoved++
			}
			if after := podIndex(t, r.Reply.Local); after != before[a] {
				moved++
				if before[a] != 2 {
					t.Errorf("client %s moved from surviving pod %d to pod %d", a, before[a], after)
				}
			}
		}
		frac := float64(moved) / float64(len(addrs))
		t.Logf("mh: removing 1 of 3 backends moved %d of %d clients (%.2f; expected 1/3)", moved, len(addrs), frac)
		// Tolerance: 48 clients, each on the removed backend with
		// probability 1/3: 16 +- 3 standard deviations (9.8).
		if moved != hadRemoved || frac < 0.13 || frac > 0.54 {
			t.Fatalf("moved %d (of which %d had the removed backend): not about 1/3", moved, hadRemoved)
		}
		reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{}, "random")
	})
}

// TestPrivAffinityRealTraffic: ClientIP affinity keeps a client on one
// backend, expires after its timeout, and can be switched on and off while
// traffic runs, without breaking a held connection.
func TestPrivAffinityRealTraffic(t *testing.T) {
	w := newWorld(t)
	rr := map[string]string{"xvs.io/scheduler": "rr"}
	reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: rr, Affinity: 2}, "rr")

	first := connectN(t, w, w.Client, harness.DemoClientIP, 20)
	sticky := -1
	for i, n := range first {
		if n == 20 {
			sticky = i
		}
	}
	if sticky < 0 {
		t.Fatalf("20 connections with ClientIP affinity harness.Spread as %v", first)
	}
	// rr alone would rotate; after the 2s timeout the client gets the
	// next rr choice, which is another pod.
	time.Sleep(2500 * time.Millisecond)
	after := connectN(t, w, w.Client, harness.DemoClientIP, 1)
	if after[sticky] == 1 {
		t.Fatalf("affinity to pod %d outlived its 2s timeout", sticky)
	}

	// Switch affinity off and on while connections keep coming and one
	// connection is held open.
	_, held, err := lab.DialTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var stop atomic.Bool
	var failures atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if r := lab.ProbeTCP(w.Client, harness.DemoClientIP, netip.AddrPortFrom(harness.DemoVIP, 80), 2*time.Second); r.Verdict != lab.OK {
				failures.Add(1)
			}
			if err := lab.EchoCheck(held, 2*time.Second); err != nil {
				failures.Add(1)
			}
		}
	}()
	reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: rr}, "rr")
	if c := connectN(t, w, w.Client, harness.DemoClientIP, 30); c[0] == 0 || c[1] == 0 || c[2] == 0 {
		t.Fatalf("without affinity, rr harness.Spread 30 connections as %v", c)
	}
	reprogram(t, w, harness.DemoPodIPs, harness.ServiceOpts{Annotations: rr, Affinity: 60}, "rr")
	c := connectN(t, w, w.Client, harness.DemoClientIP, 30)
	if c[0] != 30 && c[1] != 30 && c[2] != 30 {
		t.Fatalf("with affinity switched on, 30 connections harness.Spread as %v", c)
	}
	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d connections or echoes failed while affinity was switched", n)
	}
}
