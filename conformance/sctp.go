package conformance

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/lab"
)

// SCTP support. Go's net package has no SCTP, but a one-to-one style SCTP
// socket (SOCK_STREAM, IPPROTO_SCTP) behaves like a TCP socket for
// accept/read/write, so the runner creates it with raw syscalls and hands
// it to net.FileListener / net.FileConn for deadlines and the poller. The
// kernel needs the sctp module; without it socket() fails and the probe
// reports that, as a failure.

func sctpSockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

func sctpSocket(a netip.Addr) (int, error) {
	fam := unix.AF_INET
	if a.Is6() {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("SCTP socket: %w (%s)", err, sctpKernel())
	}
	return fd, nil
}

// sctpEcho answers SCTP associations like lab's echo servers answer TCP:
// a greeting with the local address it was reached on and the peer, then
// an echo of whatever comes.
type sctpEcho struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startSCTPEcho(ns *lab.NS, ap netip.AddrPort) (*sctpEcho, error) {
	s := &sctpEcho{conns: map[net.Conn]bool{}}
	err := ns.Do(func() error {
		fd, err := sctpSocket(ap.Addr())
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp-listener")
		defer f.Close() // FileListener dups the descriptor
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if ap.Addr().Is6() {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return err
			}
		}
		if err := unix.Bind(fd, sctpSockaddr(ap)); err != nil {
			return fmt.Errorf("bind SCTP %s: %w", ap, err)
		}
		if err := unix.Listen(fd, 128); err != nil {
			return err
		}
		s.ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: SCTP echo on %s: %w", ns.Name, ap, err)
	}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *sctpEcho) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			if _, err := io.WriteString(c, lab.Greeting(addrPortOf(c.LocalAddr()), addrPortOf(c.RemoteAddr()))); err != nil {
				return
			}
			io.Copy(c, c)
		}()
	}
}

func (s *sctpEcho) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// waitConnected polls a connecting socket until it is writable (connected)
// or has an error, an ICMP unreachable for the INIT arrives, or timeout
// passes (EINPROGRESS, reported as DROP).
func waitConnected(fd int, icmp *icmpWatch, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.EINPROGRESS
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}, {Fd: int32(icmp.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			continue // re-check the deadline
		}
		if pfd[1].Revents&unix.POLLIN != 0 && icmp.unreachable() {
			return unix.EHOSTUNREACH
		}
		if pfd[0].Revents == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		if pfd[0].Revents&unix.POLLOUT != 0 {
			return nil
		}
	}
}

// icmpWatch sees ICMP(v6) destination-unreachable messages quoting our
// INIT. Linux SCTP treats them as soft errors and keeps retrying the INIT
// (only protocol-unreachable aborts), so a client never sees the REJECT a
// proxy sends as ICMP; FORMAT's REJECT is "ICMP unreachable seen by the
// client", which this raw socket in the client's namespace observes.
type icmpWatch struct {
	fd       int
	v6       bool
	src, dst netip.AddrPort
}

func newICMPWatch(sctpFD int, src netip.Addr, dst netip.AddrPort) (*icmpWatch, error) {
	sa, err := unix.Getsockname(sctpFD)
	if err != nil {
		return nil, err
	}
	var port int
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		port = a.Port
	case *unix.SockaddrInet6:
		port = a.Port
	}
	w := &icmpWatch{v6: dst.Addr().Is6(), src: netip.AddrPortFrom(src, uint16(port)), dst: dst}
	fam, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if w.v6 {
		fam, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	if w.fd, err = unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto); err != nil {
		return nil, fmt.Errorf("raw ICMP socket: %w", err)
	}
	return w, nil
}

func (w *icmpWatch) close() { unix.Close(w.fd) }

// unreachable drains the socket and reports whether a destination
// unreachable quoting our INIT (same addresses, SCTP, same ports) arrived.
func (w *icmpWatch) unreachable() bool {
	buf := make([]byte, 1500)
	found := false
	for {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		if err != nil {
			return found
		}
		found = found || w.matches(buf[:n])
	}
}

