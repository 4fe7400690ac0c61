package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Proto is a transport protocol an echo server or probe speaks.
type Proto int

const (
	TCP Proto = iota
	UDP
)

func (p Proto) String() string {
	if p == UDP {
		return "UDP"
	}
	return "TCP"
}

// network returns "tcp4", "udp6", ...: explicit families keep an unspecified
// IPv4 listener off the dual-stack AF_INET6 path, so addresses never come
// back v4-mapped and a "::" listener takes IPv6 only.
func network(p Proto, a netip.Addr) string {
	n := "tcp"
	if p == UDP {
		n = "udp"
	}
	if a.Unmap().Is4() {
		return n + "4"
	}
	return n + "6"
}

// Reply is what an echo server saw: the address:port the client reached it
// on (after any DNAT) and the client address:port (after any SNAT).
type Reply struct {
	Local netip.AddrPort
	Peer  netip.AddrPort
}

const greetingTag = "xvs-echo"

// Greeting is the line an echo server sends first on every TCP connection
// and as the whole reply to every UDP datagram.
func Greeting(local, peer netip.AddrPort) string {
	return fmt.Sprintf("%s local=%s peer=%s\n", greetingTag, local, peer)
}

// ParseGreeting parses a Greeting line (trailing newline optional).
func ParseGreeting(line string) (Reply, error) {
	var r Reply
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != greetingTag {
		return r, fmt.Errorf("lab: not an echo greeting: %q", line)
	}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			return r, fmt.Errorf("lab: bad greeting %q: %w", line, err)
		}
		switch k {
		case "local":
			r.Local = ap
		case "peer":
			r.Peer = ap
		default:
			return r, fmt.Errorf("lab: bad greeting field %q", kv)
		}
	}
	return r, nil
}

// EchoServer answers TCP connections and UDP datagrams inside one namespace.
type EchoServer struct {
	TCPAddr netip.AddrPort // bound TCP address, zero if TCP was not asked for
	UDPAddr netip.AddrPort // bound UDP address, zero if UDP was not asked for

	ns    *NS
	tcp   net.Listener
	udp   *net.UDPConn
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	bulk  *BulkServer // serves what follows the greeting, when set
}

// StartEcho listens on addr inside ns for the given protocols (TCP and UDP
// when none given) and serves from goroutines; the sockets are created on a
// thread inside ns and stay there. Port 0 picks a free port that the other
// protocol reuses (if that one is taken, StartEcho fails). An unspecified
// addr (0.0.0.0, ::) works: UDP replies are sent from the address each
// datagram was addressed to (IP_PKTINFO), so connected clients accept them.
func StartEcho(ns *NS, addr netip.AddrPort, protos ...Proto) (*EchoServer, error) {
	return startEcho(ns, addr, protos, nil)
}

func startEcho(ns *NS, addr netip.AddrPort, protos []Proto, bulk *BulkServer) (*EchoServer, error) {
	if len(protos) == 0 {
		protos = []Proto{TCP, UDP}
	}
	s := &EchoServer{ns: ns, conns: map[net.Conn]struct{}{}, bulk: bulk}
	if err := ns.lab.register(s); err != nil {
		return nil, err
	}
	err := ns.Do(func() error {
		for _, p := range protos {
			if err := s.listen(p, addr); err != nil {
				return err
			}
			if addr.Port() == 0 { // the other protocol reuses the chosen port
				addr = netip.AddrPortFrom(addr.Addr(), max(s.TCPAddr.Port(), s.UDPAddr.Port()))
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("%s: echo on %s: %w", ns.Name, addr, err)
	}
	if s.tcp != nil {
		s.wg.Add(1)
		go s.serveTCP()
	}
	if s.udp != nil {
		s.wg.Add(1)
		go s.serveUDP()
	}
	return s, nil
}

func (s *EchoServer) listen(p Proto, addr netip.AddrPort) error {
	nw := network(p, addr.Addr())
	if p == TCP {
		ln, err := net.Listen(nw, addr.String())
		if err != nil {
			return err
		}
		s.tcp, s.TCPAddr = ln, unmapAP(ln.Addr().(*net.TCPAddr).AddrPort())
		return nil
	}
	lc := net.ListenConfig{}
	if addr.Addr().IsUnspecified() {
		lc.Control = setPktinfo
	}
	pc, err := lc.ListenPacket(context.Background(), nw, addr.String())
	if err != nil {
		return err
	}
	s.udp = pc.(*net.UDPConn)
	s.UDPAddr = unmapAP(s.udp.LocalAddr().(*net.UDPAddr).AddrPort())
	return nil
}

// setPktinfo asks for the destination address of each datagram so a
// wildcard listener can answer from it.
func setPktinfo(nw, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if strings.HasSuffix(nw, "4") {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		}
	})
	return errors.Join(err, serr)
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (s *EchoServer) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ECONNABORTED: the listener is still fine
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handleTCP(c)
	}
}

func (s *EchoServer) handleTCP(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	local := unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort())
	peer := unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	if _, err := io.WriteString(c, Greeting(local, peer)); err != nil {
		return
	}
	if s.bulk != nil {
		s.bulk.serveTCP(c.(*net.TCPConn), local, peer)
		return
	}
	io.Copy(c, c) // until the peer closes or Close tears the conn down
}

func (s *EchoServer) serveUDP() {
	defer s.wg.Done()
	buf, oob := make([]byte, 64<<10), make([]byte, 256)
	for {
		n, oobn, _, peer, err := s.udp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		local, replyOOB := s.UDPAddr, []byte(nil)
		if local.Addr().IsUnspecified() {
			if dst, ok := pktinfoDst(oob[:oobn]); ok {
				local = netip.AddrPortFrom(dst, local.Port())
				replyOOB = pktinfoSrc(dst)
			}
		}
		peer = unmapAP(peer)
		reply := []byte(nil)
		if s.bulk != nil {
			reply = serveUDPBulk(buf[:n], local, peer)
		}
		if reply == nil {
			reply = []byte(Greeting(local, peer))
		}
		s.udp.WriteMsgUDPAddrPort(reply, replyOOB, peer)
	}
}

// pktinfoDst extracts the datagram's destination address from IP_PKTINFO or
// IPV6_PKTINFO control data.
func pktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }: addr is the header destination.
			return netip.AddrFrom4([4]byte(m.Data[8:12])), true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			return netip.AddrFrom16([16]byte(m.Data[:16])), true
		}
	}
	return netip.Addr{}, false
}

// pktinfoSrc builds control data that makes the kernel send from src.
func pktinfoSrc(src netip.Addr) []byte {
	if src.Is4() {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
}

// Close stops the listeners, tears down open connections and waits for the
// serving goroutines. It is idempotent.
func (s *EchoServer) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	var errs []error
	if s.tcp != nil {
		errs = append(errs, s.tcp.Close())
	}
	if s.udp != nil {
		errs = append(errs, s.udp.Close())
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.ns.lab.unregister(s)
	return errors.Join(errs...)
}
