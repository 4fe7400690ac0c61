package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/xvs-lb/xvs/agent"
	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// runMonitor prints the packets the datapath drops or refuses as they
// happen, with the reason (cilium-dbg monitor --type drop, for xvs).
func runMonitor(args []string) error {
	fs := flag.NewFlagSet("monitor", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	typ := fs.String("type", "", "only events of this type: drop or reject (default: both)")
	output := fs.String("o", "text", "output format: text, or json (one object a line)")
	rate := fs.Uint("rate", maps.DefaultMonitorRate, "most events a second per CPU the datapath writes (the rest are counted as suppressed)")
	burst := fs.Uint("burst", maps.DefaultMonitorBurst, "events a CPU may write at once above the rate")
	count := fs.Int("count", 0, "exit after this many events (0: run until interrupted)")
	timeout := fs.Duration("timeout", 0, "exit after this long (0: run until interrupted)")
	mode := fs.String("proxy-mode", "auto", "datapath to listen to: ebpf, ipvs, or auto (ebpf if its maps are pinned, else ipvs)")
	servicesFile := fs.String("services-file", "", "the agent's --services-file: the Service names of the destinations (default /run/xvs/services-<netns inode>.json)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch *typ {
	case "", "drop", "reject":
	default:
		return fmt.Errorf("--type %q: want drop or reject", *typ)
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("unknown output format %q", *output)
	}
	if *rate == 0 || *rate > 1<<20 || *burst > 1<<20 {
		return fmt.Errorf("--rate %d, --burst %d: want a rate of 1 to %d and a burst of at most that", *rate, *burst, 1<<20)
	}
	var (
		m     model.MonitorSource
		where string
		err   error
	)
	switch md := listMode(*mode, *pinPath); md {
	case string(model.ModeEBPF):
		m, err = maps.OpenMonitor(*pinPath, uint32(*rate), uint32(*burst))
		where = fmt.Sprintf("under %s (at most %d a second per CPU", *pinPath, *rate)
	case string(model.ModeIPVS):
		// The rules' limit is the agent's, set when it wrote them.
		if set["rate"] || set["burst"] {
			return fmt.Errorf("--rate and --burst apply to ebpf mode: in ipvs mode xvs's rules log at most %d a second (bursts of %d)", ipvs.MonitorRate, ipvs.MonitorBurst)
		}
		m, err = ipvs.OpenMonitor()
		where = fmt.Sprintf("of ipvs mode's rules on NFLOG group %d (at most %d a second per rule", ipvs.MonitorGroup, ipvs.MonitorRate)
	default:
		err = fmt.Errorf("unknown --proxy-mode %q", md)
	}
	if err != nil {
		return err
	}
	// The events stay on only while someone reads them: turn them off on
	// every way out.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	stop := make(chan struct{})
	go func() {
		select {
		case <-sig:
			close(stop)
		case <-stop:
		}
	}()
	fmt.Fprintf(os.Stderr, "listening for drop and reject events %s; Ctrl-C to stop)\n", where)
	n, err := monitorLoop(m, os.Stdout, newServiceNames(*servicesFile), *typ, *output, *count, *timeout, stop)
	c, cerr := m.Counts()
	closeErr := m.Close()
	if cerr == nil {
		if _, nflog := m.(*ipvs.Monitor); nflog {
			fmt.Fprintf(os.Stderr, "%d events; %d lost (socket buffer full); packets over the rules' limit are not logged (the rules' counters count them: nft list table ip %s)\n", n, c.Lost, ipvs.TableName)
		} else {
			fmt.Fprintf(os.Stderr, "%d events; %d suppressed by the rate limit, %d lost (ring full)\n", n, c.Suppressed, c.Lost)
		}
	}
	return errors.Join(err, closeErr)
}

// monitorLoop prints events, with the Service names names gives (nil:
// none), until count (if set) are printed, timeout (if set) passes or stop
// closes; it returns how many it printed. Stopped, it still prints what
// the ring already holds: an event of the moment before the Ctrl-C is not
// lost.
func monitorLoop(m model.MonitorSource, out io.Writer, names *serviceNames, typ, output string, count int, timeout time.Duration, stop <-chan struct{}) (int, error) {
	var end time.Time
	if timeout > 0 {
		end = time.Now().Add(timeout)
	}
	enc := json.NewEncoder(out)
	n := 0
	stopping := false
	for count == 0 || n < count {
		if !stopping {
			select {
			case <-stop:
				stopping = true
			default:
			}
		}
		// Wake up at least every half second to notice a signal.
		deadline := time.Now().Add(500 * time.Millisecond)
		if !end.IsZero() && end.Before(deadline) {
			deadline = end
		}
		if stopping {
			deadline = time.Now() // what is there, without waiting
		}
		ev, err := m.Read(deadline)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if stopping || !end.IsZero() && !time.Now().Before(end) {
				return n, nil
			}
			continue
		case errors.Is(err, ringbuf.ErrClosed), errors.Is(err, net.ErrClosed):
			return n, nil
		case err != nil:
			return n, err
		}
		if typ != "" && ev.Type != typ {
			continue
		}
		n++
		named := monitorEvent{ev, names.of(ev.Protocol, ev.Destination)}
		if output == "json" {
			if err := enc.Encode(named); err != nil {
				return n, err
			}
			continue
		}
		if err := printEvent(out, named); err != nil {
			return n, err
		}
	}
	return n, nil
}

