// Package maps is typed access to the xvs BPF maps: encoding of keys and
// values from the model, batched reads and writes, read-only snapshots and
// connection listings, explain and the monitor's reader. The ebpf
// Datapath that writes a desired state into them is package reconcile.
// It never logs.
package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/model"
)

// Maps holds the xvs maps.
type Maps struct {
	Services  *ebpf.Map
	Backends  *ebpf.Map
	Conntrack *ebpf.Map
	// CtUnreplied holds the flows no reply has been seen for yet.
	CtUnreplied  *ebpf.Map
	SvcStats     *ebpf.Map
	BackendStats *ebpf.Map
	Verdicts     *ebpf.Map
	// Scheduler state: tables (wrr, mh), round-robin cursors, the
	// least-connection counts, session affinity and slot membership.
	SchedTables   *ebpf.Map
	RRCursors     *ebpf.Map
	BackendHeld   *ebpf.Map
	BackendReaped *ebpf.Map
	Affinity      *ebpf.Map
	Members       *ebpf.Map
	// North-south: node settings, local-traffic detector, service
	// CIDRs, source ranges, the set of ClusterIPs.
	NodeConfig   *ebpf.Map
	PodCIDRs     *ebpf.Map
	ServiceCIDRs *ebpf.Map
	SourceRanges *ebpf.Map
	ClusterIPs   *ebpf.Map
	// IfSNAT is the masquerade address per egress interface.
	IfSNAT *ebpf.Map
	// SockFwd is the socket-level balancer's choice per (socket,
	// frontend).
	SockFwd *ebpf.Map
	owned   bool
}

// FromObjects uses the maps of loaded objects (the agent's case).
func FromObjects(o *loader.Objects) *Maps {
	return &Maps{
		Services:     o.XvsServices,
		Backends:     o.XvsBackends,
		Conntrack:    o.XvsConntrack,
		CtUnreplied:  o.XvsCtUnreplied,
		SvcStats:     o.XvsSvcStats,
		BackendStats: o.XvsBackendStats,
		Verdicts:     o.XvsVerdicts,

		SchedTables:   o.XvsSchedTables,
		RRCursors:     o.XvsRrCursors,
		BackendHeld:   o.XvsBackendHeld,
		BackendReaped: o.XvsBackendReaped,
		Affinity:      o.XvsAffinity,
		Members:       o.XvsMembers,

		NodeConfig:   o.XvsNodeConfig,
		PodCIDRs:     o.XvsPodCidrs,
		ServiceCIDRs: o.XvsServiceCidrs,
		SourceRanges: o.XvsSourceRanges,
		ClusterIPs:   o.XvsClusterIps,
		IfSNAT:       o.XvsIfSnat,
		SockFwd:      o.XvsSockFwd,
	}
}

// OpenPinned opens the maps pinned under pinPath read-only, for inspection
// commands that must never change the datapath.
func OpenPinned(pinPath string) (*Maps, error) { return openPinned(pinPath, true) }

// OpenPinnedForFlush opens the same maps with the conntrack tables
// writable, for `xvs conntrack flush` (Maps.ExpireConnections).
func OpenPinnedForFlush(pinPath string) (*Maps, error) { return openPinned(pinPath, false) }

func openPinned(pinPath string, readOnly bool) (*Maps, error) {
	m := &Maps{owned: true}
	for name, dst := range map[string]**ebpf.Map{
		xbpf.XvsMapXvsServices:      &m.Services,
		xbpf.XvsMapXvsBackends:      &m.Backends,
		xbpf.XvsMapXvsConntrack:     &m.Conntrack,
		xbpf.XvsMapXvsCtUnreplied:   &m.CtUnreplied,
		xbpf.XvsMapXvsSvcStats:      &m.SvcStats,
		xbpf.XvsMapXvsBackendStats:  &m.BackendStats,
		xbpf.XvsMapXvsVerdicts:      &m.Verdicts,
		xbpf.XvsMapXvsBackendHeld:   &m.BackendHeld,
		xbpf.XvsMapXvsBackendReaped: &m.BackendReaped,
	} {
		ro := readOnly || name != xbpf.XvsMapXvsConntrack && name != xbpf.XvsMapXvsCtUnreplied
		mp, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: ro})
		if name == xbpf.XvsMapXvsCtUnreplied && errors.Is(err, os.ErrNotExist) {
			continue // pinned by an agent older than the table
		}
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		*dst = mp
	}
	return m, nil
}

