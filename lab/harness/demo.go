package harness

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// RunDemo builds a node in network namespaces, serves a Service through xvs
// and sends real TCP and UDP traffic to its VIP.
func RunDemo(args []string) error {
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
	w, err := NewSingle("demo", bin)
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
	if err := w.WriteService(DemoPodIPs); err != nil {
		return err
	}
	fmt.Printf("    node %s (%s), pods %v, client %s\n", w.Node.Name, DemoNodeIP, DemoPodIPs, DemoClientIP)
	fmt.Printf("==> starting `xvs agent --objects %s` in the node namespace\n", w.Dir)
	if err := w.StartAgent(); err != nil {
		return err
	}
	if err := w.WaitProgrammed(len(DemoPodIPs), 15*time.Second); err != nil {
		return err
	}

	tcp := netip.AddrPortFrom(DemoVIP, 80)
	udp := netip.AddrPortFrom(DemoVIP, 53)
	fmt.Printf("==> %d TCP connections from the client to %s\n", *conns, tcp)
	tcpSpread, err := Spread(*conns, func() lab.Result { return lab.ProbeTCP(w.Client, DemoClientIP, tcp, 2*time.Second) })
	if err != nil {
		return err
	}
	printSpread(tcpSpread, *conns)
	fmt.Printf("==> %d UDP datagrams from the client to %s\n", *conns, udp)
	udpSpread, err := Spread(*conns, func() lab.Result { return lab.ProbeUDP(w.Client, DemoClientIP, udp, 2*time.Second) })
	if err != nil {
		return err
	}
	printSpread(udpSpread, *conns)

	// What an operator would type on the node.
	for _, args := range [][]string{{"list"}, {"list", "--stats"}} {
		args = append(args, "--pin-path", w.PinPath)
		fmt.Printf("\n==> xvs %s\n", strings.Join(args, " "))
		out, err := lab.Run(w.Node.NS, bin, args...)
		os.Stdout.Write(out)
		if err != nil {
			return fmt.Errorf("xvs %s: %w", strings.Join(args, " "), err)
		}
	}
	if len(tcpSpread) != len(DemoPodIPs) || len(udpSpread) != len(DemoPodIPs) {
		return fmt.Errorf("traffic did not reach all %d backends", len(DemoPodIPs))
	}
	return nil
}

// Spread runs n probes and counts which backend answered each. Every
// answer must show the client's own address as the peer: ClusterIP traffic
// is not masqueraded.
func Spread(n int, probe func() lab.Result) (map[netip.AddrPort]int, error) {
	out := map[netip.AddrPort]int{}
	for range n {
		r := probe()
		if r.Verdict != lab.OK {
			return out, fmt.Errorf("probe failed: %v", r)
		}
		if r.Reply.Peer.Addr() != DemoClientIP {
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
