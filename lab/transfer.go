package lab

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HalfClose says which end of a stream transfer shuts its write side.
type HalfClose int

const (
	NoHalfClose     HalfClose = iota
	HalfCloseClient           // the client sends its request, shuts its write side, and receives a stream
	HalfCloseServer           // the server shuts its write side, and receives a stream
)

func (h HalfClose) String() string {
	return [...]string{"none", "client", "server"}[h]
}

// TransferSpec says what a Transfer moves. Either bytes (Download, Upload,
// or both at once) or, with HalfClose, a stream of chunks for Stream.
type TransferSpec struct {
	Download int64 // bytes the server sends
	Upload   int64 // bytes the client sends

	HalfClose HalfClose
	Stream    time.Duration // how long the stream after the half-close lasts
	Interval  time.Duration // one chunk every Interval (default 1s)
	ChunkSize int           // bytes of each chunk (default 1024)

	// Seed picks the data; 0: a random one.
	Seed uint64
	// Stall fails the transfer when no byte moves, and, in a server
	// half-close stream, when a chunk is not acknowledged, for this long
	// (default 3s).
	Stall time.Duration
	// Timeout bounds the whole transfer, connect included (default: 30s
	// plus Stream).
	Timeout time.Duration
	// Connect bounds the connect alone (default: 5s or Timeout if less),
	// so a DROP is seen as soon as a plain probe would see it.
	Connect time.Duration
}

// TransferResult is a transfer that completed: every byte arrived intact.
type TransferResult struct {
	Server     Reply          // the greeting: address:port the server was reached on, peer it saw
	Client     netip.AddrPort // the client socket's own address
	Downloaded int64          // bytes received and checked (chunk payloads included)
	Uploaded   int64          // bytes sent and confirmed (by digest, or by TCP for a server half-close)
	Chunks     int            // stream chunks that arrived (or were acknowledged)
	DownSHA256 string         // hex digest of the downloaded bytes (transfers)
	Duration   time.Duration
}

const (
	defaultStall    = 3 * time.Second
	defaultInterval = time.Second
	defaultChunk    = 1024
)

func (s TransferSpec) withDefaults() (TransferSpec, error) {
	if s.Stall <= 0 {
		s.Stall = defaultStall
	}
	if s.Interval <= 0 {
		s.Interval = defaultInterval
	}
	if s.ChunkSize <= 0 {
		s.ChunkSize = defaultChunk
	}
	if s.Timeout <= 0 {
		s.Timeout = 30*time.Second + s.Stream
	}
	if s.Connect <= 0 || s.Connect > s.Timeout {
		s.Connect = min(s.Timeout, 5*time.Second)
	}
	if s.Seed == 0 {
		s.Seed = rand.Uint64() | 1
	}
	switch {
	case s.Download < 0 || s.Upload < 0:
		return s, errors.New("transfer: negative size")
	case s.HalfClose != NoHalfClose && (s.Download > 0 || s.Upload > 0):
		return s, errors.New("transfer: a half-close stream moves chunks, not Download/Upload bytes")
	case s.HalfClose != NoHalfClose && s.Stream <= 0:
		return s, errors.New("transfer: a half-close needs a Stream duration")
	case s.HalfClose == NoHalfClose && s.Stream > 0:
		return s, errors.New("transfer: Stream needs a HalfClose side")
	case s.ChunkSize > 1<<20:
		return s, errors.New("transfer: ChunkSize over 1 MiB")
	}
	return s, nil
}

func (s TransferSpec) request() request {
	if s.HalfClose == NoHalfClose {
		return request{op: "transfer", down: s.Download, up: s.Upload, seed: s.Seed}
	}
	return request{op: "stream", half: s.HalfClose, chunks: max(1, int(s.Stream/s.Interval)),
		interval: s.Interval, size: s.ChunkSize, seed: s.Seed}
}

