package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"sigs.k8s.io/yaml"

	"github.com/xvs-lb/xvs/agent"
	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/ipvs"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// runList prints the pinned maps the way ipvsadm -Ln prints IPVS. It opens
// the maps read-only: listing never changes the datapath.
func runList(args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	stats := fs.Bool("stats", false, "show connection, packet and byte counters")
	output := fs.String("o", "text", "output format: text, json or yaml (their schemaVersion field names the layout: docs/configuration.md)")
	mode := fs.String("proxy-mode", "auto", "datapath to list: ebpf, ipvs, or auto (ebpf if its maps are pinned, else ipvs)")
	rate := fs.Bool("rate", false, "show rates (ipvsadm -Ln --rate): connections, packets and bytes per second, from two reads --interval apart")
	interval := fs.Duration("interval", time.Second, "with --rate in ebpf mode: time between the two reads (ipvs mode shows the kernel's own estimates, as ipvsadm does)")
	var conns bool
	fs.BoolVar(&conns, "c", false, "list connections instead (ipvsadm -Lnc): client, frontend, backend, state, expiry")
	fs.BoolVar(&conns, "connections", false, "same as -c")
	var filter maps.ConnectionFilter
	for _, f := range []struct {
		name  string
		proto model.Protocol
	}{{"t", model.TCP}, {"tcp-service", model.TCP}, {"u", model.UDP}, {"udp-service", model.UDP}, {"sctp-service", model.SCTP}} {
		fs.Func(f.name, "only this "+f.proto.String()+" virtual server, ADDR:PORT or ADDR (every port); none there is an error, no such service, as in ipvsadm (with -c: only its connections)", func(v string) error {
			ap, err := parseFrontend(v)
			filter.Protocol, filter.Virtual = f.proto, ap
			return err
		})
	}
	// ipvsadm sorts unless told --nosort and takes --sort as a no-op for
	// compatibility; xvs always sorts (Snapshot.Sort) and takes it too.
	fs.Bool("sort", false, "accepted for ipvsadm habits: the listing is always sorted (IPv4 before IPv6, then protocol, address, port; backends by address, port)")
	ic := ipvsListFlags(fs)
	servicesFile := fs.String("services-file", "", "the agent's --services-file: Service names and endpoint states (default /run/xvs/services-<netns inode>.json)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names, err := agent.ReadServicesFile(*servicesFile)
	if err != nil {
		slog.Warn("No Service names", "err", err)
	}
	if conns {
		return listConnections(*mode, *pinPath, *output, filter, names)
	}
	if *rate {
		return listRates(*mode, *pinPath, *output, *interval, *ic, filter)
	}
	snap, err := readSelected(*mode, *pinPath, *stats, *ic, filter)
	if err != nil {
		return err
	}
	if names != nil {
		names.Annotate(snap)
	}
	if *output == "text" {
		printList(os.Stdout, snap, *stats)
		return nil
	}
	return printStructured(os.Stdout, *output, "xvs.list/v1", snap)
}

// listMode resolves --proxy-mode=auto: ebpf if its maps are pinned, else
// ipvs.
func listMode(mode, pinPath string) string {
	if mode != "auto" {
		return mode
	}
	if _, err := os.Stat(pinPath); err != nil {
		return string(model.ModeIPVS)
	}
	return string(model.ModeEBPF)
}

// readSelected reads what either mode programmed and keeps the virtual
// servers f names (selectFrontends).
func readSelected(mode, pinPath string, stats bool, ic ipvs.Config, f maps.ConnectionFilter) (*maps.Snapshot, error) {
	snap, err := readSnapshot(mode, pinPath, stats, ic)
	if err != nil {
		return nil, err
	}
	return snap, selectFrontends(snap, f)
}

func readSnapshot(mode, pinPath string, stats bool, ic ipvs.Config) (*maps.Snapshot, error) {
	if listMode(mode, pinPath) == string(model.ModeIPVS) {
		return listIPVS(stats, ic)
	}
	m, err := maps.OpenPinned(pinPath)
	if err != nil {
		return nil, fmt.Errorf("%w (is the agent running with --pin-path=%s?)", err, pinPath)
	}
	defer m.Close()
	return m.Read(stats)
}

// selectFrontends keeps the virtual servers of f's Protocol and Virtual
// (-t, -u, --sctp-service; none set: all). Where none is left it fails, as
// ipvsadm -L -t of a missing virtual server fails with "No such service":
// a mistyped address must not read as a listing with nothing in it.
func selectFrontends(snap *maps.Snapshot, f maps.ConnectionFilter) error {
	if !f.Virtual.IsValid() || snap.Select(f.Protocol, f.Virtual) {
		return nil
	}
	where := f.Virtual.String()
	if f.Virtual.Port() == 0 {
		where = f.Virtual.Addr().String() + " (any port)"
	}
	return fmt.Errorf("no such service: %s %s", f.Protocol, where)
}

func printList(out io.Writer, snap *maps.Snapshot, stats bool) {
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	if len(snap.Services) > 0 && snap.Services[0].Kind == "ipvs" {
		fmt.Fprintln(w, "xvs (IPVS) virtual servers")
	} else {
		fmt.Fprintln(w, "xvs (eBPF) virtual servers")
	}
	if stats {
		fmt.Fprintln(w, "Prot LocalAddress:Port\tConns\tInPkts\tOutPkts\tInBytes\tOutBytes")
		fmt.Fprintln(w, "  -> RemoteAddress:Port\t\t\t\t\t")
	} else {
		fmt.Fprintln(w, "Prot LocalAddress:Port Scheduler Flags  Service")
		fmt.Fprintln(w, "  -> RemoteAddress:Port\tForward\tWeight\tActiveConn\tInActConn\tState")
	}
	for _, s := range snap.Services {
		if stats {
			fmt.Fprintf(w, "%-4s %s\t%d\t%d\t%d\t%d\t%d\n", s.Protocol, s.Address,
				s.Stats.Conns, s.Stats.PacketsIn, s.Stats.PacketsOut, s.Stats.BytesIn, s.Stats.BytesOut)
			for _, b := range s.Backends {
				fmt.Fprintf(w, "  -> %s\t%d\t%d\t%d\t%d\t%d\n", b.Address,
					b.Stats.Conns, b.Stats.PacketsIn, b.Stats.PacketsOut, b.Stats.BytesIn, b.Stats.BytesOut)
			}
			continue
		}
		line := fmt.Sprintf("%-4s %s %s", s.Protocol, s.Address, s.Scheduler)
		if s.Affinity > 0 {
			line += fmt.Sprintf(" persistent %d", s.Affinity)
		}
		flags := slices.DeleteFunc(slices.Clone(s.Flags), func(f string) bool { return f == "persistent" })
		if len(flags) > 0 {
			line += fmt.Sprintf(" (%s", s.Kind)
			for _, f := range flags {
				line += "," + f
			}
			line += ")"
		} else {
			line += fmt.Sprintf(" (%s)", s.Kind)
		}
		if s.Service != nil {
			line += "  " + s.Service.String()
		}
		fmt.Fprintln(w, line)
		for _, b := range s.Backends {
			fmt.Fprintf(w, "  -> %s\tMasq\t%d\t%d\t%d\t%s\n", b.Address, b.Weight, b.ActiveConns, b.InactiveConns, b.State)
		}
	}
	if stats && len(snap.Verdicts) > 0 {
		fmt.Fprintln(w, "\nVerdict\tPackets\tBytes\t\t\t")
		names := make([]string, 0, len(snap.Verdicts))
		for n := range snap.Verdicts {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			v := snap.Verdicts[n]
			fmt.Fprintf(w, "%s\t%d\t%d\t\t\t\n", n, v.PacketsIn, v.BytesIn)
		}
	}
	if stats && len(snap.Conntrack) > 0 {
		fmt.Fprintln(w, "\nConntrack\tEntries\tCapacity\t\t\t")
		for _, table := range []string{"established", "unreplied"} {
			if c, ok := snap.Conntrack[table]; ok {
				fmt.Fprintf(w, "%s\t%d\t%d\t\t\t\n", table, c.Entries, c.Capacity)
			}
		}
	}
	for _, o := range snap.Orphans {
		fmt.Fprintf(w, "! %s\n", o)
	}
	w.Flush()
}

func runCleanup(args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	ic := ipvsListFlags(fs)
	servicesFile := fs.String("services-file", "", "the agent's --services-file (default /run/xvs/services-<netns inode>.json)")
	drain := fs.Duration("drain", 0, "ebpf mode, on the way back to kube-proxy: first leave new flows to the node's netfilter rules (kube-proxy's) and wait up to this long for xvs's own flows to end; 0 removes everything at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	remove := agent.CleanupPins
	if *drain > 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		remove = func(pinPath string) error { return agent.DrainPins(ctx, slog.Default(), pinPath, *drain) }
	}
	err := errors.Join(remove(*pinPath), agent.RemoveServicesFile(*servicesFile))
	// The IPVS mode's virtual servers (only those xvs created), VIPs and rules.
	if ipvs.HasState(*ic) {
		err = errors.Join(err, ipvs.Cleanup(*ic))
	}
	return err
}

// ipvsListFlags registers the flags that find what an ipvs-mode agent
// programmed: its state file and its dummy device.
func ipvsListFlags(fs *flag.FlagSet) *ipvs.Config {
	ic := &ipvs.Config{Log: slog.Default()}
	fs.StringVar(&ic.StateFile, "ipvs-state-file", "", "ipvs mode: the agent's --ipvs-state-file")
	fs.StringVar(&ic.Device, "ipvs-device", ipvs.DefaultDevice, "ipvs mode: the agent's --ipvs-device")
	return ic
}

// listIPVS reads what xvs programmed in kernel IPVS (ipvsadm -Ln), in
// the order Maps.Read lists the BPF maps in: both modes' listings sort
// alike (Snapshot.Sort).
func listIPVS(stats bool, cfg ipvs.Config) (*maps.Snapshot, error) {
	list, err := ipvs.List(cfg)
	if err != nil {
		return nil, err
	}
	snap := agent.SnapshotOfIPVS(list, stats)
	snap.Sort()
	return snap, nil
}

// parseFrontend reads ADDR:PORT or a bare ADDR (port 0: every port).
func parseFrontend(v string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(strings.Trim(v, "[]"))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is neither ADDR:PORT nor ADDR", v)
	}
	return netip.AddrPortFrom(a, 0), nil
}

