package lab

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// The bulk tools, without any load balancer: a client namespace reaches a
// pod through a routing node, over veths with a 1500-byte MTU (so large
// UDP datagrams are fragmented for real). The failure tests put a
// misbehaving server, or a blackhole route, where the datapath would be,
// and check that the error names what went wrong.

type bulkLab struct {
	node        *Node
	pod, client *NS
}

func newBulkLab(t *testing.T) bulkLab {
	l := newLab(t)
	v4, v6 := families[0], families[1]
	node := must[*Node](t)(l.AddNode("node", v4.node, v6.node))
	return bulkLab{
		node:   node,
		pod:    must[*NS](t)(l.AddPod(node, "pod", v4.pod1, v6.pod1)),
		client: must[*NS](t)(l.AddClient(node, "client", v4.client, v6.client)),
	}
}

func TestPrivBulkTransfer(t *testing.T) {
	b := newBulkLab(t)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			srv := must[*BulkServer](t)(StartBulk(b.pod, netip.AddrPortFrom(f.pod1, 8080)))
			defer srv.Close()
			src := netip.AddrPortFrom(f.client, 0)
			for _, spec := range []TransferSpec{
				{Download: 20 << 20},
				{Upload: 20 << 20},
				{Download: 8 << 20, Upload: 8 << 20},
				{Download: 1}, // smaller than any buffer
			} {
				r, err := Transfer(b.client, src, srv.TCPAddr, spec)
				if err != nil {
					t.Fatalf("%+v: %v", spec, err)
				}
				if r.Downloaded != spec.Download || r.Uploaded != spec.Upload {
					t.Errorf("%+v: moved down %d up %d", spec, r.Downloaded, r.Uploaded)
				}
				if r.Server.Local != srv.TCPAddr || r.Server.Peer != r.Client || r.Client.Addr() != f.client {
					t.Errorf("%+v: server %+v, client %s", spec, r.Server, r.Client)
				}
			}
			// A fixed source port, twice in a row: the server closes first,
			// so no TIME_WAIT socket holds the port.
			fixed := netip.AddrPortFrom(f.client, 40000)
			for range 2 {
				r, err := Transfer(b.client, fixed, srv.TCPAddr, TransferSpec{Download: 1 << 20, Upload: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				if r.Client != fixed || r.Server.Peer != fixed {
					t.Errorf("fixed source: client %s, server saw %s", r.Client, r.Server.Peer)
				}
			}
			// The greeting and the echo still work.
			rep, c, err := DialTCP(b.client, f.client, srv.TCPAddr, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := EchoCheck(c, time.Second); err != nil || rep.Local != srv.TCPAddr {
				t.Errorf("echo against a bulk server: %v, %+v", err, rep)
			}
			c.Close()
			if r := ProbeUDP(b.client, f.client, srv.UDPAddr, time.Second); r.Verdict != OK || r.Reply.Local != srv.UDPAddr {
				t.Errorf("UDP greeting from a bulk server: %v", r)
			}
			if errs := srv.Errors(); len(errs) > 0 {
				t.Errorf("server errors: %v", errs)
			}
		})
	}
}

func TestPrivBulkHalfClose(t *testing.T) {
	b := newBulkLab(t)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			srv := must[*BulkServer](t)(StartBulk(b.pod, netip.AddrPortFrom(f.pod1, 8080), TCP))
			defer srv.Close()
			for _, half := range []HalfClose{HalfCloseClient, HalfCloseServer} {
				spec := TransferSpec{HalfClose: half, Stream: time.Second, Interval: 100 * time.Millisecond, ChunkSize: 4000}
				start := time.Now()
				r, err := Transfer(b.client, netip.AddrPortFrom(f.client, 0), srv.TCPAddr, spec)
				if err != nil {
					t.Fatalf("%s: %v", half, err)
				}
				if r.Chunks != 10 || time.Since(start) < 900*time.Millisecond {
					t.Errorf("%s: %d chunks in %v, want 10 over 1s", half, r.Chunks, time.Since(start))
				}
			}
			if errs := srv.Errors(); len(errs) > 0 {
				t.Errorf("server errors: %v", errs)
			}
		})
	}
}

// fakeServer greets each connection, reads the request line and hands the
// connection to misbehave.
func fakeServer(t *testing.T, ns *NS, addr netip.AddrPort, misbehave func(c net.Conn, req string)) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", addr.String()); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, Greeting(unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort()), unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort())))
				req, _ := readLine(c) // unbuffered: what follows stays for misbehave
				misbehave(c, req)
			}()
		}
	}()
	return unmapAP(ln.Addr().(*net.TCPAddr).AddrPort())
}