// Transfer connects from ns (nil: the caller's namespace) to a BulkServer
// at dst and runs spec. src gives the client address (zero: the kernel's
// choice) and port (0: ephemeral; else that port, with SO_REUSEADDR, so
// consecutive transfers reuse one source port: the server closes first,
// so the client keeps no TIME_WAIT socket). The error says how it failed:
// connect (with its cause, for Classify), stalled after X bytes, corrupt at
// byte X, digest mismatch, chunk k missing.
func Transfer(ns *NS, src, dst netip.AddrPort, spec TransferSpec) (TransferResult, error) {
	spec, err := spec.withDefaults()
	if err != nil {
		return TransferResult{}, err
	}
	start := time.Now()
	c, err := dialFrom(ns, src, TCP, dst, spec.Connect)
	if err != nil {
		return TransferResult{}, err
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	tc.SetDeadline(start.Add(spec.Timeout))
	res := TransferResult{Client: unmapAP(tc.LocalAddr().(*net.TCPAddr).AddrPort())}
	line, err := readLine(c)
	if err == nil {
		res.Server, err = ParseGreeting(line)
	}
	if err != nil {
		return res, fmt.Errorf("greeting from %s: %w", dst, err)
	}
	req := spec.request()
	if _, err := io.WriteString(tc, req.String()); err != nil {
		return res, fmt.Errorf("request: %w", err)
	}
	x := &xfer{c: tc, br: bufio.NewReaderSize(tc, 64<<10), req: req, spec: spec, res: &res}
	stop := x.watch()
	switch req.half {
	case NoHalfClose:
		err = x.transfer()
	case HalfCloseClient:
		err = x.streamDown()
	case HalfCloseServer:
		err = x.streamUp()
	}
	stop()
	res.Duration = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("%s -> %s (server %s): %w", res.Client, dst, res.Server.Local, err)
	}
	return res, nil
}

// xfer is one transfer in progress.
type xfer struct {
	c    *net.TCPConn
	br   *bufio.Reader
	req  request
	spec TransferSpec
	res  *TransferResult

	down, up atomic.Int64 // bytes moved so far, for the stall watchdog
	stalled  atomic.Bool
}