// listConnections prints the live flows as ipvsadm -Lnc prints IPVS
// connections (ebpf mode: the conntrack tables of the pinned maps).
func listConnections(mode, pinPath, output string, f maps.ConnectionFilter, names *agent.ServicesFile) error {
	var cs []maps.Connection
	var err error
	kind := "eBPF"
	if listMode(mode, pinPath) == string(model.ModeIPVS) {
		kind = "IPVS"
		cs, err = ipvsConnections(f)
	} else {
		var m *maps.Maps
		if m, err = maps.OpenPinned(pinPath); err != nil {
			return fmt.Errorf("%w (is the agent running with --pin-path=%s?)", err, pinPath)
		}
		defer m.Close()
		cs, err = m.Connections(f)
	}
	if err != nil {
		return err
	}
	if names != nil {
		names.AnnotateConnections(cs)
	}
	if output == "text" {
		printConnections(os.Stdout, kind, cs)
		return nil
	}
	return printStructured(os.Stdout, output, "xvs.list.connections/v1", struct {
		Connections []maps.Connection `json:"connections"`
	}{cs})
}

// ipvsConnections is the kernel's IPVS connection table (ipvs mode), in
// the same shape as the BPF datapath's (masquerade is netfilter's there).
func ipvsConnections(f maps.ConnectionFilter) ([]maps.Connection, error) {
	conns, err := ipvs.ReadConns()
	if err != nil {
		return nil, fmt.Errorf("IPVS connections: %w", err)
	}
	var out []maps.Connection
	for _, c := range conns {
		mc := maps.Connection{Protocol: c.Protocol.String(), Expires: c.Expires, State: c.State,
			Source: c.Client, Virtual: c.Virtual, Destination: c.Dest}
		if f.Match(&mc) {
			out = append(out, mc)
		}
	}
	maps.SortConnections(out)
	return out, nil
}

