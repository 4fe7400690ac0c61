package maps

import (
	"encoding/binary"
	"fmt"

	"github.com/xvs-lb/xvs/model"
)

// explainFrame builds the Ethernet frame of an ExplainPacket: IPv4 or IPv6,
// then a TCP SYN (an ACK when Established), a UDP datagram or an SCTP
// common header, each with 8 bytes of payload and valid checksums (SCTP's
// CRC32c is left zero: the datapath does not check it).
func explainFrame(p model.ExplainPacket) ([]byte, error) {
	var l4 []byte
	payload := []byte("xvs-expl")
	switch p.Proto {
	case model.TCP:
		l4 = make([]byte, 20+len(payload))
		binary.BigEndian.PutUint32(l4[4:], 1)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		if p.Established {
			l4[13] = 0x10 // ACK
			binary.BigEndian.PutUint32(l4[8:], 1)
		}
		binary.BigEndian.PutUint16(l4[14:], 65535)
		copy(l4[20:], payload)
	case model.UDP:
		l4 = make([]byte, 8+len(payload))
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], payload)
	case model.SCTP:
		l4 = make([]byte, 12+len(payload))
		copy(l4[12:], payload)
	default:
		return nil, fmt.Errorf("explain: protocol %v", p.Proto)
	}
	binary.BigEndian.PutUint16(l4[0:], p.From.Port())
	binary.BigEndian.PutUint16(l4[2:], p.To.Port())

	src, dst := p.From.Addr().Unmap(), p.To.Addr().Unmap()
	var ip []byte
	var pseudo uint32
	if src.Is4() {
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[8], ip[9] = 64, byte(p.Proto)
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], ^fold16(sum16(ip, 0)))
		pseudo = sum16(ip[12:20], uint32(p.Proto)+uint32(len(l4)))
	} else {
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = byte(p.Proto), 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		pseudo = sum16(ip[8:40], uint32(p.Proto)+uint32(len(l4)))
	}
	switch p.Proto {
	case model.TCP:
		binary.BigEndian.PutUint16(l4[16:], ^fold16(sum16(l4, pseudo)))
	case model.UDP:
		c := ^fold16(sum16(l4, pseudo))
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(l4[6:], c)
	}
	eth := make([]byte, 14)
	eth[0], eth[6] = 0x02, 0x02 // locally administered MACs
	eth[5], eth[11] = 0x02, 0x01
	if src.Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	}
	return append(append(eth, ip...), l4...), nil
}

// sum16 adds b to s as 16-bit big-endian words (RFC 1071).
func sum16(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold16(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
