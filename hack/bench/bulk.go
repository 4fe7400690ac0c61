package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// Bulk transfers: long TCP streams that fill their windows, so the
// sockets hand the veths 64 KiB GSO segments and the proxies meet the
// super-packets of real downloads and uploads, the traffic the
// new-connection load (16 bytes each way) never sends.
//
// A bulk stream opens like a load connection, with a request of reqSize
// bytes, which the pods' servers tell apart by its first eight bytes:
//
//	"xvs-bulk" 'D' ...  the server sends bulkPattern, repeated, until the
//	                    client closes;
//	"xvs-bulk" 'U' ...  the server reads until the client's FIN, checks
//	                    every byte against bulkPattern, then answers with
//	                    bulkReplySize bytes: the count it read (8 bytes,
//	                    big endian) and 1 if every byte matched.
const (
	bulkMagic     = "xvs-bulk"
	bulkReplySize = 9
	// bulkPeriod: the pattern's length, and the size of each write.
	bulkPeriod = 1 << 16
)

// bulkDir is a bulk stream's direction, as the client sees it.
type bulkDir byte

const (
	bulkDown bulkDir = 'D' // the pod sends
	bulkUp   bulkDir = 'U' // the client sends
)

func (d bulkDir) String() string {
	if d == bulkUp {
		return "upload"
	}
	return "download"
}

// bulkPattern is a stream's content: byte i is bulkPattern[i % bulkPeriod].
// xorshift bytes, so a segment that lands at the wrong offset does not
// match (a shift of the whole period aside).
var bulkPattern = func() []byte {
	b := make([]byte, bulkPeriod)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x >> 24)
	}
	return b
}()

// bulkMatches reports whether b is the pattern from stream offset off on.
func bulkMatches(b []byte, off uint64) bool {
	at := int(off % bulkPeriod)
	for len(b) > 0 {
		n := min(len(b), bulkPeriod-at)
		if !bytes.Equal(b[:n], bulkPattern[at:at+n]) {
			return false
		}
		b, at = b[n:], 0
	}
	return true
}

func bulkRequest(d bulkDir) []byte {
	req := make([]byte, reqSize)
	copy(req, bulkMagic)
	req[len(bulkMagic)] = byte(d)
	return req
}

// bulkOf returns the direction a request asks for, if it is a bulk one.
func bulkOf(req []byte) (bulkDir, bool) {
	if len(req) <= len(bulkMagic) || string(req[:len(bulkMagic)]) != bulkMagic {
		return 0, false
	}
	switch d := bulkDir(req[len(bulkMagic)]); d {
	case bulkDown, bulkUp:
		return d, true
	}
	return 0, false
}

// serveBulk is the pod's side of one bulk stream.
func serveBulk(c net.Conn, d bulkDir) {
	if d == bulkDown {
		for {
			if _, err := c.Write(bulkPattern); err != nil {
				return
			}
		}
	}
	buf := make([]byte, 4*bulkPeriod)
	var got uint64
	ok := true
	for {
		n, err := c.Read(buf)
		if n > 0 {
			ok = ok && bulkMatches(buf[:n], got)
			got += uint64(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return
		}
	}
	reply := make([]byte, bulkReplySize)
	binary.BigEndian.PutUint64(reply, got)
	if ok {
		reply[8] = 1
	}
	c.Write(reply)
}

// bulkResult is one bulk measurement: Streams parallel streams in one
// direction, over one window after a warm-up.
type bulkResult struct {
	Dir     bulkDir
	Streams int
	// Bytes moved inside the window: read by the client (download), or
	// written by it (upload; in steady state the socket buffers hold as
	// much at the window's end as at its start). Total is everything each
	// stream moved, which the receiving side checked byte for byte.
	Bytes, Total uint64
	Window       time.Duration
	// CPU is the benchmark process's user+system time over the window (the
	// client, the pods' servers and the kernel's forwarding in their
	// context); the proxy's and ksoftirqd's come from the caller's marks.
	CPU time.Duration
}

// Gbps is the window's throughput in Gbit/s of TCP payload.
func (r bulkResult) Gbps() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Window.Seconds() / 1e9
}

// bulkStream is the client's side of one stream.
type bulkStream struct {
	c     *net.TCPConn
	moved atomic.Uint64
	err   error
}

