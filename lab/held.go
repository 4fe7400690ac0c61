package lab

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// HeldSpec shapes a HeldStream.
type HeldSpec struct {
	// Rate is the bytes per second sent (and so echoed back); default
	// 1 MiB/s: bulk enough to keep windows open and segments full, small
	// enough for two cores that also run the agent.
	Rate int
	// Timeout bounds the connect (default 1s).
	Timeout time.Duration
}

// HeldStats is a HeldStream at a barrier: everything sent has come back.
type HeldStats struct {
	Bytes  int64  // sent, and echoed back intact
	SHA256 string // of those bytes, both ways
}

// HeldStream is a long-lived TCP connection with data flowing both ways
// all the time: the client sends a keystream at a steady rate, the server
// (an EchoServer or BulkServer, plain echo) sends it back, and the client
// checks every byte that returns. Check proves, at any point, that the
// connection is alive and nothing was lost or altered.
type HeldStream struct {
	Server Reply          // the greeting: which backend, and the peer it saw
	Local  netip.AddrPort // the client socket's address

	c    *net.TCPConn
	rate int
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	cond     *sync.Cond
	closed   bool
	paused   bool // Check asked the writer to stop
	idle     bool // the writer has stopped
	sent     int64
	received int64
	sentSum  hashWriter
	recvSum  *verifier
	err      error // the first failure, sticky
}

// StartHeldStream connects from ns/src (as in Transfer) to dst, reads the
// greeting, and starts the flow.
func StartHeldStream(ns *NS, src, dst netip.AddrPort, spec HeldSpec) (*HeldStream, error) {
	if spec.Rate <= 0 {
		spec.Rate = 1 << 20
	}
	if spec.Timeout <= 0 {
		spec.Timeout = time.Second
	}
	c, err := dialFrom(ns, src, TCP, dst, spec.Timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(spec.Timeout))
	line, err := readLine(c)
	var greet Reply
	if err == nil {
		greet, err = ParseGreeting(line)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("held stream: greeting from %s: %w", dst, err)
	}
	c.SetDeadline(time.Time{})
	seed := rand.Uint64()
	h := &HeldStream{Server: greet, Local: unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort()),
		c: c.(*net.TCPConn), rate: spec.Rate, stop: make(chan struct{}),
		sentSum: hashWriter{sha256.New()}, recvSum: newVerifier(seed, dirHeld)}
	h.cond = sync.NewCond(&h.mu)
	h.wg.Add(2)
	go h.write(newStream(seed, dirHeld, 0))
	go h.read()
	return h, nil
}

// write sends rate bytes a second in 50 ms slices, and parks while a Check
// waits for the echo to catch up.
func (h *HeldStream) write(data io.Reader) {
	defer h.wg.Done()
	const tick = 50 * time.Millisecond
	buf := make([]byte, max(1, h.rate/int(time.Second/tick)))
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		h.mu.Lock()
		for h.paused && h.err == nil && !h.closed {
			h.idle = true
			h.cond.Broadcast()
			h.cond.Wait()
		}
		h.idle = false
		failed := h.err != nil || h.closed
		h.mu.Unlock()
		if failed {
			return
		}
		data.Read(buf)
		n, err := h.c.Write(buf)
		h.mu.Lock()
		h.sent += int64(n)
		h.sentSum.Write(buf[:n])
		h.mu.Unlock()
		if err != nil {
			h.fail(fmt.Errorf("write after %d bytes: %w", h.sentNow(), err))
			return
		}
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

func (h *HeldStream) read() {
	defer h.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := h.c.Read(buf)
		h.mu.Lock()
		h.recvSum.Write(buf[:n])
		h.received += int64(n)
		bad := h.recvSum.bad
		h.cond.Broadcast()
		h.mu.Unlock()
		if bad >= 0 {
			h.fail(fmt.Errorf("echoed byte %d differs from what was sent", bad))
			return
		}
		if err != nil {
			h.fail(fmt.Errorf("read after %d bytes echoed: %w", h.receivedNow(), err))
			return
		}
	}
}

func (h *HeldStream) sentNow() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent
}

func (h *HeldStream) receivedNow() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.received
}

func (h *HeldStream) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.stop: // our own Close
		return
	default:
	}
	if h.err == nil {
		h.err = err
	}
	h.cond.Broadcast()
}

// Check pauses the sender, waits up to timeout for every byte sent to come
// back, compares the digests of both directions, and resumes. An error
// says what broke and when (sticky: a broken stream stays broken).
func (h *HeldStream) Check(timeout time.Duration) (HeldStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.paused = true
	defer func() { h.paused = false; h.cond.Broadcast() }()
	expired := false
	timer := time.AfterFunc(timeout, func() {
		h.mu.Lock()
		expired = true
		h.cond.Broadcast()
		h.mu.Unlock()
	})
	defer timer.Stop()
	for h.err == nil && !expired && !(h.idle && h.received == h.sent) {
		h.cond.Wait()
	}
	st := HeldStats{Bytes: h.received, SHA256: h.recvSum.sum.hex()}
	switch {
	case h.err != nil:
		return st, fmt.Errorf("held stream %s -> %s: %w", h.Local, h.Server.Local, h.err)
	case expired:
		return st, fmt.Errorf("held stream %s -> %s: stalled: %d bytes sent, %d echoed back after %v", h.Local, h.Server.Local, h.sent, h.received, timeout)
	case st.SHA256 != h.sentSum.hex():
		return st, fmt.Errorf("held stream %s -> %s: digest of %d bytes echoed differs from what was sent", h.Local, h.Server.Local, h.received)
	}
	return st, nil
}

// Close stops the flow and closes the connection.
func (h *HeldStream) Close() error {
	h.mu.Lock()
	select {
	case <-h.stop:
		h.mu.Unlock()
		return nil
	default:
	}
	close(h.stop)
	h.closed = true
	h.cond.Broadcast()
	h.mu.Unlock()
	err := h.c.Close()
	h.wg.Wait()
	return err
}
