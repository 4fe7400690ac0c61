package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/hack/bench/stages"
	"github.com/xvs-lb/xvs/loader"
)

// Where a conntrack hit's time goes (bin/bench stages, docs/BENCHMARKS-stages.md):
// the stage programs (stages/stages.c) each run one more stage of
// xvs_tc_ingress's path for a packet of an established flow, over the maps
// of a real load with one Service programmed; every sample runs the same
// packet through all of them, the real program and the empty one, on one
// pinned CPU, in a network namespace whose routes let the FIB lookup
// succeed (the backends via a neighbour on a veth), so that forwarding is
// the redirect real traffic gets, not the stack fallback.

// stageStep is one program of the breakdown.
type stageStep struct {
	name string // the program's
	what string // what it adds to the step before it
	want uint32 // its return code when it took the path
	// alone: a helper measured by itself, not a step of the chain.
	alone bool
}

const (
	tcActRedirect = 7
	stagesVeth    = "xvsst0"
	stagesPeer    = "xvsst1"
)

var (
	stagesNodeAddr = netip.MustParsePrefix("192.168.77.1/24")
	stagesGateway  = net.IPv4(192, 168, 77, 2)
	stagesGWMAC    = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x77, 0x02}
)

var stageSteps = []stageStep{
	{name: "xvs_tc_empty", what: "the floor: an empty tc program (what BPF_PROG_TEST_RUN itself costs)", want: tcActOK},
	{name: "stage_scratch", what: "the per-CPU scratch space, packet and decision zeroed", want: tcActOK},
	{name: "stage_parse", what: "the parser (Ethernet, IPv4, TCP)", want: tcActOK},
	{name: "stage_lookup", what: "the conntrack key and the established table's lookup through its slot", want: tcActOK},
	{name: "stage_decide", what: "the rest of the conntrack decision: clock, state, expiry, batched counters, the rewrite it asks for", want: tcActOK},
	{name: "stage_rewrite", what: "the rewrite: destination address and port, IP and TCP checksums (helpers)", want: tcActOK},
	{name: "stage_forward", what: "forwarding instead of the bare rewrite: FIB lookup, MTU check, TTL, MACs, redirect", want: tcActRedirect},
	{name: "xvs_tc_ingress", what: "the real program: VLAN and XDP checks, the verdict counter, the drop monitor's test", want: tcActRedirect},
	{name: "helper_fib", what: "bpf_fib_lookup alone, for the backend (the floor included)", want: tcActOK, alone: true},
	{name: "helper_ct_direct", what: "stage_lookup with the established table named directly, not reached through its slot (the floor and the parser included)", want: tcActOK, alone: true},
	{name: "helper_clock", what: "bpf_ktime_get_ns alone (the floor included)", want: tcActOK, alone: true},
}

type stagesResult struct {
	samples int
	flows   int
	// cold and warm are each step's figures (timeStages).
	cold, warm map[string]stat
	// unreplied is the real program on a SYN of a flow without a reply
	// (the main report's conntrack-hit case).
	unreplied stat
}

func stagesMain(args []string) int {
	fs := flag.NewFlagSet("stages", flag.ContinueOnError)
	out := fs.String("out", "docs/BENCHMARKS-stages.md", "report to write")
	samples := fs.Int("samples", 20000, "timed packets per program")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *samples < 1 || *samples > maxSamples {
		fmt.Fprintf(os.Stderr, "bench stages: -samples must be in 1..%d\n", maxSamples)
		return 2
	}
	start := loadAvg()
	r, err := measureStages(*samples)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench stages:", err)
		return 1
	}
	png := strings.TrimSuffix(*out, ".md") + ".png"
	if err := stagesPlot(png, r); err != nil {
		fmt.Fprintln(os.Stderr, "bench stages:", err)
		return 1
	}
	report := stagesReport(r, filepath.Base(png), strings.TrimSpace("bin/bench stages "+strings.Join(args, " ")), start)
	if err := os.WriteFile(*out, report, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench stages:", err)
		return 1
	}
	os.Stdout.Write(report)
	fmt.Fprintln(os.Stderr, "bench stages: wrote", *out)
	return 0
}

// measureStages runs the breakdown on a thread of its own in a network
// namespace of its own: the thread is never unlocked, so it ends with the
// goroutine, and the namespace (with its veth) with it.
func measureStages(samples int) (stagesResult, error) {
	type result struct {
		r   stagesResult
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("unshare the network namespace: %w", err)}
			return
		}
		r, err := stagesInNetns(samples)
		ch <- result{r, err}
	}()
	res := <-ch
	return res.r, res.err
}

