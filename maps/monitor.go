package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Monitor reads the datapath's drop and reject events from the pinned
// xvs_events ring. While it is open the datapath writes them (at most
// Rate a second per CPU, bursts of Burst); Close turns them off again.
type Monitor struct {
	events, settings, buckets *ebpf.Map
	rd                        *ringbuf.Reader
	// monoOffset turns the events' CLOCK_MONOTONIC stamps into wall time.
	monoOffset time.Duration
	devices    *model.DeviceNames
}

// DefaultMonitorRate and DefaultMonitorBurst bound the events per CPU:
// enough to see every refused connection of a misbehaving client, too few
// for a flood of dropped packets to cost the datapath more than a counter
// increment each.
const (
	DefaultMonitorRate  = 1000
	DefaultMonitorBurst = 200
)

// OpenMonitor opens the pinned event ring and turns the events on at rate
// per second per CPU, in bursts of burst.
func OpenMonitor(pinPath string, rate, burst uint32) (_ *Monitor, err error) {
	if rate == 0 {
		return nil, errors.New("monitor: a rate of 0 events a second reports nothing")
	}
	m := &Monitor{devices: model.NewDeviceNames(func(ifindex int) (string, error) {
		ifi, err := net.InterfaceByIndex(ifindex)
		if err != nil {
			return "", err
		}
		return ifi.Name, nil
	})}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	for name, dst := range map[string]**ebpf.Map{
		xbpf.XvsMapXvsEvents:        &m.events,
		xbpf.XvsMapXvsMonitorConfig: &m.settings,
		xbpf.XvsMapXvsMonitorState:  &m.buckets,
	} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no %s under %s: no agent of this version has loaded the datapath there", name, pinPath)
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		*dst = mp
	}
	if m.rd, err = ringbuf.NewReader(m.events); err != nil {
		return nil, fmt.Errorf("read %s: %w", xbpf.XvsMapXvsEvents, err)
	}
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		return nil, err
	}
	m.monoOffset = time.Duration(time.Now().UnixNano() - mono.Nano())
	// The rate limiter starts afresh, and so do its counts: what Counts
	// reports is this monitor's.
	if err := m.buckets.Update(uint32(0), make([]xbpf.MonitorBucket, ebpf.MustPossibleCPU()), ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("reset the rate limiter: %w", err)
	}
	on := MonitorSettings(rate, burst)
	if err := m.settings.Update(uint32(0), &on, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("turn the events on: %w", err)
	}
	return m, nil
}

// MonitorSettings are the datapath's settings for events at rate a second
// per CPU in bursts of burst (at least 1).
func MonitorSettings(rate, burst uint32) xbpf.MonitorSettings {
	cost := uint64(time.Second) / uint64(max(rate, 1))
	return xbpf.MonitorSettings{Enabled: 1, Rate: rate, Burst: burst, Cost: cost, Ahead: cost * uint64(max(burst, 1)-1)}
}

// Read waits for the next event, until deadline (zero: none); it returns
// os.ErrDeadlineExceeded when the deadline passes first.
func (m *Monitor) Read(deadline time.Time) (model.MonitorEvent, error) {
	m.rd.SetDeadline(deadline)
	rec, err := m.rd.Read()
	if err != nil {
		return model.MonitorEvent{}, err
	}
	var raw xbpf.Event
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return model.MonitorEvent{}, fmt.Errorf("event of %d bytes: %w", len(rec.RawSample), err)
	}
	return m.decode(raw), nil
}

func (m *Monitor) decode(raw xbpf.Event) model.MonitorEvent {
	reason := VerdictName(xbpf.Verdict(raw.Verdict))
	ev := model.MonitorEvent{
		Time:        time.Unix(0, int64(raw.Ts)+int64(m.monoOffset)),
		Type:        "drop",
		Reason:      reason,
		Protocol:    model.Protocol(raw.Proto).String(),
		Source:      netip.AddrPortFrom(DecodeAddr(raw.Saddr, raw.Family), Ntohs(raw.Sport)),
		Destination: netip.AddrPortFrom(DecodeAddr(raw.Daddr, raw.Family), Ntohs(raw.Dport)),
		Hook:        "tc",
		Length:      raw.Len,
	}
	if strings.HasPrefix(reason, "reject_") || xbpf.Verdict(raw.Verdict) == xbpf.XvsXvsVerdictXVS_V_SOCK_REFUSED {
		ev.Type = "reject"
	}
	switch xbpf.Hook(raw.Hook) {
	case xbpf.XvsXvsHookXVS_HOOK_XDP:
		ev.Hook = "xdp"
	case xbpf.XvsXvsHookXVS_HOOK_SOCK:
		// A host process's connect() or sendmsg(): no device, no packet
		// yet; the source is the node's address, port 0.
		ev.Hook = "socket"
	}
	if ev.Hook != "socket" {
		ev.Device = m.devices.Name(raw.Ifindex) // the node's namespace: the agent's and this one's
	}
	if raw.Proto == uint8(model.TCP) {
		ev.TCPFlags = model.TCPFlagNames(raw.TcpFlags)
	}
	return ev
}

// Counts reads what the datapath did not write since the monitor opened,
// summed over CPUs.
func (m *Monitor) Counts() (model.MonitorCounts, error) {
	var per []xbpf.MonitorBucket
	if err := m.buckets.Lookup(uint32(0), &per); err != nil {
		return model.MonitorCounts{}, err
	}
	var c model.MonitorCounts
	for _, b := range per {
		c.Suppressed += b.Suppressed
		c.Lost += b.Lost
	}
	return c, nil
}

// Close turns the events off and releases the ring.
func (m *Monitor) Close() error {
	var err error
	if m.settings != nil {
		err = m.settings.Update(uint32(0), &xbpf.MonitorSettings{}, ebpf.UpdateAny)
	}
	return errors.Join(err, m.close())
}

func (m *Monitor) close() error {
	var errs []error
	if m.rd != nil {
		errs = append(errs, m.rd.Close())
	}
	for _, mp := range []*ebpf.Map{m.events, m.settings, m.buckets} {
		if mp != nil {
			errs = append(errs, mp.Close())
		}
	}
	return errors.Join(errs...)
}
