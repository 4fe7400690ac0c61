package lab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// UDPReply is one answered datagram of the bulk UDP protocol.
type UDPReply struct {
	Seq      uint64
	Size     int       // bytes each way
	Sent     time.Time // when the request left
	Received time.Time
	Server   Reply // where the request arrived (after DNAT) and the peer the server saw
}

// UDPExchange sends one bulk datagram of size bytes (header included, at
// most MaxDatagram) from ns/src to a BulkServer at dst and waits for the
// reply of the same size. src works as in Transfer (a fixed port is bound
// with SO_REUSEADDR). The socket is connected, so a reply from anywhere but
// dst is not accepted (a missing reverse NAT times out) and ICMP errors
// come back for Classify.
func UDPExchange(ns *NS, src, dst netip.AddrPort, size int, timeout time.Duration) (UDPReply, error) {
	c, err := dialFrom(ns, src, UDP, dst, timeout)
	if err != nil {
		return UDPReply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	seed := rand.Uint64()
	if err := sendUDP(c, 0, size, seed); err != nil {
		return UDPReply{}, err
	}
	sent := time.Now()
	buf := make([]byte, MaxDatagram+maxLine)
	for {
		r, err := recvUDP(c, buf, seed)
		if err != nil {
			return UDPReply{}, fmt.Errorf("udp %s->%s, %d bytes: %w", c.LocalAddr(), dst, size, err)
		}
		if r.Seq == 0 {
			r.Sent = sent
			return r, nil
		}
	}
}

func checkSize(size int) error {
	if size > MaxDatagram {
		return fmt.Errorf("udp: size %d over %d", size, MaxDatagram)
	}
	return nil
}

func sendUDP(c net.Conn, seq uint64, size int, seed uint64) error {
	if err := checkSize(size); err != nil {
		return err
	}
	d := udpDatagram(fmt.Sprintf("%sseq=%d size=%d seed=%d\n", udpMagic, seq, size, seed), size, seed, dirUDP, seq)
	if _, err := c.Write(d); err != nil {
		return fmt.Errorf("udp send seq %d: %w", seq, err)
	}
	return nil
}

// recvUDP reads one reply and checks it: intact both ways, the same size.
func recvUDP(c net.Conn, buf []byte, seed uint64) (UDPReply, error) {
	n, err := c.Read(buf)
	if err != nil {
		return UDPReply{}, err
	}
	d := buf[:n]
	h, err := parseUDPHeader(d, "xvs-udp-reply")
	switch {
	case err != nil:
		return UDPReply{}, fmt.Errorf("bad reply: %w (is the server a BulkServer?)", err)
	case !h.ok:
		return UDPReply{}, fmt.Errorf("seq %d: the server got the %d-byte request short or corrupt", h.seq, h.size)
	case n != max(h.size, h.len):
		return UDPReply{}, fmt.Errorf("seq %d: reply of %d bytes, want %d", h.seq, n, h.size)
	case !udpPaddingOK(d, seed, dirUDPReply, h.seq):
		return UDPReply{}, fmt.Errorf("seq %d: reply corrupt", h.seq)
	}
	return UDPReply{Seq: h.seq, Size: h.size, Received: time.Now(), Server: h.reply}, nil
}

// UDPSpec shapes a UDPSession.
type UDPSpec struct {
	Size     int           // bytes per datagram (default 64, at most MaxDatagram)
	Interval time.Duration // one datagram every Interval (default 100ms)
}

// UDPSession is one client socket with a fixed source port that keeps
// sending bulk datagrams to one destination and records who answers each:
// what a DNS client or a game does, and what stale UDP conntrack breaks
// when an endpoint goes away.
type UDPSession struct {
	Local netip.AddrPort // the client socket's address

	c    net.Conn
	spec UDPSpec
	seed uint64
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	sent    map[uint64]time.Time
	nsent   int
	replies []UDPReply
	errs    []error // send errors, ICMP errors, bad replies (the first few)
	nerrs   int
	lastErr error
}

// StartUDPSession binds src in ns (src.Port must be set: the point is
// the fixed port; SO_REUSEADDR) and sends to dst until Close.
func StartUDPSession(ns *NS, src, dst netip.AddrPort, spec UDPSpec) (*UDPSession, error) {
	if src.Port() == 0 {
		return nil, errors.New("udp session: src needs a fixed port")
	}
	if spec.Size <= 0 {
		spec.Size = 64
	}
	if spec.Interval <= 0 {
		spec.Interval = 100 * time.Millisecond
	}
	if err := checkSize(spec.Size); err != nil {
		return nil, err
	}
	c, err := dialFrom(ns, src, UDP, dst, time.Second)
	if err != nil {
		return nil, err
	}
	s := &UDPSession{Local: unmapAP(c.LocalAddr().(*net.UDPAddr).AddrPort()), c: c, spec: spec,
		seed: rand.Uint64(), stop: make(chan struct{}), sent: map[uint64]time.Time{}}
	s.wg.Add(2)
	go s.send()
	go s.receive()
	return s, nil
}

func (s *UDPSession) send() {
	defer s.wg.Done()
	t := time.NewTicker(s.spec.Interval)
	defer t.Stop()
	for seq := uint64(0); ; seq++ {
		s.mu.Lock()
		s.sent[seq] = time.Now()
		s.nsent++
		s.mu.Unlock()
		if err := sendUDP(s.c, seq, s.spec.Size, s.seed); err != nil {
			s.record(err)
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

func (s *UDPSession) receive() {
	defer s.wg.Done()
	buf := make([]byte, MaxDatagram+maxLine)
	for {
		r, err := recvUDP(s.c, buf, s.seed)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // ICMP unreachable (connected socket), or a bad reply
			s.record(err)
			continue
		}
		s.mu.Lock()
		r.Sent = s.sent[r.Seq]
		delete(s.sent, r.Seq)
		s.replies = append(s.replies, r)
		s.mu.Unlock()
	}
}

func (s *UDPSession) record(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nerrs++
	s.lastErr = err
	if len(s.errs) < 10 {
		s.errs = append(s.errs, err)
	}
}

// Replies returns every reply so far, in arrival order.
func (s *UDPSession) Replies() []UDPReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.replies)
}

// Errors returns the number of send errors, ICMP errors and bad replies,
// and the first few of them.
func (s *UDPSession) Errors() (int, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nerrs, slices.Clone(s.errs)
}

// Await waits up to within for a reply, to a datagram sent at or after
// since, from one of backends (the address:port the server was reached on);
// from then on every reply must come from backends too. It returns the
// first such reply, or an error that says who answered meanwhile.
func (s *UDPSession) Await(since time.Time, within time.Duration, backends ...netip.AddrPort) (UDPReply, error) {
	deadline := time.Now().Add(within)
	for {
		s.mu.Lock()
		replies := slices.Clone(s.replies)
		nsent := s.nsent
		s.mu.Unlock()
		first := slices.IndexFunc(replies, func(r UDPReply) bool {
			return !r.Sent.Before(since) && slices.Contains(backends, r.Server.Local)
		})
		if first >= 0 {
			for _, r := range replies[first:] {
				if !r.Sent.Before(replies[first].Sent) && !slices.Contains(backends, r.Server.Local) {
					return r, fmt.Errorf("udp session %s: seq %d answered by %s after seq %d was answered by %s", s.Local, r.Seq, r.Server.Local, replies[first].Seq, replies[first].Server.Local)
				}
			}
			return replies[first], nil
		}
		if time.Now().After(deadline) {
			return UDPReply{}, fmt.Errorf("udp session %s: no reply from %v within %v: %s", s.Local, backends, within, s.summary(replies, since, nsent))
		}
		time.Sleep(s.spec.Interval / 2)
	}
}

// summary says who answered the datagrams sent since t.
func (s *UDPSession) summary(replies []UDPReply, since time.Time, nsent int) string {
	count := map[netip.AddrPort]int{}
	var order []netip.AddrPort
	for _, r := range replies {
		if r.Sent.Before(since) {
			continue
		}
		if count[r.Server.Local] == 0 {
			order = append(order, r.Server.Local)
		}
		count[r.Server.Local]++
	}
	var parts []string
	for _, b := range order {
		parts = append(parts, fmt.Sprintf("%s×%d", b, count[b]))
	}
	if len(parts) == 0 {
		parts = append(parts, "none")
	}
	s.mu.Lock()
	nerrs, last := s.nerrs, s.lastErr
	s.mu.Unlock()
	msg := fmt.Sprintf("%d sent in all, answered since by %s", nsent, strings.Join(parts, " "))
	if nerrs > 0 {
		msg += fmt.Sprintf("; %d errors, the last: %v", nerrs, last)
	}
	return msg
}

// Close stops sending and closes the socket.
func (s *UDPSession) Close() error {
	select {
	case <-s.stop:
		return nil
	default:
	}
	close(s.stop)
	err := s.c.Close()
	s.wg.Wait()
	return err
}
