package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// The XDP benchmark's NodePort Services on the node's address: one with
// externalTrafficPolicy Local and a local endpoint (DNAT only), one with
// Cluster and remote endpoints (DNAT and masquerade to the node address).
var (
	xdpNodeIP      = netip.MustParseAddr("198.51.100.2")
	xdpLocalEP     = netip.MustParseAddr("10.244.0.11")
	xdpRemoteEPs   = netip.MustParseAddr("10.245.0.0") // + 1..xdpRemoteCount
	xdpClientBase  = netip.MustParseAddr("203.0.113.0")
	xdpHitClient   = netip.MustParseAddr("192.0.2.77")
	xdpLocalPort   = uint16(30001)
	xdpRemotePort  = uint16(30002)
	xdpRemoteCount = 10 // masquerade ports are per backend: 10 backends give room for every sample
)

const xdpPass = 2 // XDP_PASS: translated packets go up with the mark

type xdpCase struct {
	Name   string
	Port   uint16
	Hit    bool
	Remote bool
}

var xdpCases = []xdpCase{
	{"NodePort, local backend (eTP=Local): new flow", xdpLocalPort, false, false},
	{"NodePort, local backend (eTP=Local): conntrack hit", xdpLocalPort, true, false},
	{"NodePort, remote backend with SNAT (eTP=Cluster): new flow", xdpRemotePort, false, true},
	{"NodePort, remote backend with SNAT (eTP=Cluster): conntrack hit", xdpRemotePort, true, true},
}

type xdpResult struct {
	Case       xdpCase
	Xdp, Empty stat
}

// measureXDP times NodePort packets through xvs_xdp beside xvs_xdp_empty,
// with the per-packet method of the tc benchmark, and checks one
// translated packet of each case byte for byte.
func measureXDP(ctx context.Context, opts Options) (rs []xdpResult, err error) {
	if err := loader.XDPSupported(); errors.Is(err, loader.ErrXDPUnsupported) {
		logf(opts.Log, "xdp: not measured: %v", err)
		return nil, nil // the report says why
	}
	cfg := loader.DefaultConfig()
	samples := min(opts.Samples, 20000)
	cfg.ConntrackSize = max(1<<16, pow2(8*(samples+hitFlows)))
	objs, dp, done, err := privateDatapath(cfg, "xdp")
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := done(); derr != nil && err == nil {
			err = derr
		}
	}()
	prog, err := objs.XDPProgram()
	if err != nil {
		return nil, err
	}
	if err := dp.Sync(ctx, xdpState()); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	if p := dp.Problems(); len(p) > 0 {
		return nil, fmt.Errorf("sync problems: %v", p)
	}
	for i, c := range xdpCases {
		pkts, err := xdpPackets(c, i, samples)
		if err != nil {
			return nil, err
		}
		check := pkts[0]
		if !c.Hit { // a flow of its own, so that every timed packet is new
			check, pkts = pkts[len(pkts)-1], pkts[:len(pkts)-1]
		}
		if err := checkXDPRewrite(prog, c, check); err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		if c.Hit { // the check above opened the first flow; open the rest
			for k, p := range pkts[1:] {
				if _, err := runXDP(prog, p); err != nil {
					return nil, fmt.Errorf("%s: opening flow %d of %d: %w (drop verdicts so far: %s)", c.Name, k+2, len(pkts), err, dropVerdicts(objs.XvsVerdicts))
				}
			}
		}
		v := xbpf.XvsXvsVerdictXVS_V_FWD_NEW
		if c.Hit {
			v = xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED
		}
		before, err := verdictCount(objs.XvsVerdicts, v)
		if err != nil {
			return nil, err
		}
		xdp, empty, err := timeXDP(ctx, prog, objs.XvsXdpEmpty, pkts, samples)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (drop verdicts so far: %s)", c.Name, err, dropVerdicts(objs.XvsVerdicts))
		}
		after, err := verdictCount(objs.XvsVerdicts, v)
		if err != nil {
			return nil, err
		}
		if got := after - before; got != uint64(samples) {
			return nil, fmt.Errorf("%s: %d of %d timed packets got verdict %d", c.Name, got, samples, v)
		}
		r := xdpResult{Case: c, Xdp: summarise(xdp), Empty: summarise(empty)}
		logf(opts.Log, "xdp %s: %.0f ns, empty %.0f ns (medians)", c.Name, r.Xdp.Median, r.Empty.Median)
		rs = append(rs, r)
	}
	return rs, nil
}

