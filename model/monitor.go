package model

import (
	"fmt"
	"net/netip"
	"time"
)

// MonitorEvent is one packet the datapath dropped or refused, as `xvs
// monitor` reports it in either mode: the packet as it arrived, before any
// translation.
type MonitorEvent struct {
	Time time.Time `json:"time"`
	// Type is "drop" or "reject" (a TCP RST or ICMP unreachable went
	// back to the client).
	Type string `json:"type"`
	// Reason is the verdict, named as xvs_datapath_packets_total and
	// xvs explain name it.
	Reason   string         `json:"reason"`
	Protocol string         `json:"protocol"`
	Source   netip.AddrPort `json:"source"`
	// Destination is the address the client sent to: the frontend, for
	// Service traffic.
	Destination netip.AddrPort `json:"destination"`
	Device      string         `json:"device"`
	// Hook is where the packet was seen: tc, xdp or socket (a host
	// process's connect or sendmsg) in ebpf mode; input or output (the
	// netfilter hook of xvs's rules) in ipvs mode.
	Hook     string `json:"hook"`
	Length   uint32 `json:"length"`
	TCPFlags string `json:"tcpFlags,omitempty"`
}

// MonitorCounts are the events the datapath did not deliver: over the rate
// limit (Suppressed) and lost on the way to the reader (Lost).
type MonitorCounts struct {
	Suppressed uint64 `json:"suppressed"`
	Lost       uint64 `json:"lost"`
}

// MonitorSource is where xvs monitor reads events: the ebpf datapath's
// event ring or ipvs mode's NFLOG group.
type MonitorSource interface {
	// Read returns the next event, waiting until deadline (zero: none);
	// os.ErrDeadlineExceeded when it passes first.
	Read(deadline time.Time) (MonitorEvent, error)
	Counts() (MonitorCounts, error)
	Close() error
}

// TCPFlagNames names the flags of a TCP header's flags byte, comma
// separated, as xvs monitor prints them.
func TCPFlagNames(f uint8) string {
	names := [...]string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"}
	out := ""
	for i, n := range names {
		if f&(1<<i) != 0 {
			if out != "" {
				out += ","
			}
			out += n
		}
	}
	return out
}

// DeviceNames names the interfaces monitor events carry by index, looking
// each index up once. A device gone before its first lookup keeps the
// name ifN.
type DeviceNames struct {
	lookup func(ifindex int) (string, error)
	names  map[uint32]string
}

// NewDeviceNames names devices with lookup (an interface's name in the
// namespace the monitor watches).
func NewDeviceNames(lookup func(ifindex int) (string, error)) *DeviceNames {
	return &DeviceNames{lookup: lookup, names: map[uint32]string{}}
}

// Name is the device's name; "" for index 0 (no device).
func (d *DeviceNames) Name(ifindex uint32) string {
	if ifindex == 0 {
		return ""
	}
	if name, ok := d.names[ifindex]; ok {
		return name
	}
	name := fmt.Sprintf("if%d", ifindex)
	if n, err := d.lookup(int(ifindex)); err == nil {
		name = n
	}
	d.names[ifindex] = name
	return name
}
