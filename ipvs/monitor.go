package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/model"
)

// The drop and reject events of ipvs mode. Every rule of xvs's tables that
// drops or refuses a packet, and one that sees the new connections IPVS
// will refuse for want of a real server, logs the packet to NFLOG group
// MonitorGroup first (at most MonitorRate a second, in bursts of
// MonitorBurst: the kernel's limit, per rule) with the verdict in its
// prefix. The kernel copies a logged packet to userspace only while a
// socket is bound to the group, so the rules cost a lookup when nobody
// listens; `xvs monitor --proxy-mode ipvs` binds it.
const (
	// MonitorGroup is the NFLOG group of xvs's rules ("xv").
	MonitorGroup = 0x7876
	MonitorRate  = 1000
	MonitorBurst = 200
	// monitorPrefix starts every xvs log prefix; the verdict follows.
	monitorPrefix = "xvs:"
	// monitorSnap is how much of a packet the kernel copies: the IP
	// header, IPv6 extension headers and the transport ports and flags.
	monitorSnap = 160
)

// logStatement is the nft statements that log a packet for the monitor
// with verdict as its reason.
func logStatement(verdict string) string {
	return fmt.Sprintf("limit rate %d/second burst %d packets log prefix \"%s%s \" group %d",
		MonitorRate, MonitorBurst, monitorPrefix, verdict, MonitorGroup)
}

// nfnetlink_log (include/uapi/linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG  = 4
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQThresh = 5
	nfulaCfgFlags   = 6

	nfulnlCfgCmdBind   = 1
	nfulnlCfgCmdUnbind = 2
	nfulnlCopyPacket   = 2
	nfulnlCfgFSeq      = 0x0001

	nfulaPacketHdr    = 1
	nfulaTimestamp    = 3
	nfulaIfindexIn    = 4
	nfulaIfindexOut   = 5
	nfulaPayload      = 9
	nfulaPrefix       = 10
	nfulaSeq          = 12
	nfHookLocalIn     = 1
	nfHookLocalOut    = 3
	nlaTypeMask       = 0x3fff
	nfnetlinkV0       = 0
	monitorRcvBufSize = 4 << 20
)

// Monitor reads ipvs mode's drop and reject events from NFLOG group
// MonitorGroup of the network namespace it was opened in.
type Monitor struct {
	fd      int
	reqSeq  uint32
	nextSeq uint32 // the NFULA_SEQ the next packet should carry
	started bool
	lost    uint64
	pending []model.MonitorEvent
	// links names devices in the monitor's namespace, whatever thread
	// reads the events.
	links   *netlink.Handle
	devices *model.DeviceNames
	buf     []byte
}

// OpenMonitor binds the NFLOG group of xvs's rules in the calling thread's
// network namespace. Only one socket may bind a group: a second monitor
// gets an error that says so.
func OpenMonitor() (_ *Monitor, err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("monitor: netfilter netlink socket: %w", err)
	}
	m := &Monitor{fd: fd, buf: make([]byte, 1<<16)}
	defer func() {
		if err != nil {
			unix.Close(fd)
			if m.links != nil {
				m.links.Close()
			}
		}
	}()
	if m.links, err = netlink.NewHandle(); err != nil {
		return nil, fmt.Errorf("monitor: netlink handle: %w", err)
	}
	m.devices = model.NewDeviceNames(func(ifindex int) (string, error) {
		link, err := m.links.LinkByIndex(ifindex)
		if err != nil {
			return "", err
		}
		return link.Attrs().Name, nil
	})
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("monitor: bind netlink socket: %w", err)
	}
	// A burst at the limit fits whole; what does not is counted as lost.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, monitorRcvBufSize)
	if err := m.config(nla(nfulaCfgCmd, []byte{nfulnlCfgCmdBind})); err != nil {
		// The kernel answers EPERM when another socket holds the group.
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("monitor: NFLOG group %d is bound by another process (another xvs monitor?)", MonitorGroup)
		}
		return nil, fmt.Errorf("monitor: bind NFLOG group %d: %w", MonitorGroup, err)
	}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, monitorSnap)
	mode[4] = nfulnlCopyPacket
	flags := binary.BigEndian.AppendUint16(nil, nfulnlCfgFSeq)
	// The kernel batches 100 packets or a second by default
	// (NFULNL_QTHRESH_DEFAULT, NFULNL_TIMEOUT_DEFAULT): a monitor wants
	// each packet as it is dropped. The rules' rate limit bounds how
	// many messages that makes.
	qthresh := binary.BigEndian.AppendUint32(nil, 1)
	if err := m.config(slices.Concat(nla(nfulaCfgMode, mode), nla(nfulaCfgFlags, flags), nla(nfulaCfgQThresh, qthresh))); err != nil {
		m.config(nla(nfulaCfgCmd, []byte{nfulnlCfgCmdUnbind}))
		return nil, fmt.Errorf("monitor: configure NFLOG group %d: %w", MonitorGroup, err)
	}
	return m, nil
}