func xdpState() *model.State {
	st := &model.State{Node: model.Node{Name: "node", Addresses: []netip.Addr{xdpNodeIP}}, Services: map[model.ServicePortName]*model.ServicePort{}}
	local := model.Endpoint{Addr: xdpLocalEP, Port: backendPort, Ready: true, Serving: true, Weight: 1, Local: true}
	st.Services[model.ServicePortName{Namespace: "bench", Name: "np-local", Protocol: model.TCP}] = &model.ServicePort{
		Name:             model.ServicePortName{Namespace: "bench", Name: "np-local", Protocol: model.TCP},
		Frontends:        []model.Frontend{{Kind: model.NodePort, Addr: xdpNodeIP, Port: xdpLocalPort, Proto: model.TCP}},
		ClusterEndpoints: []model.Endpoint{local}, LocalEndpoints: []model.Endpoint{local},
		ExternalLocal: true, HasEndpoints: true, LocalReady: 1,
	}
	remote := &model.ServicePort{
		Name:         model.ServicePortName{Namespace: "bench", Name: "np-remote", Protocol: model.TCP},
		Frontends:    []model.Frontend{{Kind: model.NodePort, Addr: xdpNodeIP, Port: xdpRemotePort, Proto: model.TCP}},
		HasEndpoints: true,
	}
	for i := range xdpRemoteCount {
		remote.ClusterEndpoints = append(remote.ClusterEndpoints, model.Endpoint{Addr: addAddr(xdpRemoteEPs, 1+i), Port: backendPort, Ready: true, Serving: true, Weight: 1})
	}
	st.Services[remote.Name] = remote
	return st
}

// xdpPackets: a hit rotates over hitFlows flows of one client; a new flow
// is a fresh client address:port every sample (case i has its own).
func xdpPackets(c xdpCase, i, samples int) ([][]byte, error) {
	count := samples + 1
	if c.Hit {
		count = min(hitFlows, samples)
	}
	pkts := make([][]byte, count)
	for k := range pkts {
		src, sport := addAddr(xdpHitClient, i), 1024+k // each hit case its own client
		if !c.Hit {
			n := i*maxSamples + k
			src, sport = addAddr(xdpClientBase, n/portsPerClient), 1024+n%portsPerClient
		}
		var err error
		if pkts[k], err = synPacketTo(src, uint16(sport), xdpNodeIP, c.Port); err != nil {
			return nil, err
		}
	}
	return pkts, nil
}

// checkXDPRewrite runs one packet and checks the translation: DNAT to the
// backend port, and the node's address as source exactly when remote.
func checkXDPRewrite(p *ebpf.Program, c xdpCase, pkt []byte) error {
	out := make([]byte, len(pkt)+256)
	ret, err := p.Run(&ebpf.RunOptions{Data: pkt, DataOut: out})
	if err != nil {
		return err
	}
	if ret != xdpPass {
		return fmt.Errorf("xvs_xdp returned %d, want XDP_PASS", ret)
	}
	// The output starts with the XDP metadata the program reserved; the
	// Ethernet header (whose MACs XDP leaves alone) follows it.
	off := bytes.Index(out[:min(len(out), 64+12)], pkt[:12])
	if off < 0 {
		return fmt.Errorf("no Ethernet header in the output")
	}
	pk := gopacket.NewPacket(out[off:off+len(pkt)], layers.LayerTypeEthernet, gopacket.Default)
	ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if ip == nil || tcp == nil {
		return fmt.Errorf("no IPv4/TCP packet out")
	}
	src, _ := netip.AddrFromSlice(ip.SrcIP)
	dst, _ := netip.AddrFromSlice(ip.DstIP)
	if uint16(tcp.DstPort) != backendPort || dst == xdpNodeIP {
		return fmt.Errorf("not translated: %v -> %v:%d", src, dst, tcp.DstPort)
	}
	if snat := src == xdpNodeIP; snat != c.Remote {
		return fmt.Errorf("source %v after XDP: masquerade %v, want %v", src, snat, c.Remote)
	}
	return nil
}