// stagesRoutes gives the namespace a veth pair with the backends routed
// through a permanent neighbour on it; it returns the peer's index, the
// interface the timed packets arrive on.
func stagesRoutes() (int, error) {
	// The FIB lookup answers "forwarding disabled" for an interface that
	// does not forward (a fresh namespace's default). /proc/sys/net is the
	// namespace of the thread that opens it: this one.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0); err != nil {
		return 0, fmt.Errorf("enable forwarding: %w", err)
	}
	la := netlink.NewLinkAttrs()
	la.Name = stagesVeth
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: stagesPeer}); err != nil {
		return 0, fmt.Errorf("add veth: %w", err)
	}
	var links [2]netlink.Link
	for i, name := range []string{stagesVeth, stagesPeer} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return 0, err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return 0, err
		}
		links[i] = l
	}
	idx := [2]int{links[0].Attrs().Index, links[1].Attrs().Index}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: stagesNodeAddr.Addr().AsSlice(), Mask: net.CIDRMask(stagesNodeAddr.Bits(), 32)}}
	if err := netlink.AddrAdd(links[0], addr); err != nil {
		return 0, fmt.Errorf("address: %w", err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx[0], Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: stagesGateway, HardwareAddr: stagesGWMAC}); err != nil {
		return 0, fmt.Errorf("neighbour: %w", err)
	}
	backends := &net.IPNet{IP: backendBase.AsSlice(), Mask: net.CIDRMask(8, 32)}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: idx[0], Dst: backends, Gw: stagesGateway}); err != nil {
		return 0, fmt.Errorf("route: %w", err)
	}
	return idx[1], nil
}

func stagesInNetns(samples int) (_ stagesResult, err error) {
	r := stagesResult{samples: samples, cold: map[string]stat{}, warm: map[string]stat{}}
	ifindex, err := stagesRoutes()
	if err != nil {
		return r, err
	}
	cfg := loader.DefaultConfig()
	r.flows = min(hitFlows, samples)
	cfg.ConntrackSize = max(1<<16, pow2(8*(samples+r.flows)))
	if err := loader.EnsureBPFFS(pinRoot); err != nil {
		return r, err
	}
	objs, dp, done, err := privateDatapath(cfg, "stages")
	if err != nil {
		return r, fmt.Errorf("load the datapath: %w", err)
	}
	defer func() {
		if derr := done(); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := dp.Sync(context.Background(), buildState(1)); err != nil {
		return r, fmt.Errorf("sync: %w", err)
	}
	progs, closeProgs, err := loadStages(privatePinPath("stages"), objs)
	if err != nil {
		return r, err
	}
	defer closeProgs()
	ctx := skbContext{IngressIfindex: uint32(ifindex), Ifindex: uint32(ifindex)}
	acks, syns, err := openStageFlows(objs.XvsTcIngress, ctx, r.flows)
	if err != nil {
		return r, err
	}
	before, err := verdictCount(objs.XvsVerdicts, xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED)
	if err != nil {
		return r, err
	}
	cold, warm, err := timeStages(progs, ctx, acks, samples)
	if err != nil {
		return r, err
	}
	after, err := verdictCount(objs.XvsVerdicts, xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED)
	if err != nil {
		return r, err
	}
	// The real program ran three times per sample; the stage programs do
	// not count verdicts.
	if got := after - before; got != 3*uint64(samples) {
		return r, fmt.Errorf("%d of %d runs of xvs_tc_ingress got verdict fwd_established", got, 3*samples)
	}
	for name, ds := range cold {
		r.cold[name] = summarise(ds)
	}
	for name, ds := range warm {
		r.warm[name] = summarise(ds)
	}
	// The main report's hit case: SYNs of flows that never had a reply.
	unreplied, err := timeUnreplied(objs.XvsTcIngress, ctx, syns, samples)
	if err != nil {
		return r, err
	}
	r.unreplied = summarise(unreplied)
	return r, nil
}

// loadStages loads stages.c's programs over the pinned maps of objs's load
// (every map of the object that is pinned there; the scratch space is
// per-CPU and the object's own), and adds the real and the empty program.
func loadStages(pinPath string, objs *loader.Objects) (map[string]*ebpf.Program, func(), error) {
	spec, err := stages.LoadStages()
	if err != nil {
		return nil, nil, err
	}
	repl := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range repl {
			m.Close()
		}
	}
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // the object's own variables (.rodata: the defaults)
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("pinned map %s: %w", name, err)
		}
		info, err := m.Info()
		if err != nil {
			m.Close()
			closeAll()
			return nil, nil, fmt.Errorf("pinned map %s: %w", name, err)
		}
		ms.MaxEntries = info.MaxEntries
		repl[name] = m
	}
	for _, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone // the private load's pins are taken above
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	closeAll()
	if err != nil {
		return nil, nil, fmt.Errorf("load the stage programs: %w", err)
	}
	progs := map[string]*ebpf.Program{"xvs_tc_empty": objs.XvsTcEmpty, "xvs_tc_ingress": objs.XvsTcIngress}
	for name, p := range coll.Programs {
		progs[name] = p
	}
	for _, s := range stageSteps {
		if progs[s.name] == nil {
			coll.Close()
			return nil, nil, fmt.Errorf("no program %s", s.name)
		}
	}
	return progs, coll.Close, nil
}