func printConnections(out io.Writer, kind string, cs []maps.Connection) {
	masq := slices.ContainsFunc(cs, func(c maps.Connection) bool { return c.Masquerade.IsValid() })
	w := tabwriter.NewWriter(out, 0, 8, 1, ' ', 0)
	fmt.Fprintf(w, "xvs (%s) connection entries\n", kind)
	named := slices.ContainsFunc(cs, func(c maps.Connection) bool { return c.Service != nil })
	head := "pro	expire	state	source	virtual	destination"
	if masq {
		head += "	masquerade"
	}
	if named {
		head += "	service"
	}
	fmt.Fprintln(w, head)
	for _, c := range cs {
		secs := int(c.Expires.Round(time.Second) / time.Second)
		line := fmt.Sprintf("%s	%02d:%02d	%s	%s	%s	%s", c.Protocol, secs/60, secs%60, c.State, c.Source, c.Virtual, c.Destination)
		if masq {
			if c.Masquerade.IsValid() {
				line += "	" + c.Masquerade.String()
			} else {
				line += "	-"
			}
		}
		if named {
			if c.Service != nil {
				line += "	" + c.Service.String()
			} else {
				line += "	-"
			}
		}
		fmt.Fprintln(w, line)
	}
	w.Flush()
}

// Rate is one frontend's or backend's traffic per second over an interval.
type Rate struct {
	CPS    float64 `json:"cps"`
	InPPS  float64 `json:"inpps"`
	OutPPS float64 `json:"outpps"`
	InBPS  float64 `json:"inbps"`
	OutBPS float64 `json:"outbps"`
}