func runXDP(p *ebpf.Program, pkt []byte) (time.Duration, error) {
	ret, d, err := p.Benchmark(pkt, 1, nil)
	if err != nil {
		return 0, err
	}
	if ret != xdpPass {
		return 0, fmt.Errorf("%s returned %d, want XDP_PASS", p, ret)
	}
	return d, nil
}

// timeXDP interleaves the two programs as timePairs does for tc.
func timeXDP(ctx context.Context, prog, empty *ebpf.Program, pkts [][]byte, samples int) (x, e []time.Duration, err error) {
	defer pinThread()()
	progs := [2]*ebpf.Program{prog, empty}
	out := [2][]time.Duration{make([]time.Duration, 0, samples), make([]time.Duration, 0, samples)}
	for i := range samples {
		if i%1024 == 0 && ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		for k := range 2 {
			p := (i + k) % 2
			d, err := runXDP(progs[p], pkts[i%len(pkts)])
			if err != nil {
				return nil, nil, err
			}
			out[p] = append(out[p], d)
		}
	}
	return out[0], out[1], nil
}

// writeXDP renders the XDP per-packet section.
func writeXDP(b *bytes.Buffer, rs []xdpResult, samples int) {
	fmt.Fprintf(b, "## XDP per-packet\n\n")
	fmt.Fprintf(b, "`xvs_xdp` (the fast path for the node's external interfaces) beside `xvs_xdp_empty` (an XDP program that only returns XDP_PASS: the floor), same method as the tc figures: one `BPF_PROG_TEST_RUN` with repeat 1 per sample, interleaved, pinned CPU, verdict counters checked, %d samples per case. Two NodePort Services on the node address %s: eTP=Local with a local endpoint (DNAT only), and eTP=Cluster with %d remote endpoints (DNAT and masquerade to the node address; one translated packet of each case is checked for it). The program rewrites in place and returns XDP_PASS with a mark for tc, which then only forwards.\n\n",
		min(samples, 20000), xdpNodeIP, xdpRemoteCount)
	if len(rs) == 0 {
		fmt.Fprintf(b, "Not measured on this machine: %v.\n\n", loader.XDPSupported())
		return
	}
	fmt.Fprintf(b, "| Case | xvs_xdp median (ns) | mean (ns) | empty median (ns) | above floor, median (ns) |\n|---|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(b, "| %s | %.0f | %.1f | %.0f | %.0f |\n", r.Case.Name, r.Xdp.Median, r.Xdp.Mean, r.Empty.Median, r.Xdp.Median-r.Empty.Median)
	}
	fmt.Fprintln(b)
}

// dropVerdicts lists the drop verdicts counted so far, to say why a
// packet the benchmark expected to pass was dropped.
func dropVerdicts(m *ebpf.Map) string {
	var out []string
	for v := range xbpf.Verdict(64) {
		name := maps.VerdictName(v)
		if !strings.HasPrefix(name, "drop") {
			continue
		}
		if n, err := verdictCount(m, v); err == nil && n > 0 {
			out = append(out, fmt.Sprintf("%s %d", name, n))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