func (w *icmpWatch) matches(b []byte) bool {
	var q []byte // the quoted IP packet
	if w.v6 {
		// Raw ICMPv6 sockets deliver the message without the IPv6 header.
		if len(b) < 8 || b[0] != 1 { // destination unreachable
			return false
		}
		q = b[8:]
		if len(q) < 44 || q[6] != unix.IPPROTO_SCTP {
			return false
		}
		return netip.AddrFrom16([16]byte(q[8:24])) == w.src.Addr() && netip.AddrFrom16([16]byte(q[24:40])) == w.dst.Addr() &&
			portsMatch(q[40:44], w.src.Port(), w.dst.Port())
	}
	// Raw ICMP sockets deliver the IPv4 header too.
	if len(b) < 20 {
		return false
	}
	ihl := int(b[0]&0x0f) * 4
	if len(b) < ihl+8 || b[ihl] != 3 { // destination unreachable
		return false
	}
	q = b[ihl+8:]
	if len(q) < 20 {
		return false
	}
	qihl := int(q[0]&0x0f) * 4
	if len(q) < qihl+4 || q[9] != unix.IPPROTO_SCTP {
		return false
	}
	return netip.AddrFrom4([4]byte(q[12:16])) == w.src.Addr() && netip.AddrFrom4([4]byte(q[16:20])) == w.dst.Addr() &&
		portsMatch(q[qihl:qihl+4], w.src.Port(), w.dst.Port())
}

func portsMatch(b []byte, src, dst uint16) bool {
	return uint16(b[0])<<8|uint16(b[1]) == src && uint16(b[2])<<8|uint16(b[3]) == dst
}

// addrPortOf reads the address of an SCTP socket wrapped by the net
// package (which takes a SOCK_STREAM inet socket for TCP).
func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return unmapAP(t.AddrPort())
	}
	return netip.AddrPort{}
}

// probeSCTP opens an association from ns/src to dst and reads the greeting.
// A refused association (ABORT) or an ICMP error is REJECT; no answer
// within timeout is DROP.
func probeSCTP(ns *lab.NS, src netip.Addr, dst netip.AddrPort, timeout time.Duration) try {
	var c net.Conn
	err := ns.Do(func() error {
		fd, err := sctpSocket(dst.Addr())
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp-probe")
		defer f.Close()
		// IP_RECVERR: an ICMP unreachable answering the INIT is a hard
		// error (REJECT), not a soft one the association retries past.
		lvl, free, recverr := unix.IPPROTO_IP, unix.IP_FREEBIND, unix.IP_RECVERR
		if dst.Addr().Is6() {
			lvl, free, recverr = unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, unix.IPV6_RECVERR
		}
		for _, o := range []int{free, recverr} {
			if err := unix.SetsockoptInt(fd, lvl, o, 1); err != nil {
				return err
			}
		}
		if err := unix.Bind(fd, sctpSockaddr(netip.AddrPortFrom(src, 0))); err != nil {
			return fmt.Errorf("bind SCTP %s: %w", src, err)
		}
		// Non-blocking connect, then poll: a blocking SCTP connect sleeps on
		// the association and misses the socket error an ICMP unreachable
		// sets (IP_RECVERR), which poll reports at once as POLLERR.
		if err := unix.SetNonblock(fd, true); err != nil {
			return err
		}
		icmp, err := newICMPWatch(fd, src, dst)
		if err != nil {
			return err
		}
		defer icmp.close()
		if err := unix.Connect(fd, sctpSockaddr(dst)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return err
		}
		if err := waitConnected(fd, icmp, timeout); err != nil {
			return err
		}
		c, err = net.FileConn(f)
		return err
	})
	if err != nil {
		switch {
		case errors.Is(err, unix.EINPROGRESS), errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ETIMEDOUT):
			return try{verdict: lab.Timeout, err: fmt.Errorf("SCTP %s->%s: %w", src, dst, err)}
		}
		err = fmt.Errorf("SCTP %s->%s: %w", src, dst, err)
		return try{verdict: lab.Classify(err), err: err}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, 512)
	var line []byte
	for len(line) < len(buf) {
		n, err := c.Read(buf[:1])
		if err != nil {
			return try{verdict: lab.Classify(err), err: fmt.Errorf("SCTP greeting from %s: %w", dst, err)}
		}
		if n == 1 {
			if buf[0] == '\n' {
				break
			}
			line = append(line, buf[0])
		}
	}
	r, err := lab.ParseGreeting(string(line))
	if err != nil {
		return try{verdict: lab.Failed, err: err}
	}
	return try{verdict: lab.OK, reply: r}
}