// watch aborts the connection when neither direction moves for
// spec.Stall; the I/O then fails with a deadline error that stallErr
// turns into "stalled after ...". Half-close streams are idle by design
// between chunks, so the wait allows an interval on top.
func (x *xfer) watch() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		limit := x.spec.Stall
		if x.req.op == "stream" {
			limit += x.spec.Interval
		}
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		last, since := int64(-1), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if n := x.down.Load() + x.up.Load(); n != last {
					last, since = n, now
				} else if now.Sub(since) > limit {
					x.stalled.Store(true)
					x.c.SetDeadline(now)
					return
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// why names a failed I/O: a stall, the overall timeout, or the error.
func (x *xfer) why(err error) string {
	if x.stalled.Load() {
		return fmt.Sprintf("no progress for %v", x.spec.Stall)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("timeout %v", x.spec.Timeout)
	}
	return err.Error()
}

// counter counts bytes through it into n.
type counter struct {
	w io.Writer
	n *atomic.Int64
}

func (c counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (x *xfer) transfer() error {
	r := x.req
	sent := hashWriter{sha256.New()}
	upErr := make(chan error, 1)
	go func() {
		// The stream goes through the digest on its way out.
		w := io.MultiWriter(counter{x.c, &x.up}, sent)
		_, err := io.CopyN(w, newStream(r.seed, dirUp, 0), r.up)
		upErr <- err
	}()
	v := newVerifier(r.seed, dirDown)
	_, derr := io.CopyN(counter{v, &x.down}, x.br, r.down)
	if err := <-upErr; err != nil {
		return fmt.Errorf("upload stalled after %d of %d bytes sent (%d acknowledged): %s", x.up.Load(), r.up, x.acked(), x.why(err))
	}
	if derr != nil {
		return fmt.Errorf("download stalled after %d of %d bytes: %s", v.n, r.down, x.why(derr))
	}
	x.res.Downloaded, x.res.DownSHA256 = v.n, v.sum.hex()
	if v.bad >= 0 {
		return fmt.Errorf("download corrupt at byte %d of %d", v.bad, r.down)
	}
	line, err := readLineFrom(x.br)
	if err != nil {
		return fmt.Errorf("upload: no digest from the server after %d bytes sent: %s", r.up, x.why(err))
	}
	kv, f := fields(line, 1)
	if len(f) == 0 || f[0] != "xvs-done" {
		return fmt.Errorf("upload: want the server's digest, got %q", line)
	}
	if n, _ := strconv.ParseInt(kv["up"], 10, 64); n != r.up || kv["sha256"] != sent.hex() {
		return fmt.Errorf("upload digest mismatch: server got %s bytes sha256 %s, client sent %d sha256 %s", kv["up"], kv["sha256"], r.up, sent.hex())
	}
	x.res.Uploaded = r.up
	if _, err := x.br.ReadByte(); err != io.EOF {
		return fmt.Errorf("server did not close after the digest: %v", err)
	}
	return nil
}

// acked is how many bytes the client sent that the server's TCP has
// acknowledged: written minus what is still queued (SIOCOUTQ).
func (x *xfer) acked() int64 {
	q, err := outq(x.c)
	if err != nil {
		return -1
	}
	return x.up.Load() - int64(q)
}

func (x *xfer) streamDown() error {
	if err := x.c.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	halfClosed := time.Now()
	r := x.req
	var last time.Time
	n, err := readChunks(x.br, r, func(int, bool) {
		x.down.Add(int64(r.size))
		last = time.Now()
	})
	x.res.Chunks, x.res.Downloaded = n, int64(n*r.size)
	if err != nil {
		at := "no chunk arrived"
		if n > 0 {
			at = fmt.Sprintf("chunk %d arrived %v after the half-close", n-1, last.Sub(halfClosed).Round(time.Millisecond))
		}
		return fmt.Errorf("stream after client half-close: %v (%s; %s)", err, at, x.why(err))
	}
	line, err := readLineFrom(x.br)
	if err != nil {
		return fmt.Errorf("stream: no end line after %d chunks: %s", n, x.why(err))
	}
	kv, f := fields(line, 1)
	if len(f) == 0 || f[0] != "xvs-end" {
		return fmt.Errorf("stream: want the end line, got %q", line)
	}
	if kv["eof"] != "1" {
		return fmt.Errorf("stream: the server never saw the client's half-close (FIN) in %d chunks", n)
	}
	if _, err := x.br.ReadByte(); err != io.EOF {
		return fmt.Errorf("server did not close after the stream: %v", err)
	}
	return nil
}

func (x *xfer) streamUp() error {
	r := x.req
	if b, err := x.br.ReadByte(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("server half-close: got data (%q) instead of its FIN", b)
		}
		return fmt.Errorf("server half-close: its FIN never arrived: %s", x.why(err))
	}
	data := newStream(r.seed, dirDown, 0)
	chunk := make([]byte, r.size)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for i := range r.chunks {
		if i > 0 {
			<-tick.C
		}
		data.Read(chunk)
		hdr := fmt.Sprintf("xvs-chunk seq=%d eof=0\n", i)
		if _, err := x.c.Write(append([]byte(hdr), chunk...)); err != nil {
			return fmt.Errorf("stream after server half-close: chunk %d: %s", i, x.why(err))
		}
		x.up.Add(int64(len(hdr) + r.size))
		if err := x.waitAcked(); err != nil {
			return fmt.Errorf("stream after server half-close: chunk %d of %d not acknowledged: %v", i, r.chunks, err)
		}
		x.res.Chunks, x.res.Uploaded = i+1, x.res.Uploaded+int64(r.size)
	}
	if err := x.c.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	deadline := time.Now().Add(x.spec.Stall)
	for {
		info, err := tcpInfo(x.c)
		if err != nil {
			return err
		}
		if info.State == unix.BPF_TCP_CLOSE {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream after server half-close: the client's FIN was not acknowledged in %v (state %d)", x.spec.Stall, info.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitAcked waits until the server's TCP has acknowledged every byte sent.
func (x *xfer) waitAcked() error {
	deadline := time.Now().Add(x.spec.Stall)
	for {
		q, err := outq(x.c)
		if err != nil {
			return err
		}
		if q == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d bytes unacknowledged after %v", q, x.spec.Stall)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func outq(c *net.TCPConn) (int, error) {
	var q int
	err := control(c, func(fd int) (err error) {
		q, err = unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		return err
	})
	return q, err
}

func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, error) {
	var info *unix.TCPInfo
	err := control(c, func(fd int) (err error) {
		info, err = unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		return err
	})
	return info, err
}

func control(c syscall.Conn, f func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// dialFrom is dialIn from a full source address: a non-zero port is bound
// with SO_REUSEADDR, so a test can keep one client port across connections
// or datagram sessions.
func dialFrom(ns *NS, src netip.AddrPort, p Proto, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	if src.Port() == 0 {
		return dialIn(ns, src.Addr(), p, dst, timeout)
	}
	if !src.Addr().IsValid() {
		src = netip.AddrPortFrom(unspecified(dst.Addr()), src.Port())
	}
	d := dialer(src.Addr(), p, timeout)
	ip := net.IP(src.Addr().Unmap().AsSlice())
	if p == TCP {
		d.LocalAddr = &net.TCPAddr{IP: ip, Port: int(src.Port())}
	} else {
		d.LocalAddr = &net.UDPAddr{IP: ip, Port: int(src.Port())}
	}
	inner := d.Control
	d.Control = func(nw, addr string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
		return errors.Join(err, serr, inner(nw, addr, c))
	}
	var c net.Conn
	err := inNS(ns, func() error {
		var err error
		c, err = d.Dial(network(p, dst.Addr()), dst.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s->%s: %w", p, src, dst, err)
	}
	established(c, dst)
	return c, nil
}

func unspecified(like netip.Addr) netip.Addr {
	if like.Unmap().Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}
