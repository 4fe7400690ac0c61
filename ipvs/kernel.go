package ipvs

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/xvs-lb/xvs/model"
)

// kService is a virtual server as the kernel reports it.
type kService struct {
	Key       vsKey
	Scheduler string
	Flags     uint32
	Timeout   uint32
	Stats     mobyipvs.SvcStats
}

// kReal is a real server as the kernel reports it.
type kReal struct {
	Key      rsKey
	Weight   int
	Active   int
	Inactive int
	Stats    mobyipvs.SvcStats
}

// kernel is what the Datapath needs from kernel IPVS and the dummy
// interface; the unit tests replace it with a fake.
type kernel interface {
	Services() ([]kService, error)
	Reals(k vsKey) ([]kReal, error)
	AddService(s kService) error
	UpdateService(s kService) error
	DelService(k vsKey) error
	AddReal(k vsKey, r kReal) error
	UpdateReal(k vsKey, r kReal) error
	DelReal(k vsKey, r rsKey) error

	// EnsureDevice creates the dummy interface for the VIPs if missing,
	// and says whether it did.
	EnsureDevice() (created bool, err error)
	// DeviceAddrs lists the addresses on the dummy interface (none when
	// it does not exist).
	DeviceAddrs() ([]netip.Addr, error)
	AddDeviceAddr(a netip.Addr) error
	DelDeviceAddr(a netip.Addr) error
	// DeleteDevice removes the dummy interface.
	DeleteDevice() error
	// OtherLocalAddrs lists the addresses on every other interface.
	OtherLocalAddrs() (map[netip.Addr]bool, error)
}

// Available reports whether kernel IPVS can be used: the IPVS generic
// netlink family exists, after loading ip_vs if needed. It must succeed
// before the first moby/ipvs call: moby/ipvs resolves the family once per
// process (sync.Once), so a handle opened while ip_vs is missing stays
// broken for the life of the process.
func Available() error {
	if _, err := netlink.GenlFamilyGet("IPVS"); err == nil {
		return nil
	}
	var why []string
	if out, err := exec.Command("modprobe", "ip_vs").CombinedOutput(); err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		why = append(why, "modprobe ip_vs: "+msg)
	}
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		why = append(why, "generic netlink family IPVS: "+err.Error())
		if _, serr := os.Stat("/proc/net/ip_vs"); serr != nil {
			why = append(why, "/proc/net/ip_vs is missing")
		}
		return fmt.Errorf("ip_vs kernel module not available: %s", strings.Join(why, "; "))
	}
	return nil
}

// mobyKernel is the real kernel: moby/ipvs for IPVS, netlink for the
// dummy interface. It works in the network namespace of the calling
// process.
type mobyKernel struct {
	h      *mobyipvs.Handle
	device string
}

func newMobyKernel(device string) (*mobyKernel, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS netlink socket: %w", err)
	}
	return &mobyKernel{h: h, device: device}, nil
}

func (m *mobyKernel) Close() { m.h.Close() }

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return syscall.AF_INET
	}
	return syscall.AF_INET6
}

func toMobyService(s kService) *mobyipvs.Service {
	mask := uint32(0xffffffff)
	if s.Key.Addr.Is6() {
		mask = 128
	}
	return &mobyipvs.Service{
		Address:       net.IP(s.Key.Addr.AsSlice()),
		Protocol:      uint16(s.Key.Proto),
		Port:          s.Key.Port,
		AddressFamily: family(s.Key.Addr),
		SchedName:     s.Scheduler,
		Flags:         s.Flags,
		Timeout:       s.Timeout,
		Netmask:       mask,
	}
}

func fromMobyService(s *mobyipvs.Service) (kService, bool) {
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 {
		return kService{}, false
	}
	return kService{
		Key:       vsKey{Addr: a.Unmap(), Proto: model.Protocol(s.Protocol), Port: s.Port},
		Scheduler: s.SchedName, Flags: s.Flags &^ flagHashed, Timeout: s.Timeout, Stats: s.Stats,
	}, true
}

func (m *mobyKernel) Services() ([]kService, error) {
	list, err := m.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list IPVS services: %w", err)
	}
	out := make([]kService, 0, len(list))
	for _, s := range list {
		if ks, ok := fromMobyService(s); ok {
			out = append(out, ks)
		}
	}
	return out, nil
}

func (m *mobyKernel) Reals(k vsKey) ([]kReal, error) {
	list, err := m.h.GetDestinations(toMobyService(kService{Key: k}))
	if err != nil {
		return nil, fmt.Errorf("list real servers of %s: %w", k, err)
	}
	out := make([]kReal, 0, len(list))
	for _, d := range list {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		out = append(out, kReal{
			Key:    rsKey{Addr: a.Unmap(), Port: d.Port},
			Weight: d.Weight, Active: d.ActiveConnections, Inactive: d.InactiveConnections,
			Stats: mobyipvs.SvcStats(d.Stats),
		})
	}
	return out, nil
}