// printEvent writes an event as a line of text: the Service, when named,
// last, as xvs list prints it.
func printEvent(out io.Writer, ev monitorEvent) error {
	flags := ""
	if ev.TCPFlags != "" {
		flags = " [" + ev.TCPFlags + "]"
	}
	where := fmt.Sprintf("dev %s (%s) %d bytes", ev.Device, ev.Hook, ev.Length)
	if ev.Hook == "socket" {
		where = "(a host socket's connect or sendmsg)"
	}
	service := ""
	if ev.Service != nil {
		service = "  " + ev.Service.String()
	}
	_, err := fmt.Fprintf(out, "%s %-6s %-28s %s %s -> %s%s %s%s\n",
		ev.Time.Format("15:04:05.000000"), ev.Type, ev.Reason, ev.Protocol, ev.Source, ev.Destination, flags, where, service)
	return err
}

// monitorEvent is an event as xvs monitor prints it: the datapath's, with
// the Service port it was sent to where the agent names one (the ring and
// the NFLOG group carry addresses only). Service is an added field: the
// JSON lines keep every field they had.
type monitorEvent struct {
	model.MonitorEvent
	Service *maps.ServiceRef `json:"service,omitempty"`
}

// serviceNames names the destinations of events after the agent's
// services file, as xvs list names frontends. A monitor runs for long
// while the agent rewrites the file (by rename) as Services change, so it
// looks at the file again at most once a second and reads it again when
// it is another one. No file (no agent runs), or one this build cannot
// read, names nothing: the events matter more than their names.
type serviceNames struct {
	path    string
	checked time.Time
	file    os.FileInfo // the file the names came from; nil: none
	byFront map[frontendKey]*maps.ServiceRef
	byAddr  map[netip.Addr]*maps.ServiceRef
}

type frontendKey struct {
	proto string
	addr  netip.AddrPort
}

// newServiceNames reads the names from path ("": the network namespace's
// default file, where the agent publishes them).
func newServiceNames(path string) *serviceNames {
	if path == "" {
		path = agent.DefaultServicesFile()
	}
	return &serviceNames{path: path}
}

// of is the Service port of the frontend proto dst. An address of one
// Service's on a port it does not serve (reject_wrong_port) names that
// Service, without a port.
func (n *serviceNames) of(proto string, dst netip.AddrPort) *maps.ServiceRef {
	if n == nil {
		return nil
	}
	n.refresh(time.Now())
	if ref, ok := n.byFront[frontendKey{proto, dst}]; ok {
		return ref
	}
	return n.byAddr[dst.Addr()]
}

// refresh reads the file again if it changed since the last look, a
// second or more ago.
func (n *serviceNames) refresh(now time.Time) {
	if now.Sub(n.checked) < time.Second {
		return
	}
	n.checked = now
	fi, err := os.Stat(n.path)
	if err != nil {
		n.file, n.byFront, n.byAddr = nil, nil, nil
		return
	}
	if n.file != nil && os.SameFile(n.file, fi) && fi.ModTime().Equal(n.file.ModTime()) {
		return
	}
	n.file = fi
	f, err := agent.ReadServicesFile(n.path)
	if err != nil {
		slog.Warn("No Service names", "err", err) // once for each version of the file
	}
	n.byFront, n.byAddr = indexServices(f)
}

// indexServices maps each frontend to the Service port that owns it: the
// first in the file's order, as both datapaths give a frontend two
// Services claim to it (and as xvs list names it). It also maps each
// address that one Service alone has frontends on to that Service; not a
// NodePort's, since a node's address is every NodePort Service's.
func indexServices(f *agent.ServicesFile) (map[frontendKey]*maps.ServiceRef, map[netip.Addr]*maps.ServiceRef) {
	if f == nil {
		return nil, nil
	}
	byFront := map[frontendKey]*maps.ServiceRef{}
	byAddr := map[netip.Addr]*maps.ServiceRef{}
	shared := map[netip.Addr]bool{}
	for _, p := range f.Ports {
		for _, fe := range p.Frontends {
			k := frontendKey{p.Protocol, fe.Address}
			if _, taken := byFront[k]; !taken {
				byFront[k] = &maps.ServiceRef{Namespace: p.Namespace, Name: p.Name, Port: p.Port, Kind: fe.Kind}
			}
			a := fe.Address.Addr()
			if fe.Kind == model.NodePort.String() || shared[a] {
				continue
			}
			switch o, ok := byAddr[a]; {
			case !ok:
				byAddr[a] = &maps.ServiceRef{Namespace: p.Namespace, Name: p.Name, Kind: fe.Kind}
			case o.Namespace != p.Namespace || o.Name != p.Name:
				delete(byAddr, a)
				shared[a] = true
			}
		}
	}
	return byFront, byAddr
}
