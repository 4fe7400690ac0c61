package ipvs

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/xvs-lb/xvs/model"
)

// Conn is one IPVS connection, as /proc/net/ip_vs_conn (and ipvsadm -Lnc)
// shows it.
type Conn struct {
	Protocol model.Protocol
	Client   netip.AddrPort // FromIP:FPrt
	Virtual  netip.AddrPort // ToIP:TPrt, the virtual server
	Dest     netip.AddrPort // DestIP:DPrt, the real server
	State    string
	Expires  time.Duration
}

// ConnsPath is where the kernel lists IPVS connections of the current
// network namespace.
const ConnsPath = "/proc/net/ip_vs_conn"

// ReadConns lists the IPVS connections of this network namespace.
func ReadConns() ([]Conn, error) {
	f, err := os.Open(ConnsPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseConns(f)
}

// ParseConns reads /proc/net/ip_vs_conn: a header line, then one line per
// connection, "Pro FromIP FPrt ToIP TPrt DestIP DPrt State Expires ...",
// IPv4 addresses as 8 hex digits, IPv6 ones in the kernel's %pI6 form,
// ports as 4 hex digits, the expiry in seconds.
func ParseConns(r io.Reader) ([]Conn, error) {
	var out []Conn
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if n == 1 || len(f) == 0 {
			continue // the header
		}
		if len(f) < 9 {
			return nil, fmt.Errorf("line %d: %d fields, want at least 9", n, len(f))
		}
		c := Conn{State: f[7]}
		var err error
		if c.Protocol, err = model.ParseProtocol(f[0]); err != nil {
			continue // not a protocol of Services: a firewall-mark template ("IP") of another tool's virtual server
		}
		for i, dst := range []*netip.AddrPort{&c.Client, &c.Virtual, &c.Dest} {
			if *dst, err = procAddrPort(f[1+2*i], f[2+2*i]); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
		}
		secs, err := strconv.ParseUint(f[8], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %d: expiry %q: %w", n, f[8], err)
		}
		c.Expires = time.Duration(secs) * time.Second
		out = append(out, c)
	}
	return out, sc.Err()
}

func procAddrPort(addr, port string) (netip.AddrPort, error) {
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, err)
	}
	var a netip.Addr
	if len(addr) == 8 && !strings.Contains(addr, ":") {
		b, err := hex.DecodeString(addr)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %w", addr, err)
		}
		a = netip.AddrFrom4([4]byte(b))
	} else if a, err = netip.ParseAddr(addr); err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", addr, err)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}