// Close releases maps opened by OpenPinned; maps of loaded objects belong
// to the objects.
func (m *Maps) Close() error {
	if !m.owned {
		return nil
	}
	var errs []error
	for _, mp := range []*ebpf.Map{m.Services, m.Backends, m.Conntrack, m.CtUnreplied, m.SvcStats, m.BackendStats, m.Verdicts, m.BackendHeld, m.BackendReaped} {
		if mp != nil {
			errs = append(errs, mp.Close())
		}
	}
	return errors.Join(errs...)
}

// ConntrackTables are the two conntrack tables: flows that have seen a
// reply, and flows that have not (each flow's two entries are in one of
// them).
func (m *Maps) ConntrackTables() []*ebpf.Map {
	return []*ebpf.Map{m.Conntrack, m.CtUnreplied}
}

// Addresses travel as 16 bytes; IPv4 uses the first four, so one layout
// serves both families.
func EncodeAddr(a netip.Addr) (addr [16]byte, family uint8) {
	if a.Is4() || a.Is4In6() {
		v4 := a.Unmap().As4()
		copy(addr[:], v4[:])
		return addr, xbpf.FamilyIPv4
	}
	return a.As16(), xbpf.FamilyIPv6
}

func DecodeAddr(addr [16]byte, family uint8) netip.Addr {
	if family == xbpf.FamilyIPv4 {
		return netip.AddrFrom4([4]byte(addr[:4]))
	}
	return netip.AddrFrom16(addr)
}

// Ports are stored in network byte order (__be16) inside host-order u16
// fields: swap on little-endian hosts.
func Htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func Ntohs(p uint16) uint16 { return Htons(p) }

// FrontendKey identifies a frontend independently of its kind.
type FrontendKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto model.Protocol
}

func KeyOf(f model.Frontend) FrontendKey {
	return FrontendKey{Addr: f.Addr.Unmap(), Port: f.Port, Proto: f.Proto}
}

func (k FrontendKey) String() string {
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + k.Proto.String()
}

// SvcKey is the key of the frontend's slot in scope.
func (k FrontendKey) SvcKey(scope uint8, slot uint16) xbpf.SvcKey {
	addr, fam := EncodeAddr(k.Addr)
	return xbpf.SvcKey{Addr: addr, Port: Htons(k.Port), Proto: uint8(k.Proto), Family: fam, Scope: scope, Slot: slot}
}

func FrontendOf(k xbpf.SvcKey) FrontendKey {
	return FrontendKey{Addr: DecodeAddr(k.Addr, k.Family), Port: Ntohs(k.Port), Proto: model.Protocol(k.Proto)}
}

// backendKey identifies a backend: the same pod address, port and protocol
// is one backend whichever Services use it (as an IPVS real server is one
// address:port of one protocol).
// It holds no pointer (netip.Addr does), so that a map of a million of
// them costs the garbage collector nothing to scan.
type BackendKey struct {
	addr  [16]byte // netip.Addr.As16 of the unmapped address
	Port  uint16
	Proto model.Protocol
}

func NewBackendKey(a netip.Addr, port uint16, proto model.Protocol) BackendKey {
	return BackendKey{addr: a.As16(), Port: port, Proto: proto}
}

// Addr is the backend's address, IPv4 for IPv4-mapped keys.
func (k BackendKey) Addr() netip.Addr { return netip.AddrFrom16(k.addr).Unmap() }

func (k BackendKey) String() string {
	return k.Proto.String() + " " + netip.AddrPortFrom(k.Addr(), k.Port).String()
}

var kinds = map[model.FrontendKind]xbpf.Kind{
	model.ClusterIP:    xbpf.XvsXvsKindXVS_KIND_CLUSTER_IP,
	model.NodePort:     xbpf.XvsXvsKindXVS_KIND_NODE_PORT,
	model.ExternalIP:   xbpf.XvsXvsKindXVS_KIND_EXTERNAL_IP,
	model.LoadBalancer: xbpf.XvsXvsKindXVS_KIND_LOAD_BALANCER,
}

// KindOf is a frontend kind as the maps hold it.
func KindOf(k model.FrontendKind) uint8 { return uint8(kinds[k]) }

// KindFromMap is KindOf's inverse; unknown values read as ClusterIP.
func KindFromMap(k uint8) model.FrontendKind {
	for mk, v := range kinds {
		if uint8(v) == k {
			return mk
		}
	}
	return model.ClusterIP
}

// MonotonicNow is CLOCK_MONOTONIC in ns, the clock of conntrack expiries.
func MonotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}
