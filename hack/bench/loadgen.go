package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/lab"
)

// The load generator and its server speak a fixed request/response: the
// client sends reqSize bytes, the server answers respSize bytes.
const (
	reqSize  = 16
	respSize = 16
	// ioTimeout bounds every wait of the load generator, so a datapath that
	// drops packets shows up as errors instead of a hang.
	ioTimeout = 2 * time.Second
)

// loadMode is what one load-generator run measures.
type loadMode int

const (
	// modeCPS: each worker loops connect, send a request, read the reply,
	// close. Every connection is a new flow through the datapath; connect()
	// time is the first-packet latency (SYN out to SYN-ACK in).
	modeCPS loadMode = iota
	// modeRR: each worker keeps one connection open and loops request and
	// reply: the established path.
	modeRR
)

func (m loadMode) String() string { return [...]string{"cps", "rr"}[m] }

// loadResult is one run of the load generator.
type loadResult struct {
	Completed int           // connections (cps) or requests (rr) completed in the window
	Errors    int           // failed connects, sends or reads in the window
	Window    time.Duration // measured time, warm-up excluded
	P50, P99  time.Duration // connect() time (cps) or request round trip (rr)
	// CPU is the benchmark process's user+system time over the window:
	// the client, the servers and the kernel's forwarding and datapath
	// work done in their context (softirqs run mostly in the sending
	// task). Unlike the rate, other tenants of the machine do not add to it.
	CPU      time.Duration
	FirstErr string
}

// CPUPerOp is the process CPU time per completed connection or request.
func (r loadResult) CPUPerOp() time.Duration {
	if r.Completed == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Completed)
}

// processCPU is the process's user+system time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r loadResult) Rate() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Window.Seconds()
}

// runLoad runs workers against targets (worker w's k-th connection goes to
// targets[(w + k*workers) mod len], so every worker sweeps all targets)
// from inside client's network namespace: each worker is an OS thread that
// has joined the namespace and talks to the kernel with raw non-blocking
// sockets and poll(2), so the client's own cost is a few syscalls per
// connection, the same for every datapath. Only completions inside the
// window after warmup count.
func runLoad(ctx context.Context, client netns.NsHandle, mode loadMode, targets []netip.AddrPort, workers int, warmup, window time.Duration) (loadResult, error) {
	return runLoadMarked(ctx, client, mode, targets, workers, warmup, window, nil)
}

// runLoadMarked is runLoad calling mark(true) as the window opens and
// mark(false) as it closes.
func runLoadMarked(ctx context.Context, client netns.NsHandle, mode loadMode, targets []netip.AddrPort, workers int, warmup, window time.Duration, mark func(start bool)) (loadResult, error) {
	if mark == nil {
		mark = func(bool) {}
	}
	if len(targets) == 0 || workers < 1 {
		return loadResult{}, errors.New("load: no targets or workers")
	}
	var phase atomic.Int32 // 0 warm-up, 1 measuring, 2 stop
	outs := make([]loadWorker, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[w].run(client, mode, targets, w, workers, &phase)
		}()
	}
	err := sleepCtx(ctx, warmup)
	mark(true)
	start, cpu0 := time.Now(), processCPU()
	if err == nil {
		phase.Store(1)
		err = sleepCtx(ctx, window)
	}
	res := loadResult{Window: time.Since(start), CPU: processCPU() - cpu0}
	phase.Store(2)
	mark(false)
	wg.Wait()
	if err != nil {
		return res, err
	}
	var lats []time.Duration
	for _, o := range outs {
		if o.setupErr != nil {
			return res, fmt.Errorf("load worker: join client namespace: %w", o.setupErr)
		}
		res.Completed += o.done
		res.Errors += o.errs
		lats = append(lats, o.lats...)
		if o.firstErr != nil && res.FirstErr == "" {
			res.FirstErr = o.firstErr.Error()
		}
	}
	slices.Sort(lats)
	res.P50, res.P99 = percentile(lats, 0.50), percentile(lats, 0.99)
	return res, nil
}

// loadWorker is one worker's count of a load run.
type loadWorker struct {
	done, errs int
	lats       []time.Duration
	firstErr   error
	setupErr   error
}

