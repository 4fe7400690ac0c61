package lab

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Verdict classifies a probe the way the conformance format does.
type Verdict int

const (
	OK      Verdict = iota // a backend answered
	Refused                // TCP RST or ICMP unreachable: the scenario's REJECT
	Timeout                // no answer in time: the scenario's DROP
	Failed                 // anything else (lab or local error)
)

func (v Verdict) String() string {
	return [...]string{"OK", "REFUSED", "TIMEOUT", "ERROR"}[v]
}

// Classify maps a DialTCP/UDPProbe error to a verdict. ENETUNREACH and
// EHOSTUNREACH count as Refused because ICMP net/host/admin-prohibited
// unreachables surface as those; note a missing route in the client itself
// gives ENETUNREACH too.
func Classify(err error) Verdict {
	var ne net.Error
	switch {
	case err == nil:
		return OK
	case errors.Is(err, unix.ECONNREFUSED), errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		return Refused
	case errors.As(err, &ne) && ne.Timeout():
		return Timeout
	}
	return Failed
}

// Result is a classified probe.
type Result struct {
	Verdict Verdict
	Reply   Reply // valid when Verdict == OK
	Err     error // the cause when Verdict != OK
}

func (r Result) String() string {
	if r.Verdict == OK {
		return fmt.Sprintf("OK local=%s peer=%s", r.Reply.Local, r.Reply.Peer)
	}
	return fmt.Sprintf("%s (%v)", r.Verdict, r.Err)
}

// inNS runs f inside ns, or in the caller's namespace when ns is nil (for
// probes from a process in the test's own namespace).
func inNS(ns *NS, f func() error) error {
	if ns == nil {
		return f()
	}
	return ns.Do(f)
}

// dialer binds src (when valid) with IP_FREEBIND, so a source can be used
// before, or without, being configured, and sets IP_RECVERR so a connected
// UDP socket reports every ICMP unreachable, not only the "hard" ones.
//
// A TCP socket over IPv6 gets IPV6_RECVERR for its connect too. When the
// unreachable answering a SYN arrives while connect() still holds the socket
// (a local namespace answers within the same softirq), Linux keeps it as a
// soft error; tcp_v4_err queues it on the error queue whatever IP_RECVERR
// says, which wakes the connect, but ipv6_icmp_error queues it only with
// IPV6_RECVERR, so without it an IPv6 connect waits for the SYN retransmit
// (1 s) and a REJECT looks like a DROP. dialIn clears it once connected, so
// established IPv6 connections treat ICMP errors as IPv4 ones do.
func dialer(src netip.Addr, p Proto, timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if src.IsValid() {
		ip := net.IP(src.Unmap().AsSlice())
		if p == TCP {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		}
	}
	d.Control = func(nw, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			lvl, free, recverr := unix.IPPROTO_IP, unix.IP_FREEBIND, unix.IP_RECVERR
			if strings.HasSuffix(nw, "6") {
				lvl, free, recverr = unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, unix.IPV6_RECVERR
			}
			serr = unix.SetsockoptInt(int(fd), lvl, free, 1)
			if serr == nil && (p == UDP || lvl == unix.IPPROTO_IPV6) {
				serr = unix.SetsockoptInt(int(fd), lvl, recverr, 1)
			}
		})
		return errors.Join(err, serr)
	}
	return d
}

// DialTCP connects from ns (nil: the caller's namespace) with source src
// (zero: kernel's choice) to dst, and reads the echo greeting. On success the
// connection stays open for continuity checks (see EchoCheck); the caller
// closes it. Errors keep their cause for Classify.
func DialTCP(ns *NS, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (Reply, net.Conn, error) {
	deadline := time.Now().Add(timeout)
	c, err := dialIn(ns, src, TCP, dst, timeout)
	if err != nil {
		return Reply{}, nil, err
	}
	c.SetDeadline(deadline)
	line, err := readLine(c)
	if err == nil {
		var r Reply
		if r, err = ParseGreeting(line); err == nil {
			c.SetDeadline(time.Time{})
			return r, c, nil
		}
	}
	c.Close()
	return Reply{}, nil, fmt.Errorf("greeting from %s: %w", dst, err)
}

// dialIn opens a p socket in ns from src to dst; the socket keeps its
// namespace after the thread leaves it.
func dialIn(ns *NS, src netip.Addr, p Proto, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() error {
		var err error
		c, err = dialer(src, p, timeout).Dial(network(p, dst.Addr()), dst.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s->%s: %w", p, src, dst, err)
	}
	established(c, dst)
	return c, nil
}

// established clears IPV6_RECVERR on a connected IPv6 TCP socket (see
// dialer).
func established(c net.Conn, dst netip.AddrPort) {
	if tc, ok := c.(*net.TCPConn); ok && dst.Addr().Unmap().Is6() {
		if rc, err := tc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 0) })
		}
	}
}

// readLine reads byte by byte up to '\n' so nothing after the greeting is
// swallowed by a buffer the caller never sees.
func readLine(c net.Conn) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < 512 {
		if _, err := c.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return string(b), errors.New("greeting too long")
}

// UDPProbe sends payload (a default one when empty) from ns/src to dst on a
// connected UDP socket and parses the reply greeting. Being connected, the
// socket only accepts a reply from dst itself, so a missing reverse NAT
// shows up as Timeout, and ICMP errors show up as Refused.
func UDPProbe(ns *NS, src netip.Addr, dst netip.AddrPort, payload []byte, timeout time.Duration) (Reply, error) {
	if len(payload) == 0 {
		payload = []byte("xvs-probe\n")
	}
	c, err := dialIn(ns, src, UDP, dst, timeout)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, 2048)
	n, err := c.Write(payload)
	if err == nil {
		n, err = c.Read(buf)
	}
	if err != nil {
		return Reply{}, fmt.Errorf("udp %s->%s: %w", c.LocalAddr(), dst, err)
	}
	return ParseGreeting(string(buf[:n]))
}

// ProbeTCP is DialTCP reduced to a verdict; the connection is closed.
func ProbeTCP(ns *NS, src netip.Addr, dst netip.AddrPort, timeout time.Duration) Result {
	r, c, err := DialTCP(ns, src, dst, timeout)
	if c != nil {
		c.Close()
	}
	return Result{Verdict: Classify(err), Reply: r, Err: err}
}

// ProbeUDP is UDPProbe reduced to a verdict.
func ProbeUDP(ns *NS, src netip.Addr, dst netip.AddrPort, timeout time.Duration) Result {
	r, err := UDPProbe(ns, src, dst, nil, timeout)
	return Result{Verdict: Classify(err), Reply: r, Err: err}
}

var pingSeq atomic.Uint64

// EchoCheck sends a unique token on a connection from DialTCP and waits for
// it to come back: the flow is still alive end to end.
func EchoCheck(c net.Conn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	tok := fmt.Appendf(nil, "xvs-ping %d\n", pingSeq.Add(1))
	if _, err := c.Write(tok); err != nil {
		return fmt.Errorf("echo check: %w", err)
	}
	got := make([]byte, len(tok))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("echo check: %w", err)
	}
	if !bytes.Equal(got, tok) {
		return fmt.Errorf("echo check: sent %q, got %q", tok, got)
	}
	return nil
}
