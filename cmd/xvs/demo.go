package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
)

// runDemo builds a node in network namespaces, serves a Service through xvs
// and sends real TCP and UDP traffic to its VIP.
func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	conns := fs.Int("connections", 30, "TCP connections and UDP datagrams to send")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the demo creates network namespaces and loads BPF: run it as root")
	}
	// A closed pipe (xvs demo | head) must not kill the demo before it
	// cleans up; a Ctrl-C ends the traffic and still cleans up.
	signal.Ignore(syscall.SIGPIPE)
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(interrupted)
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Println("==> building a node, three backend pods and a client in network namespaces")
	w, err := newSingleNode("demo", bin)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("==> cleaning up (agent, pins, namespaces)")
		w.Close()
	}()
	go func() {
		if _, ok := <-interrupted; ok {
			fmt.Println("==> interrupted: cleaning up")
			w.Close()
			os.Exit(130)
		}
	}()
	if err := w.writeService(demoPodIPs); err != nil {
		return err
	}
	fmt.Printf("    node %s (%s), pods %v, client %s\n", w.Node.Name, demoNodeIP, demoPodIPs, demoClientIP)
	fmt.Printf("==> starting `xvs agent --objects %s` in the node namespace\n", w.Dir)
	if err := w.startAgent(); err != nil {
		return err
	}
	if err := w.waitProgrammed(len(demoPodIPs), 15*time.Second); err != nil {
		return err
	}

	tcp := netip.AddrPortFrom(demoVIP, 80)
	udp := netip.AddrPortFrom(demoVIP, 53)
	fmt.Printf("==> %d TCP connections from the client to %s\n", *conns, tcp)
	tcpSpread, err := spread(*conns, func() lab.Result { return lab.ProbeTCP(w.Client, demoClientIP, tcp, 2*time.Second) })
	if err != nil {
		return err
	}
	printSpread(tcpSpread, *conns)
	fmt.Printf("==> %d UDP datagrams from the client to %s\n", *conns, udp)
	udpSpread, err := spread(*conns, func() lab.Result { return lab.ProbeUDP(w.Client, demoClientIP, udp, 2*time.Second) })
	if err != nil {
		return err
	}
	printSpread(udpSpread, *conns)

	fmt.Printf("==> xvs list --pin-path %s\n", w.PinPath)
	m, err := maps.OpenPinned(w.PinPath)
	if err != nil {
		return err
	}
	defer m.Close()
	snap, err := m.Read(true)
	if err != nil {
		return err
	}
	printList(os.Stdout, snap, false)
	fmt.Printf("\n==> xvs list --stats --pin-path %s\n", w.PinPath)
	printList(os.Stdout, snap, true)
	if len(tcpSpread) != len(demoPodIPs) || len(udpSpread) != len(demoPodIPs) {
		return fmt.Errorf("traffic did not reach all %d backends", len(demoPodIPs))
	}
	return nil
}

// spread runs n probes and counts which backend answered each. Every
// answer must show the client's own address as the peer: ClusterIP traffic
// is not masqueraded.
func spread(n int, probe func() lab.Result) (map[netip.AddrPort]int, error) {
	out := map[netip.AddrPort]int{}
	for range n {
		r := probe()
		if r.Verdict != lab.OK {
			return out, fmt.Errorf("probe failed: %v", r)
		}
		if r.Reply.Peer.Addr() != demoClientIP {
			return out, fmt.Errorf("backend saw %s, not the client's address", r.Reply.Peer)
		}
		out[r.Reply.Local]++
	}
	return out, nil
}

func printSpread(s map[netip.AddrPort]int, n int) {
	keys := make([]netip.AddrPort, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b netip.AddrPort) int { return a.Compare(b) })
	for _, k := range keys {
		bar := ""
		for range s[k] {
			bar += "#"
		}
		fmt.Printf("    %-18s %3d/%d %s\n", k, s[k], n, bar)
	}
}