// run connects (modeCPS) or sends requests on one connection (modeRR) to
// targets, in turn from the w-th of workers, until phase says stop;
// it counts only while phase says measuring.
func (o *loadWorker) run(client netns.NsHandle, mode loadMode, targets []netip.AddrPort, w, workers int, phase *atomic.Int32) {
	// The thread joins the client namespace and is never returned
	// to the pool: it ends with the goroutine.
	runtime.LockOSThread()
	if err := netns.Set(client); err != nil {
		o.setupErr = err
		return
	}
	o.lats = make([]time.Duration, 0, 1<<14)
	var conn int = -1
	defer func() {
		if conn >= 0 {
			unix.Close(conn)
		}
	}()
	buf := make([]byte, 64)
	req := make([]byte, reqSize)
	for k := 0; ; k++ {
		p := phase.Load()
		if p == 2 {
			return
		}
		t := targets[(w+k*workers)%len(targets)]
		var lat time.Duration
		var err error
		switch mode {
		case modeCPS:
			lat, err = oneConnection(t, req, buf)
		case modeRR:
			if conn < 0 {
				if conn, _, err = dialRaw(t); err != nil {
					conn = -1
					break
				}
			}
			start := time.Now()
			if err = roundTrip(conn, req, buf); err != nil {
				unix.Close(conn)
				conn = -1
			}
			lat = time.Since(start)
		}
		if p != 1 {
			continue
		}
		if err != nil {
			o.errs++
			if o.firstErr == nil {
				o.firstErr = fmt.Errorf("%s: %w", t, err)
			}
			continue
		}
		o.done++
		o.lats = append(o.lats, lat)
	}
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// oneConnection is one connect, request, reply and close; it returns the
// connect() time.
func oneConnection(t netip.AddrPort, req, buf []byte) (time.Duration, error) {
	fd, lat, err := dialRaw(t)
	if err != nil {
		return 0, err
	}
	err = roundTrip(fd, req, buf)
	unix.Close(fd)
	return lat, err
}

// dialRaw connects a non-blocking TCP socket and waits for the handshake
// with poll(2); the time from connect() to writability is the SYN to
// SYN-ACK round trip through the datapath.
func dialRaw(t netip.AddrPort) (int, time.Duration, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	sa := &unix.SockaddrInet4{Port: int(t.Port()), Addr: t.Addr().As4()}
	start := time.Now()
	err = unix.Connect(fd, sa)
	if errors.Is(err, unix.EINPROGRESS) {
		if err = waitFD(fd, unix.POLLOUT); err == nil {
			var soerr int
			if soerr, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err == nil && soerr != 0 {
				err = unix.Errno(soerr)
			}
		}
	}
	lat := time.Since(start)
	if err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("connect: %w", err)
	}
	return fd, lat, nil
}

// roundTrip sends one request and reads one whole reply.
func roundTrip(fd int, req, buf []byte) error {
	if n, err := unix.Write(fd, req); err != nil || n != len(req) {
		return fmt.Errorf("send: %d bytes, %v", n, err)
	}
	for got := 0; got < respSize; {
		if err := waitFD(fd, unix.POLLIN); err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		n, err := unix.Read(fd, buf[:respSize-got])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("receive: connection closed after %d bytes", got)
		}
		got += n
	}
	return nil
}

// waitFD polls one descriptor, retrying on signals (the Go runtime
// preempts threads with SIGURG).
func waitFD(fd int, events int16) error {
	deadline := time.Now().Add(ioTimeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 1 {
			if fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 && fds[0].Revents&events == 0 {
				return unix.ECONNRESET
			}
			return nil
		}
	}
}

// sleepCtx waits d, or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// benchServer answers the load generator inside a pod: respSize bytes per
// reqSize-byte request, until the client closes; a connection whose first
// request is a bulk one is a bulk stream instead (bulk.go).
type benchServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	open map[net.Conn]struct{}
	// While recording is set, every accepted connection's peer address is
	// kept in lastPeer: how the peer comparison checks whether a path was
	// masqueraded. Off during measured runs (the store allocates).
	recording atomic.Bool
	lastPeer  atomic.Pointer[netip.AddrPort]
}

// recordPeers turns peer recording on or off; on clears the last peer.
func (s *benchServer) recordPeers(on bool) {
	if on {
		s.lastPeer.Store(nil)
	}
	s.recording.Store(on)
}

// peer is the last recorded peer address, or the zero AddrPort.
func (s *benchServer) peer() netip.AddrPort {
	if p := s.lastPeer.Load(); p != nil {
		return *p
	}
	return netip.AddrPort{}
}

// startServer listens on addr inside ns (the socket is created on a thread
// in the namespace and stays there) and serves from goroutines.
func startServer(ns *lab.NS, addr netip.AddrPort) (*benchServer, error) {
	s := &benchServer{open: map[net.Conn]struct{}{}}
	err := ns.Do(func() error {
		var err error
		s.ln, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", ns.Name, addr, err)
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *benchServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if s.recording.Load() {
			if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				ap := a.AddrPort()
				ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
				s.lastPeer.Store(&ap)
			}
		}
		s.mu.Lock()
		s.open[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.open, c)
				s.mu.Unlock()
				c.Close()
			}()
			buf, resp := make([]byte, reqSize), make([]byte, respSize)
			for first := true; ; first = false {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if d, ok := bulkOf(buf); ok && first {
					serveBulk(c, d)
					return
				}
				if _, err := c.Write(resp); err != nil {
					return
				}
			}
		}()
	}
}

// Close stops the listener and open connections and waits for them.
func (s *benchServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}
