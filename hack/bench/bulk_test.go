package main

import (
	"encoding/binary"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// bulkPair connects a client stream to serve over loopback in this
// namespace and sends the bulk request for d.
func bulkPair(t *testing.T, d bulkDir, serve func(net.Conn)) *bulkStream {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req := make([]byte, reqSize)
		if _, err := c.Read(req); err != nil {
			return
		}
		serve(c)
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(bulkRequest(d)); err != nil {
		t.Fatal(err)
	}
	return &bulkStream{c: c.(*net.TCPConn)}
}

// moveFor runs s for about d and returns its error.
func moveFor(s *bulkStream, dir bulkDir, d time.Duration) error {
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() { done <- s.move(dir, &stop) }()
	time.Sleep(d)
	stop.Store(true)
	if dir == bulkDown {
		s.c.SetReadDeadline(time.Now())
	}
	return <-done
}

// TestBulkStreams: both directions move data and pass their checks, and
// each check fails when what arrives is not what was sent.
func TestBulkStreams(t *testing.T) {
	if d, ok := bulkOf(bulkRequest(bulkUp)); !ok || d != bulkUp {
		t.Fatalf("bulkOf(upload request) = %v, %v", d, ok)
	}
	if _, ok := bulkOf(make([]byte, reqSize)); ok {
		t.Fatal("the load generator's request reads as a bulk one")
	}
	for _, d := range []bulkDir{bulkDown, bulkUp} {
		s := bulkPair(t, d, func(c net.Conn) { serveBulk(c, d) })
		if err := moveFor(s, d, 200*time.Millisecond); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if s.moved.Load() < 1<<20 {
			t.Errorf("%s moved %d bytes in 200 ms over loopback", d, s.moved.Load())
		}
	}

	// A pod whose stream skips one byte after 1 MiB.
	s := bulkPair(t, bulkDown, func(c net.Conn) {
		for i := 0; ; i++ {
			b := bulkPattern
			if i == 16 {
				b = b[1:]
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	})
	if err := moveFor(s, bulkDown, 200*time.Millisecond); err == nil {
		t.Error("a download that lost a byte passed its check")
	}
	// A pod that reads everything but reports one byte less.
	s = bulkPair(t, bulkUp, func(c net.Conn) {
		buf := make([]byte, bulkPeriod)
		var n uint64
		for {
			k, err := c.Read(buf)
			n += uint64(k)
			if err != nil {
				break
			}
		}
		reply := binary.BigEndian.AppendUint64(nil, n-1)
		c.Write(append(reply, 1))
	})
	if err := moveFor(s, bulkUp, 100*time.Millisecond); err == nil {
		t.Error("an upload the pod counted short passed its check")
	}
	if bulkMatches(append([]byte{bulkPattern[0] ^ 1}, bulkPattern[1:9]...), 0) {
		t.Error("bulkMatches accepted a flipped byte")
	}
	if !bulkMatches(append(append([]byte{}, bulkPattern[bulkPeriod-3:]...), bulkPattern[:5]...), 5*bulkPeriod-3) {
		t.Error("bulkMatches rejected the pattern across its period")
	}
}
