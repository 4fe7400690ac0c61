package reconcile

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
)

// Default masquerade source ports: the whole unprivileged range, as
// netfilter's MASQUERADE draws from, minus the node's ephemeral range
// (net.ipv4.ip_local_port_range), where the node's own sockets take their
// ports: a masqueraded flow and a local socket towards the same backend
// must never share a port. With Linux's default ephemeral range that
// leaves 1024-32767 and 61000-65535, 36,280 ports per backend address and
// port. The datapath also asks the socket tables before it takes a port.
const (
	DefaultSNATPortMin = 1024
	DefaultSNATPortMax = 65535
)

// EphemeralPorts reads the range local sockets take ports from in the
// calling thread's network namespace.
func EphemeralPorts() (lo, hi uint16, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ip_local_port_range: %q", b)
	}
	l, err1 := strconv.ParseUint(f[0], 10, 16)
	h, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil || l > h {
		return 0, 0, fmt.Errorf("ip_local_port_range: %q", b)
	}
	return uint16(l), uint16(h), nil
}

// ifAddrs returns, per interface index, the masquerade address MASQUERADE
// would pick there: the first primary address of global scope of each
// family (link-scope gateways and secondary addresses never are).
func ifAddrs() (map[uint32]xbpf.IfAddrs, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	out := map[uint32]xbpf.IfAddrs{}
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.Flags&unix.IFA_F_SECONDARY != 0 || a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		v := out[uint32(a.LinkIndex)]
		enc, _ := maps.EncodeAddr(ip)
		switch {
		case ip.Is4() && v.Addr4 == [16]byte{}:
			v.Addr4 = enc
		case ip.Is6() && v.Addr6 == [16]byte{} && !ip.IsLinkLocalUnicast():
			v.Addr6 = enc
		}
		out[uint32(a.LinkIndex)] = v
	}
	return out, nil
}

// syncIfSNAT makes xvs_if_snat hold the interfaces' masquerade addresses
// as the node has them now.
func (d *Datapath) syncIfSNAT() error {
	want := map[uint32]xbpf.IfAddrs{}
	if len(d.masqAddrs) == 0 {
		var err error
		if want, err = ifAddrs(); err != nil {
			return err
		}
	}
	// With --masquerade-address, the map stays empty: every flow
	// leaves from the configured address (xvs_config's).
	for idx, v := range want {
		if have, ok := d.node.ifSNAT[idx]; ok && have == v {
			continue
		}
		if err := d.w.ifSNAT.put([]uint32{idx}, []xbpf.IfAddrs{v}); err != nil {
			return fmt.Errorf("write masquerade address of interface %d: %w", idx, err)
		}
	}
	for idx := range d.node.ifSNAT {
		if _, ok := want[idx]; !ok {
			if err := d.w.ifSNAT.del([]uint32{idx}); err != nil {
				return fmt.Errorf("delete masquerade address of interface %d: %w", idx, err)
			}
		}
	}
	d.node.ifSNAT = want
	return nil
}