func (m *mobyKernel) AddService(s kService) error {
	if err := m.h.NewService(toMobyService(s)); err != nil {
		return fmt.Errorf("add virtual server %s (%s): %w", s.Key, s.Scheduler, err)
	}
	return nil
}

func (m *mobyKernel) UpdateService(s kService) error {
	if err := m.h.UpdateService(toMobyService(s)); err != nil {
		return fmt.Errorf("update virtual server %s (%s): %w", s.Key, s.Scheduler, err)
	}
	return nil
}

func (m *mobyKernel) DelService(k vsKey) error {
	if err := m.h.DelService(toMobyService(kService{Key: k})); err != nil {
		return fmt.Errorf("delete virtual server %s: %w", k, err)
	}
	return nil
}

func toMobyDest(r kReal) *mobyipvs.Destination {
	return &mobyipvs.Destination{
		Address:         net.IP(r.Key.Addr.AsSlice()),
		Port:            r.Key.Port,
		Weight:          r.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   family(r.Key.Addr),
	}
}

func (m *mobyKernel) AddReal(k vsKey, r kReal) error {
	if err := m.h.NewDestination(toMobyService(kService{Key: k}), toMobyDest(r)); err != nil {
		return fmt.Errorf("add real server %s to %s: %w", r.Key, k, err)
	}
	return nil
}

func (m *mobyKernel) UpdateReal(k vsKey, r kReal) error {
	if err := m.h.UpdateDestination(toMobyService(kService{Key: k}), toMobyDest(r)); err != nil {
		return fmt.Errorf("set weight %d on real server %s of %s: %w", r.Weight, r.Key, k, err)
	}
	return nil
}

func (m *mobyKernel) DelReal(k vsKey, r rsKey) error {
	if err := m.h.DelDestination(toMobyService(kService{Key: k}), toMobyDest(kReal{Key: r})); err != nil {
		return fmt.Errorf("delete real server %s of %s: %w", r, k, err)
	}
	return nil
}

func (m *mobyKernel) EnsureDevice() (bool, error) {
	if _, err := netlink.LinkByName(m.device); err == nil {
		return false, nil
	}
	// Like kube-ipvs0, the interface stays down: its addresses are local
	// (the kernel adds local routes for them) but never answer ARP.
	la := netlink.NewLinkAttrs()
	la.Name = m.device
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return false, fmt.Errorf("create dummy interface %s: the dummy kernel module is not available: %w", m.device, err)
		}
		return false, fmt.Errorf("create dummy interface %s: %w", m.device, err)
	}
	return true, nil
}

func (m *mobyKernel) DeleteDevice() error {
	l, err := netlink.LinkByName(m.device)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", m.device, err)
	}
	return nil
}

func (m *mobyKernel) DeviceAddrs() ([]netip.Addr, error) {
	l, err := netlink.LinkByName(m.device)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("find %s: %w", m.device, err)
	}
	list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", m.device, err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func hostPrefix(a netip.Addr) *net.IPNet {
	bits := 32
	if a.Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, bits)}
}

func (m *mobyKernel) AddDeviceAddr(a netip.Addr) error {
	l, err := netlink.LinkByName(m.device)
	if err != nil {
		return fmt.Errorf("find %s: %w", m.device, err)
	}
	addr := &netlink.Addr{IPNet: hostPrefix(a)}
	if a.Is6() {
		// Deprecated (preferred lifetime 0, valid forever): still local,
		// but IPv6 source selection never picks a VIP, e.g. for the
		// masquerade of a connection to another VIP.
		addr.ValidLft, addr.PreferedLft = math.MaxUint32, 0 // MaxUint32: forever
	}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("add %s to %s: %w", a, m.device, err)
	}
	return nil
}

func (m *mobyKernel) DelDeviceAddr(a netip.Addr) error {
	l, err := netlink.LinkByName(m.device)
	if err != nil {
		return fmt.Errorf("find %s: %w", m.device, err)
	}
	if err := netlink.AddrDel(l, &netlink.Addr{IPNet: hostPrefix(a)}); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", a, m.device, err)
	}
	return nil
}

func (m *mobyKernel) OtherLocalAddrs() (map[netip.Addr]bool, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := map[netip.Addr]bool{}
	for _, l := range links {
		if l.Attrs().Name == m.device {
			continue
		}
		list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out, nil
}
