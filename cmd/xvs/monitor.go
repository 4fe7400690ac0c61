package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
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
	if err := fs.Parse(args); err != nil {
		return err
	}
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
	m, err := maps.OpenMonitor(*pinPath, uint32(*rate), uint32(*burst))
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
	fmt.Fprintf(os.Stderr, "listening for drop and reject events under %s (at most %d a second per CPU; Ctrl-C to stop)\n", *pinPath, *rate)
	n, err := monitorLoop(m, os.Stdout, *typ, *output, *count, *timeout, stop)
	c, cerr := m.Counts()
	closeErr := m.Close()
	if cerr == nil {
		fmt.Fprintf(os.Stderr, "%d events; %d suppressed by the rate limit, %d lost (ring full)\n", n, c.Suppressed, c.Lost)
	}
	return errors.Join(err, closeErr)
}

// monitorLoop prints events until count (if set) are printed, timeout (if
// set) passes or stop closes; it returns how many it printed. Stopped, it
// still prints what the ring already holds: an event of the moment before
// the Ctrl-C is not lost.
func monitorLoop(m *maps.Monitor, out io.Writer, typ, output string, count int, timeout time.Duration, stop <-chan struct{}) (int, error) {
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
		case errors.Is(err, ringbuf.ErrClosed):
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