// openStageFlows opens n flows to Service 0 through the real program as
// they open in real traffic: the client's SYN (DNATed to a backend), the
// backend's SYN-ACK (which moves the flow to the established table); the
// timed packets are the clients' next segments (ACKs). syns are n SYNs of
// other flows, left without a reply.
func openStageFlows(prog *ebpf.Program, ctx skbContext, n int) (acks, syns [][]byte, err error) {
	vip := vipOf(0)
	for i := range n {
		sport := uint16(1024 + i)
		syn, err := tcpPacket(hitClient, sport, vip, servicePort, tcpSYN)
		if err != nil {
			return nil, nil, err
		}
		out := make([]byte, len(syn)+256)
		ret, _, err := testRun(prog, syn, out, ctx)
		if err != nil {
			return nil, nil, err
		}
		if ret != tcActRedirect {
			return nil, nil, fmt.Errorf("SYN of flow %d: xvs_tc_ingress returned %d, want a redirect (%d)", i, ret, tcActRedirect)
		}
		backend, bport, err := tcpDestination(out[:len(syn)])
		if err != nil {
			return nil, nil, err
		}
		synack, err := tcpPacket(backend, bport, hitClient, sport, tcpSYN|tcpACK)
		if err != nil {
			return nil, nil, err
		}
		if _, _, err := testRun(prog, synack, nil, ctx); err != nil {
			return nil, nil, err
		}
		ack, err := tcpPacket(hitClient, sport, vip, servicePort, tcpACK)
		if err != nil {
			return nil, nil, err
		}
		acks = append(acks, ack)
		other, err := tcpPacket(hitClient, sport+uint16(n), vip, servicePort, tcpSYN)
		if err != nil {
			return nil, nil, err
		}
		if _, _, err := testRun(prog, other, nil, ctx); err != nil {
			return nil, nil, err
		}
		syns = append(syns, other)
	}
	return acks, syns, nil
}

// timeStages times every step on every sample twice: cold, on a flow
// no program has touched for about as many runs as there are flows (step
// k of sample i takes flow i + k*stride, so every step meets its flows as
// seldom touched as every other), and warm, right after an untimed run of
// the same step on the same packet. The steps start at another one each
// sample, and each return code is checked.
func timeStages(progs map[string]*ebpf.Program, ctx skbContext, pkts [][]byte, samples int) (cold, warm map[string][]time.Duration, err error) {
	defer pinThread()()
	cold, warm = map[string][]time.Duration{}, map[string][]time.Duration{}
	stride := max(len(pkts)/len(stageSteps), 1)
	run := func(s stageStep, pkt []byte) (time.Duration, error) {
		ret, d, err := testRun(progs[s.name], pkt, nil, ctx)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", s.name, err)
		}
		if ret != s.want {
			return 0, fmt.Errorf("%s returned %d, want %d: it did not take the path it measures", s.name, ret, s.want)
		}
		return d, nil
	}
	for i := range samples {
		for k := range stageSteps {
			s := stageSteps[(i+k)%len(stageSteps)]
			d, err := run(s, pkts[(i+k*stride)%len(pkts)])
			if err != nil {
				return nil, nil, err
			}
			cold[s.name] = append(cold[s.name], d)
			pkt := pkts[(i+k*stride+stride/2)%len(pkts)]
			if _, err := run(s, pkt); err != nil {
				return nil, nil, err
			}
			if d, err = run(s, pkt); err != nil {
				return nil, nil, err
			}
			warm[s.name] = append(warm[s.name], d)
		}
	}
	return cold, warm, nil
}