// nla is one netlink attribute, padded.
func nla(typ uint16, val []byte) []byte {
	b := make([]byte, 4, 4+len(val)+3)
	binary.NativeEndian.PutUint16(b, uint16(4+len(val)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// config sends a configuration message for the group and waits for its
// acknowledgement; packets that arrive meanwhile are kept for Read.
func (m *Monitor) config(attrs []byte) error {
	m.reqSeq++
	msg := make([]byte, unix.SizeofNlMsghdr+4, unix.SizeofNlMsghdr+4+len(attrs))
	binary.NativeEndian.PutUint32(msg[0:], uint32(cap(msg)))
	binary.NativeEndian.PutUint16(msg[4:], nfnlSubsysULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], m.reqSeq)
	msg[16] = unix.AF_UNSPEC
	msg[17] = nfnetlinkV0
	binary.BigEndian.PutUint16(msg[18:], MonitorGroup)
	msg = append(msg, attrs...)
	if err := unix.Sendto(m.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		msgs, err := m.receive(deadline)
		if err != nil {
			return err
		}
		for _, nm := range msgs {
			if nm.Header.Type != unix.NLMSG_ERROR {
				m.packet(nm)
				continue
			}
			if nm.Header.Seq != m.reqSeq || len(nm.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(nm.Data)); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}

// receive reads one datagram of netlink messages, waiting until deadline
// (zero: for ever) for it.
func (m *Monitor) receive(deadline time.Time) ([]syscall.NetlinkMessage, error) {
	for {
		timeout := -1
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, os.ErrDeadlineExceeded
			}
			timeout = int(left.Milliseconds()) + 1
		}
		fds := []unix.PollFd{{Fd: int32(m.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, timeout); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, err
		}
		if fds[0].Revents == 0 {
			continue // the deadline check above ends the wait
		}
		n, _, err := unix.Recvfrom(m.fd, m.buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.ENOBUFS):
			// The socket's buffer overflowed: packets were lost, and
			// the next one's sequence number says how many.
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, err
		}
		return syscall.ParseNetlinkMessage(m.buf[:n])
	}
}

// Read returns the next event, waiting until deadline (zero: none); it
// returns os.ErrDeadlineExceeded when the deadline passes first.
func (m *Monitor) Read(deadline time.Time) (model.MonitorEvent, error) {
	for len(m.pending) == 0 {
		msgs, err := m.receive(deadline)
		if err != nil {
			return model.MonitorEvent{}, err
		}
		for _, nm := range msgs {
			m.packet(nm)
		}
	}
	ev := m.pending[0]
	m.pending = m.pending[1:]
	return ev, nil
}

// packet queues the event of one NFULNL_MSG_PACKET message (anything
// else, and packets of other rules' prefixes, are skipped).
func (m *Monitor) packet(nm syscall.NetlinkMessage) {
	if nm.Header.Type != nfnlSubsysULOG<<8|nfulnlMsgPacket || len(nm.Data) < 4 {
		return
	}
	var (
		prefix  string
		payload []byte
		hook    uint8
		in, out uint32
		seq     uint32
		hasSeq  bool
		stamp   time.Time
		family  = nm.Data[0]
		data    = nm.Data[4:]
	)
	for len(data) >= 4 {
		l := int(binary.NativeEndian.Uint16(data))
		typ := binary.NativeEndian.Uint16(data[2:]) & nlaTypeMask
		if l < 4 || l > len(data) {
			break
		}
		v := data[4:l]
		switch {
		case typ == nfulaPacketHdr && len(v) >= 3:
			hook = v[2]
		case typ == nfulaTimestamp && len(v) >= 16:
			sec, usec := binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
			stamp = time.Unix(int64(sec), int64(usec)*1000)
		case typ == nfulaIfindexIn && len(v) >= 4:
			in = binary.BigEndian.Uint32(v)
		case typ == nfulaIfindexOut && len(v) >= 4:
			out = binary.BigEndian.Uint32(v)
		case typ == nfulaPayload:
			payload = v
		case typ == nfulaPrefix:
			prefix = strings.TrimRight(string(v), "\x00")
		case typ == nfulaSeq && len(v) >= 4:
			seq, hasSeq = binary.BigEndian.Uint32(v), true
		}
		data = data[min((l+3)&^3, len(data)):]
	}
	if hasSeq {
		if m.started && seq != m.nextSeq {
			m.lost += uint64(seq - m.nextSeq)
		}
		m.started, m.nextSeq = true, seq+1
	}
	reason, ok := strings.CutPrefix(strings.TrimSpace(prefix), monitorPrefix)
	if !ok {
		return
	}
	ev, ok := decodePacket(family, payload)
	if !ok {
		return
	}
	ev.Time, ev.Reason, ev.Type = stamp, reason, "drop"
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if strings.HasPrefix(reason, "reject_") {
		ev.Type = "reject"
	}
	switch hook {
	case nfHookLocalIn:
		ev.Hook, ev.Device = "input", m.devices.Name(in)
	case nfHookLocalOut:
		ev.Hook, ev.Device = "output", m.devices.Name(out)
	default:
		ev.Hook = fmt.Sprintf("hook%d", hook)
	}
	m.pending = append(m.pending, ev)
}

// decodePacket reads the addresses, protocol, ports, length and TCP flags
// of a logged IPv4 or IPv6 packet.
func decodePacket(family uint8, p []byte) (model.MonitorEvent, bool) {
	var (
		ev       model.MonitorEvent
		src, dst netip.Addr
		proto    uint8
		l4       []byte
	)
	switch {
	case family == unix.AF_INET && len(p) >= 20 && p[0]>>4 == 4:
		ihl := int(p[0]&0xf) * 4
		if ihl < 20 || len(p) < ihl {
			return ev, false
		}
		ev.Length = uint32(binary.BigEndian.Uint16(p[2:]))
		proto = p[9]
		src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		if binary.BigEndian.Uint16(p[6:])&0x1fff == 0 { // not a later fragment
			l4 = p[ihl:]
		}
	case family == unix.AF_INET6 && len(p) >= 40 && p[0]>>4 == 6:
		ev.Length = 40 + uint32(binary.BigEndian.Uint16(p[4:]))
		src, dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		proto, l4 = p[6], p[40:]
		for l4 != nil {
			switch proto {
			case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS:
				if len(l4) < 8 || len(l4) < 8+int(l4[1])*8 {
					return ev, false
				}
				proto, l4 = l4[0], l4[8+int(l4[1])*8:]
				continue
			case unix.IPPROTO_FRAGMENT:
				if len(l4) < 8 {
					return ev, false
				}
				first := binary.BigEndian.Uint16(l4[2:])&^7 == 0
				proto, l4 = l4[0], l4[8:]
				if !first {
					l4 = nil
				}
				continue
			}
			break
		}
	default:
		return ev, false
	}
	ev.Protocol = model.Protocol(proto).String()
	var sport, dport uint16
	if len(l4) >= 4 && (proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP || proto == unix.IPPROTO_SCTP) {
		sport, dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	}
	if proto == unix.IPPROTO_TCP && len(l4) >= 14 {
		ev.TCPFlags = model.TCPFlagNames(l4[13])
	}
	ev.Source, ev.Destination = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	return ev, true
}

// Counts says how many events were lost on the way (the socket's buffer
// overflowed), from the gaps in the kernel's sequence numbers. Packets
// over the rules' rate limit are not logged and not counted here: the
// rules' own counters (nft list table ip xvs-ipvs) count every packet.
func (m *Monitor) Counts() (model.MonitorCounts, error) {
	return model.MonitorCounts{Lost: m.lost}, nil
}

// Close unbinds the group and closes the socket.
func (m *Monitor) Close() error {
	err := m.config(nla(nfulaCfgCmd, []byte{nfulnlCfgCmdUnbind}))
	m.links.Close()
	return errors.Join(err, unix.Close(m.fd))
}