func TestPrivBulkFailures(t *testing.T) {
	b := newBulkLab(t)
	v4 := families[0]
	src := netip.AddrPortFrom(v4.client, 0)
	quick := TransferSpec{Stall: 300 * time.Millisecond, Timeout: 5 * time.Second}
	hang := func(c net.Conn, _ string) { io.Copy(io.Discard, c) }
	for _, tc := range []struct {
		name      string
		misbehave func(net.Conn, string)
		spec      TransferSpec
		want      string
	}{
		{"silent", hang, TransferSpec{Download: 1 << 20}, "download stalled after 0 of 1048576 bytes: no progress for 300ms"},
		{"short", func(c net.Conn, req string) {
			io.CopyN(c, newStream(seedOf(req), dirDown, 0), 1000)
			hang(c, req)
		}, TransferSpec{Download: 1 << 20}, "download stalled after 1000 of 1048576 bytes"},
		{"corrupt", func(c net.Conn, req string) {
			d := make([]byte, 5000)
			newStream(seedOf(req), dirDown, 0).Read(d)
			d[4321]++
			c.Write(d)
		}, TransferSpec{Download: 5000}, "download corrupt at byte 4321 of 5000"},
		{"wrong digest", func(c net.Conn, req string) {
			io.CopyN(io.Discard, c, 100)
			fmt.Fprintf(c, "xvs-done up=100 sha256=00 local=%s peer=%s\n", c.LocalAddr(), c.RemoteAddr())
		}, TransferSpec{Upload: 100}, "upload digest mismatch: server got 100 bytes sha256 00"},
		{"stream stops", func(c net.Conn, req string) {
			data := newStream(seedOf(req), dirDown, 0)
			chunk := make([]byte, 100)
			for i := range 3 {
				data.Read(chunk)
				fmt.Fprintf(c, "xvs-chunk seq=%d eof=1\n", i)
				c.Write(chunk)
			}
			hang(c, req)
		}, TransferSpec{HalfClose: HalfCloseClient, Stream: time.Second, Interval: 100 * time.Millisecond, ChunkSize: 100}, "chunk 3 of 10 missing"},
		{"stream skips", func(c net.Conn, req string) {
			fmt.Fprintf(c, "xvs-chunk seq=1 eof=1\n")
		}, TransferSpec{HalfClose: HalfCloseClient, Stream: time.Second, Interval: 100 * time.Millisecond}, "chunk 0 missing: got chunk 1"},
		{"server never half-closes", hang, TransferSpec{HalfClose: HalfCloseServer, Stream: time.Second, Interval: 100 * time.Millisecond}, "its FIN never arrived"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := fakeServer(t, b.pod, netip.AddrPortFrom(v4.pod1, 0), tc.misbehave)
			spec := tc.spec
			spec.Stall, spec.Timeout = quick.Stall, quick.Timeout
			_, err := Transfer(b.client, src, dst, spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func seedOf(req string) uint64 {
	r, _ := parseRequest(strings.TrimSpace(req))
	return r.seed
}

// TestPrivHeldStream holds a flowing connection across a blackhole on the
// path: while packets vanish Check reports a stall; once the route is back
// TCP retransmits and Check finds every byte.
func TestPrivHeldStream(t *testing.T) {
	b := newBulkLab(t)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			srv := must[*BulkServer](t)(StartBulk(b.pod, netip.AddrPortFrom(f.pod1, 8080), TCP))
			defer srv.Close()
			h, err := StartHeldStream(b.client, netip.AddrPortFrom(f.client, 0), srv.TCPAddr, HeldSpec{Rate: 4 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			time.Sleep(300 * time.Millisecond)
			st, err := h.Check(2 * time.Second)
			if err != nil || st.Bytes < 512<<10 {
				t.Fatalf("check: %v (%d bytes)", err, st.Bytes)
			}
			pod := netip.PrefixFrom(f.pod1, f.pod1.BitLen())
			if err := b.node.AddBlackhole(pod); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if _, err := h.Check(300 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "stalled") {
				t.Errorf("check across a blackhole: %v, want a stall", err)
			}
			if err := b.node.addRoute(pod, netip.Addr{}, b.pod.NodeIface, b.node.Primary(f.pod1.Is6())); err != nil {
				t.Fatal(err)
			}
			st2, err := h.Check(5 * time.Second)
			if err != nil || st2.Bytes <= st.Bytes {
				t.Errorf("check after the route is back: %v (%d bytes, %d before)", err, st2.Bytes, st.Bytes)
			}
		})
	}
}

func TestPrivUDPBulk(t *testing.T) {
	b := newBulkLab(t)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			srv := must[*BulkServer](t)(StartBulk(b.pod, netip.AddrPortFrom(f.any, 5353), UDP))
			dst := netip.AddrPortFrom(f.pod1, srv.UDPAddr.Port())
			for _, size := range []int{1, 2000, 20000, 60000} {
				r, err := UDPExchange(b.client, netip.AddrPortFrom(f.client, 0), dst, size, time.Second)
				if err != nil {
					t.Fatalf("%d bytes: %v", size, err)
				}
				if r.Server.Local != dst || r.Server.Peer.Addr() != f.client {
					t.Errorf("%d bytes: server %+v", size, r.Server)
				}
			}
			src := netip.AddrPortFrom(f.client, 41000)
			s, err := StartUDPSession(b.client, src, dst, UDPSpec{Size: 3000, Interval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			start := time.Now()
			if _, err := s.Await(start, time.Second, dst); err != nil {
				t.Fatal(err)
			}
			other := netip.AddrPortFrom(f.pod2, dst.Port())
			_, err = s.Await(start, 200*time.Millisecond, other)
			if err == nil || !strings.Contains(err.Error(), "answered since by "+dst.String()) {
				t.Errorf("await a backend that never answers: %v", err)
			}
			// The server goes away and a new one takes its place: the same
			// source port reaches it, and what happened between is counted.
			srv.Close()
			time.Sleep(100 * time.Millisecond)
			gone := time.Now()
			must[*BulkServer](t)(StartBulk(b.pod, netip.AddrPortFrom(f.any, 5353), UDP))
			if _, err := s.Await(gone, time.Second, dst); err != nil {
				t.Fatal(err)
			}
			if n, errs := s.Errors(); n == 0 || !strings.Contains(fmt.Sprint(errs), "refused") {
				t.Errorf("the closed port's ICMP errors: %d %v", n, errs)
			}
			for _, r := range s.Replies() {
				if r.Server.Peer != src || r.Size != 3000 {
					t.Fatalf("reply %+v", r)
				}
			}
		})
	}
}