type rateView struct {
	Protocol string         `json:"protocol"`
	Address  netip.AddrPort `json:"address"`
	Rate
	Backends []backendRate `json:"backends"`
}

type backendRate struct {
	Address netip.AddrPort `json:"address"`
	Rate
}

func rateOf(a, b xbpf.Stats, d time.Duration) Rate {
	per := func(x, y uint64) float64 {
		if y < x {
			return 0 // counters restarted (the frontend was recreated)
		}
		return float64(y-x) / d.Seconds()
	}
	return Rate{CPS: per(a.Conns, b.Conns), InPPS: per(a.PacketsIn, b.PacketsIn), OutPPS: per(a.PacketsOut, b.PacketsOut),
		InBPS: per(a.BytesIn, b.BytesIn), OutBPS: per(a.BytesOut, b.BytesOut)}
}

// listRates reads the counters twice and prints the rates between, of the
// virtual servers f names. In ipvs mode it prints the kernel's own
// estimates instead (ipvsRates).
func listRates(mode, pinPath, output string, interval time.Duration, ic ipvs.Config, f maps.ConnectionFilter) error {
	if listMode(mode, pinPath) == string(model.ModeIPVS) {
		return ipvsRates(output, ic, f)
	}
	first, err := readSelected(mode, pinPath, true, ic, f)
	if err != nil {
		return err
	}
	start := time.Now()
	time.Sleep(interval)
	second, err := readSelected(mode, pinPath, true, ic, f)
	if err != nil {
		return err
	}
	end := time.Now()
	return printRates(os.Stdout, output, start, end, rateViews(first, second, end.Sub(start)))
}