// timeUnreplied times the real program on SYNs of flows that had no reply
// (a lookup that misses the established table and hits the unreplied one).
func timeUnreplied(prog *ebpf.Program, ctx skbContext, syns [][]byte, samples int) ([]time.Duration, error) {
	defer pinThread()()
	var ds []time.Duration
	for i := range samples {
		ret, d, err := testRun(prog, syns[i%len(syns)], nil, ctx)
		if err != nil {
			return nil, err
		}
		if ret != tcActRedirect {
			return nil, fmt.Errorf("SYN of an unreplied flow: xvs_tc_ingress returned %d", ret)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

const (
	tcpSYN = 1 << iota
	tcpACK
)

// tcpPacket is an Ethernet, IPv4 and TCP segment with valid checksums.
func tcpPacket(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags int) ([]byte, error) {
	eth := &layers.Ethernet{
		SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4,
	}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1000, Window: 65535,
		SYN: flags&tcpSYN != 0, ACK: flags&tcpACK != 0}
	if tcp.ACK {
		tcp.Ack = 5000
	}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		return nil, err
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tcpDestination reads a rewritten IPv4 packet's destination.
func tcpDestination(pkt []byte) (netip.Addr, uint16, error) {
	p := gopacket.NewPacket(pkt, layers.LayerTypeEthernet, gopacket.Default)
	ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if ip == nil || tcp == nil {
		return netip.Addr{}, 0, errors.New("the rewritten packet is not IPv4 TCP")
	}
	a, _ := netip.AddrFromSlice(ip.DstIP.To4())
	return a, uint16(tcp.DstPort), nil
}

// skbContext is the head of struct __sk_buff up to ifindex, the part
// BPF_PROG_TEST_RUN takes: the packet arrives on Ifindex (the device it
// runs on), and the program's skb->ingress_ifindex is IngressIfindex. The
// other fields must be zero.
type skbContext struct {
	_              [9]uint32
	IngressIfindex uint32
	Ifindex        uint32
}

// testRun is one BPF_PROG_TEST_RUN with repeat 1 and a context, which
// cilium/ebpf's Benchmark does not take; out (optional) receives the
// packet as the program left it. The duration is the kernel's.
func testRun(p *ebpf.Program, pkt, out []byte, ctx skbContext) (uint32, time.Duration, error) {
	attr := struct {
		progFD, retval, sizeIn, sizeOut uint32
		dataIn, dataOut                 uint64
		repeat, duration                uint32
		ctxSizeIn, ctxSizeOut           uint32
		ctxIn, ctxOut                   uint64
		flags, cpu, batchSize, _        uint32
	}{
		progFD: uint32(p.FD()), sizeIn: uint32(len(pkt)), dataIn: uint64(uintptr(unsafe.Pointer(&pkt[0]))),
		repeat: 1, ctxSizeIn: uint32(unsafe.Sizeof(ctx)), ctxIn: uint64(uintptr(unsafe.Pointer(&ctx))),
	}
	if len(out) > 0 {
		attr.sizeOut, attr.dataOut = uint32(len(out)), uint64(uintptr(unsafe.Pointer(&out[0])))
	}
	const bpfProgTestRun = 10
	_, _, errno := unix.Syscall(unix.SYS_BPF, bpfProgTestRun, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(pkt)
	runtime.KeepAlive(out)
	runtime.KeepAlive(&ctx)
	if errno != 0 {
		return 0, 0, fmt.Errorf("BPF_PROG_TEST_RUN %s: %w", p, errno)
	}
	return attr.retval, time.Duration(attr.duration), nil
}

// increments are each chained step's median above the step before it
// (the floor's own median first), in stageSteps' order.
func increments(st map[string]stat) (names []string, inc []float64) {
	prev := 0.0
	for _, s := range stageSteps {
		if s.alone {
			continue
		}
		m := st[s.name].Median
		names = append(names, strings.TrimPrefix(strings.TrimPrefix(s.name, "stage_"), "xvs_tc_"))
		inc = append(inc, m-prev)
		prev = m
	}
	return names, inc
}

// stagesPlot draws each step's increment over the one before it, cold and
// warm side by side.
func stagesPlot(path string, r stagesResult) error {
	p := plot.New()
	p.Title.Text = "xvs tc ingress, packet of an established flow: ns per stage (median increments)"
	p.Y.Label.Text = "ns"
	names, cold := increments(r.cold)
	_, warm := increments(r.warm)
	w := vg.Points(14)
	for i, set := range []struct {
		name string
		vals []float64
	}{{"cold entry", cold}, {"warm entry", warm}} {
		vals := make(plotter.Values, len(set.vals))
		for k, v := range set.vals {
			vals[k] = max(v, 0)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Offset = vg.Length(2*i-1) * w / 2
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(set.name, bars)
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.NominalX(names...)
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}

func stagesReport(r stagesResult, png, cmd, loadStart string) []byte {
	var b bytes.Buffer
	var u unix.Utsname
	_ = unix.Uname(&u)
	fmt.Fprintf(&b, "# Where a conntrack hit's time goes\n\n")
	fmt.Fprintf(&b, "Generated by `%s` (`make bench-stages`) on %s, %d samples per program and temperature.\n", cmd, time.Now().UTC().Format("2006-01-02 15:04 MST"), r.samples)
	fmt.Fprintf(&b, "Machine: Linux %s, %s, %d CPUs; load average %s at the start, %s at the end (the machine is shared: compare figures of one run).\n\n",
		unix.ByteSliceToString(u.Release[:]), cpuModel(), runtime.NumCPU(), loadStart, loadAvg())
	fmt.Fprintf(&b, `The packet is a TCP segment (ACK) of one of %d established flows to a ClusterIP with
10 backends: each flow opened as in real traffic (the client's SYN through `+"`xvs_tc_ingress`"+`,
then the backend's SYN-ACK through it, which moves the flow to the established table).
Each program below is cut after one more stage of `+"`xvs_tc_ingress`"+`'s path for that
packet (hack/bench/stages/stages.c: the datapath's own bpf/lib functions, loaded over the
maps of a real load). Every run is one `+"`BPF_PROG_TEST_RUN`"+` (repeat 1, the kernel's own
time of the run) on one pinned CPU, in a network namespace where the backends are routed
through a permanent neighbour on a veth and the packet arrives on that veth's peer, so
forwarding is the FIB lookup and redirect of real traffic (the main report's per-packet
figures run without a route, and so take the stack fallback).

- **cold**: each sample runs every program once, each on another flow, so that every
  program meets flows that no run has touched for about as many runs as there are flows
  (the conntrack entry is out of the caches, as it is for a packet of one flow among many).
- **warm**: each program runs twice on the same packet, and the second run is timed (the
  entry was touched a moment ago).

The programs start at another one each sample; every run's return code is checked (each
program must reach its stage; the real one must redirect), and the real program's verdict
counter must show exactly one established-flow verdict per run.

| program | adds | cold median (ns) | cold increment | warm median (ns) | warm increment |
|---|---|---:|---:|---:|---:|
`, r.flows)
	_, coldInc := increments(r.cold)
	_, warmInc := increments(r.warm)
	chained := 0
	for _, s := range stageSteps {
		ci, wi := "-", "-"
		if !s.alone {
			if chained > 0 {
				ci, wi = fmt.Sprintf("%.0f", coldInc[chained]), fmt.Sprintf("%.0f", warmInc[chained])
			}
			chained++
		}
		fmt.Fprintf(&b, "| `%s` | %s | %.0f | %s | %.0f | %s |\n", s.name, s.what, r.cold[s.name].Median, ci, r.warm[s.name].Median, wi)
	}
	floorC, fullC := r.cold["xvs_tc_empty"].Median, r.cold["xvs_tc_ingress"].Median
	floorW, fullW := r.warm["xvs_tc_empty"].Median, r.warm["xvs_tc_ingress"].Median
	fmt.Fprintf(&b, "\n![median increment of each stage](%s)\n\n", png)
	fmt.Fprintf(&b, "**The real program above the floor: %.0f ns cold, %.0f ns warm** for a segment of an established flow, forwarded by redirect. "+
		"For comparison, the same program on SYNs resent on flows that never had a reply, rotating over %d of them (the main report's \"conntrack hit\": "+
		"a miss in the established table, the old-slot check, a hit in the unreplied table; here with a route): %.0f ns median, %.0f ns above the floor.\n\n",
		fullC-floorC, fullW-floorW, r.flows, r.unreplied.Median, r.unreplied.Median-floorC)
	b.WriteString("Increments are differences of medians of separate programs, so they are estimates: a stage's cost can shift with what the compiler keeps in registers across the cut, and an increment at or below zero means the stage costs less than the noise. The helpers measured alone include the floor. " +
		"What a redirect does after the program returns (the packet's transmit on the egress device; with `bpf_redirect_neigh`, its own route and neighbour lookups) is not in these figures: a change that moves work from the program into the redirect looks free here and must be judged by real forwarding (the traffic benchmark).\n")
	return b.Bytes()
}
