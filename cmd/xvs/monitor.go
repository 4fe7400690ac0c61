package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"

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
	n, err := monitorLoop(m, os.Stdout, *typ, *output, *count, *timeout, stop)
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

// monitorLoop prints events until count (if set) are printed, timeout (if
// set) passes or stop closes; it returns how many it printed. Stopped, it
// still prints what the ring already holds: an event of the moment before
// the Ctrl-C is not lost.
func monitorLoop(m model.MonitorSource, out io.Writer, typ, output string, count int, timeout time.Duration, stop <-chan struct{}) (int, error) {
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
		if output == "json" {
			if err := enc.Encode(ev); err != nil {
				return n, err
			}
			continue
		}
		flags := ""
		if ev.TCPFlags != "" {
			flags = " [" + ev.TCPFlags + "]"
		}
		where := fmt.Sprintf("dev %s (%s) %d bytes", ev.Device, ev.Hook, ev.Length)
		if ev.Hook == "socket" {
			where = "(a host socket's connect or sendmsg)"
		}
		if _, err := fmt.Fprintf(out, "%s %-6s %-28s %s %s -> %s%s %s\n",
			ev.Time.Format("15:04:05.000000"), ev.Type, ev.Reason, ev.Protocol, ev.Source, ev.Destination, flags, where); err != nil {
			return n, err
		}
	}
	return n, nil
}