// runBulk opens streams connections from the client namespace, stream i
// to ts[i % len(ts)], moves data in direction d for warmup+window, and
// checks what arrived: the client checks every downloaded byte, the pods
// every uploaded one (and the count they report must be what the client
// wrote). A stream that stalls for ioTimeout fails the run. mark is called
// at the window's start (true) and end (false).
func runBulk(ctx context.Context, client *lab.NS, ts []netip.AddrPort, d bulkDir, streams int, warmup, window time.Duration, mark func(start bool)) (res bulkResult, err error) {
	res = bulkResult{Dir: d, Streams: streams}
	ss := make([]*bulkStream, streams)
	defer func() {
		for _, s := range ss {
			if s != nil && s.c != nil {
				s.c.Close()
			}
		}
	}()
	for i := range ss {
		t := ts[i%len(ts)]
		var c net.Conn
		err := client.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: ioTimeout}).DialContext(ctx, "tcp4", t.String())
			return err
		})
		if err != nil {
			return res, fmt.Errorf("bulk %s stream %d to %s: %w", d, i, t, err)
		}
		ss[i] = &bulkStream{c: c.(*net.TCPConn)}
		if _, err := ss[i].c.Write(bulkRequest(d)); err != nil {
			return res, fmt.Errorf("bulk %s stream %d to %s: request: %w", d, i, t, err)
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.err = s.move(d, &stop)
		}()
	}
	moved := func() (n uint64) {
		for _, s := range ss {
			n += s.moved.Load()
		}
		return n
	}
	failed := func() error {
		for i, s := range ss {
			if s.moved.Load() == 0 && stop.Load() {
				return fmt.Errorf("bulk %s stream %d moved nothing", d, i)
			}
		}
		return nil
	}
	werr := sleepCtx(ctx, warmup)
	var b0 uint64
	var cpu0 time.Duration
	var t0 time.Time
	if werr == nil {
		mark(true)
		b0, cpu0, t0 = moved(), processCPU(), time.Now()
		werr = sleepCtx(ctx, window)
		res.Bytes, res.CPU, res.Window = moved()-b0, processCPU()-cpu0, time.Since(t0)
		mark(false)
	}
	stop.Store(true)
	if d == bulkDown {
		// The streams read until told to stop; closing ends a read
		// that waits.
		for _, s := range ss {
			s.c.SetReadDeadline(time.Now())
		}
	}
	wg.Wait()
	if werr != nil {
		return res, werr
	}
	var errs []error
	for i, s := range ss {
		res.Total += s.moved.Load()
		if s.err != nil {
			errs = append(errs, fmt.Errorf("bulk %s stream %d to %s: %w", d, i, ts[i%len(ts)], s.err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	return res, failed()
}

// move runs one stream until stop: it reads and checks the pattern
// (download) or writes it, then half-closes and checks the pod's count
// (upload). Every read and write waits at most ioTimeout.
func (s *bulkStream) move(d bulkDir, stop *atomic.Bool) error {
	if d == bulkUp {
		for !stop.Load() {
			s.c.SetWriteDeadline(time.Now().Add(ioTimeout))
			n, err := s.c.Write(bulkPattern)
			s.moved.Add(uint64(n))
			if err != nil {
				return fmt.Errorf("after %d bytes: %w", s.moved.Load(), err)
			}
		}
		// A half-close: the pod sees the end of the upload and answers on
		// the direction still open.
		if err := s.c.CloseWrite(); err != nil {
			return err
		}
		reply := make([]byte, bulkReplySize)
		s.c.SetReadDeadline(time.Now().Add(3 * ioTimeout))
		if _, err := io.ReadFull(s.c, reply); err != nil {
			return fmt.Errorf("the pod's count after %d bytes: %w", s.moved.Load(), err)
		}
		got, sent := binary.BigEndian.Uint64(reply), s.moved.Load()
		if got != sent || reply[8] != 1 {
			return fmt.Errorf("the pod read %d bytes (pattern intact: %v), the client wrote %d", got, reply[8] == 1, sent)
		}
		return nil
	}
	buf := make([]byte, 4*bulkPeriod)
	for !stop.Load() {
		s.c.SetReadDeadline(time.Now().Add(ioTimeout))
		n, err := s.c.Read(buf)
		if n > 0 {
			if !bulkMatches(buf[:n], s.moved.Load()) {
				return fmt.Errorf("bytes %d..%d are not what the pod sent", s.moved.Load(), s.moved.Load()+uint64(n))
			}
			s.moved.Add(uint64(n))
		}
		if err != nil {
			if stop.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			return fmt.Errorf("after %d bytes: %w", s.moved.Load(), err)
		}
	}
	return nil
}