// ipvsRates prints the rates kernel IPVS estimates for the virtual
// servers f names and their real servers: what ipvsadm -Ln --rate prints.
// The kernel folds its per-CPU counters into the ones it reports only
// when its estimator runs, every 2 s, so two reads of them a second apart
// differ by nothing or by 2 s of traffic: 0, or twice the rate. Its
// estimates are a moving average of those 2 s samples (each weighs 1/4:
// they follow a change within about 8 s); --interval does not apply, and
// the window printed (from, to) is the instant of the read.
func ipvsRates(output string, ic ipvs.Config, f maps.ConnectionFilter) error {
	list, err := ipvs.List(ic)
	if err != nil {
		return err
	}
	snap := agent.SnapshotOfIPVS(list, true)
	snap.Sort()
	if err := selectFrontends(snap, f); err != nil {
		return err
	}
	at := time.Now()
	estimate := func(st mobyipvs.SvcStats) Rate {
		return Rate{CPS: float64(st.CPS), InPPS: float64(st.PPSIn), OutPPS: float64(st.PPSOut), InBPS: float64(st.BPSIn), OutBPS: float64(st.BPSOut)}
	}
	type key struct {
		proto string
		addr  netip.AddrPort
	}
	kernel := map[key]ipvs.ServiceView{}
	for _, s := range list {
		kernel[key{s.Protocol.String(), s.Address}] = s
	}
	views := []rateView{}
	for _, s := range snap.Services {
		ks := kernel[key{s.Protocol, s.Address}]
		v := rateView{Protocol: s.Protocol, Address: s.Address, Rate: estimate(ks.Stats), Backends: []backendRate{}}
		for _, r := range ks.Reals {
			v.Backends = append(v.Backends, backendRate{Address: r.Address, Rate: estimate(r.Stats)})
		}
		views = append(views, v)
	}
	return printRates(os.Stdout, output, at, at, views)
}

// rateViews are the rates of the frontends and backends both reads hold,
// in the second read's order.
func rateViews(first, second *maps.Snapshot, d time.Duration) []rateView {
	type key struct {
		proto string
		addr  netip.AddrPort
	}
	before := map[key]maps.ServiceView{}
	for _, s := range first.Services {
		before[key{s.Protocol, s.Address}] = s
	}
	var views []rateView
	for _, s := range second.Services {
		old, ok := before[key{s.Protocol, s.Address}]
		if !ok {
			continue // new since the first read: no rate yet
		}
		v := rateView{Protocol: s.Protocol, Address: s.Address, Rate: rateOf(old.Stats, s.Stats, d), Backends: []backendRate{}}
		oldBackends := map[netip.AddrPort]xbpf.Stats{}
		for _, b := range old.Backends {
			oldBackends[b.Address] = b.Stats
		}
		for _, b := range s.Backends {
			if ob, ok := oldBackends[b.Address]; ok {
				v.Backends = append(v.Backends, backendRate{Address: b.Address, Rate: rateOf(ob, b.Stats, d)})
			}
		}
		views = append(views, v)
	}
	return views
}

// printRates prints the rates over the window from start to end (when
// the two reads ended).
func printRates(out io.Writer, output string, start, end time.Time, views []rateView) error {
	switch output {
	case "json", "yaml":
		return printStructured(out, output, "xvs.list.rate/v1", struct {
			IntervalSeconds float64 `json:"intervalSeconds"`
			// From and To are when the two reads ended: the rates are
			// over that window.
			From     time.Time  `json:"from"`
			To       time.Time  `json:"to"`
			Services []rateView `json:"services"`
		}{end.Sub(start).Seconds(), start, end, views})
	case "text":
		w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(w, "Prot LocalAddress:Port\tCPS\tInPPS\tOutPPS\tInBPS\tOutBPS")
		fmt.Fprintln(w, "  -> RemoteAddress:Port\t\t\t\t\t")
		line := func(prefix string, r Rate) {
			fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\n", prefix, r.CPS, r.InPPS, r.OutPPS, r.InBPS, r.OutBPS)
		}
		for _, v := range views {
			line(fmt.Sprintf("%-4s %s", v.Protocol, v.Address), v.Rate)
			for _, b := range v.Backends {
				line("  -> "+b.Address.String(), b.Rate)
			}
		}
		return w.Flush()
	}
	return fmt.Errorf("unknown output format %q", output)
}

// printStructured writes v as JSON or YAML with a schemaVersion field
// naming its layout, so that scripts can tell a change of layout.
func printStructured(out io.Writer, format, schema string, v any) error {
	if format != "json" && format != "yaml" {
		return fmt.Errorf("unknown output format %q", format)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	m["schemaVersion"] = schema
	if format == "yaml" {
		if b, err = yaml.Marshal(m); err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
}
