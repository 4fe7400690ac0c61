package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AttachMode says how the tc program is attached to a device.
type AttachMode string

const (
	// AttachAuto uses TCX where the kernel has it (6.6+) and a clsact
	// qdisc with a direct-action filter where it does not.
	AttachAuto AttachMode = "auto"
	// AttachTCX insists on TCX links.
	AttachTCX AttachMode = "tcx"
	// AttachLegacy uses netlink clsact filters even where TCX exists.
	AttachLegacy AttachMode = "legacy"
)

// legacyFilterName marks our clsact filters (xvs_tc_ingress and
// xvs_tc_egress), so that cleanup removes only what xvs attached.
const legacyFilterName = "xvs_tc_"

// hook is one of the two tc hooks xvs attaches to: ingress (the
// datapath) and egress (reverse NAT for hostNetwork endpoints).
type hook struct {
	name   string // pin directory under PinPath, and legacy filter name
	attach ebpf.AttachType
	parent uint32
}

var hooks = []hook{
	{"links", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS},
	{"links-egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS},
}

// hookProgram is the program for hook h on a device with (Ethernet) or
// without (l3: tun, IPIP, WireGuard) a link-layer header.
func (o *Objects) hookProgram(h hook, l3 bool) (*ebpf.Program, error) {
	if l3 {
		if err := o.loadLazy("the programs for L3 devices", l3Programs); err != nil {
			return nil, err
		}
	}
	switch {
	case h.attach == ebpf.AttachTCXEgress && l3:
		return o.XvsTcEgressL3, nil
	case h.attach == ebpf.AttachTCXEgress:
		return o.XvsTcEgress, nil
	case l3:
		return o.XvsTcIngressL3, nil
	}
	return o.XvsTcIngress, nil
}

// isL3 tells a device without a link-layer header: anything that is not
// Ethernet (veth, bridge, macvlan, vxlan, physical NICs all are).
func isL3(nl netlink.Link) bool {
	return nl.Attrs().EncapType != "ether"
}

func (h hook) filterName() string {
	if h.attach == ebpf.AttachTCXEgress {
		return legacyFilterName + "egress"
	}
	return legacyFilterName + "ingress"
}

// legacyPriority and legacyHandle fix our filter's place, so that attaching
// again replaces the program atomically instead of adding a second filter.
const (
	legacyPriority = 1
	legacyHandle   = 0x1
)

// Attachment describes how a device is attached.
type Attachment struct {
	Device string
	Mode   AttachMode // AttachTCX or AttachLegacy
	// XDP is XDPNative or XDPGeneric when the device also carries the
	// XDP program, else empty.
	XDP string
}

func linkPin(pinPath string, h hook, dev string) string {
	return filepath.Join(pinPath, h.name, dev)
}

// Attach puts the tc ingress and egress programs on dev. When the device
// already carries an xvs program (a pinned TCX link, or our clsact
// filter), the program is swapped under the live attachment: no packet
// sees a device without a program, and conntrack stays as it is.
func (o *Objects) Attach(dev string, mode AttachMode) (Attachment, error) {
	nl, err := netlink.LinkByName(dev)
	if err != nil {
		return Attachment{}, fmt.Errorf("device %s: %w", dev, err)
	}
	ifindex := nl.Attrs().Index
	if mode != AttachLegacy {
		err := o.attachTCX(dev, ifindex, isL3(nl))
		if err == nil {
			return Attachment{Device: dev, Mode: AttachTCX}, nil
		}
		if mode == AttachTCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return Attachment{}, err
		}
	}
	if err := o.attachLegacy(nl); err != nil {
		return Attachment{}, err
	}
	return Attachment{Device: dev, Mode: AttachLegacy}, nil
}

func (o *Objects) attachTCX(dev string, ifindex int, l3 bool) error {
	for _, h := range hooks {
		if err := o.attachTCXHook(h, dev, ifindex, l3); err != nil {
			return err
		}
	}
	return nil
}

func (o *Objects) attachTCXHook(h hook, dev string, ifindex int, l3 bool) error {
	prog, err := o.hookProgram(h, l3)
	if err != nil {
		return err
	}
	pin := linkPin(o.cfg.PinPath, h, dev)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex {
			err := l.Update(prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("replace program on %s: %w", dev, err)
			}
			return nil
		}
		// A pin left by a device that went away (or was recreated under
		// the same name): drop it and attach afresh.
		l.Unpin()
		l.Close()
	}
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   prog,
		Attach:    h.attach,
	})
	if err != nil {
		return fmt.Errorf("attach tcx to %s: %w", dev, err)
	}
	defer l.Close()
	if err := os.MkdirAll(filepath.Dir(pin), 0o755); err != nil {
		return err
	}
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link of %s: %w", dev, err)
	}
	return nil
}

func (o *Objects) attachLegacy(nl netlink.Link) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: nl.Attrs().Index,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("clsact on %s: %w", nl.Attrs().Name, err)
	}
	for _, h := range hooks {
		prog, err := o.hookProgram(h, isL3(nl))
		if err != nil {
			return err
		}
		filter := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: nl.Attrs().Index,
				Parent:    h.parent,
				Handle:    legacyHandle,
				Priority:  legacyPriority,
				Protocol:  unix.ETH_P_ALL,
			},
			Fd:           prog.FD(),
			Name:         h.filterName(),
			DirectAction: true,
		}
		if err := netlink.FilterReplace(filter); err != nil {
			return fmt.Errorf("tc filter on %s: %w", nl.Attrs().Name, err)
		}
	}
	return nil
}

// UnpinDetached removes the pins of TCX links whose device is gone: a pin
// holds its link, and the link the program, so the pins of pod veths
// deleted while no watcher saw it (the agent was down, its netlink socket
// overflowed) would pile up, each keeping an old program version alive.
// A link still attached stays, whatever its device is called now (a
// renamed device keeps its program). It returns how many it removed.
func (o *Objects) UnpinDetached() (int, error) {
	n := 0
	var errs []error
	for _, h := range hooks {
		dir := filepath.Join(o.cfg.PinPath, h.name)
		ents, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range ents {
			pin := filepath.Join(dir, e.Name())
			if attached(pin) {
				continue
			}
			if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

// attached reports whether the TCX link pinned at pin is on a device that
// exists; a pin that is no TCX link, or cannot be read, counts as attached
// (it is left alone).
func attached(pin string) bool {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return true
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil || info.TCX() == nil {
		return true
	}
	idx := info.TCX().Ifindex
	if idx == 0 {
		return false // detached when its device went
	}
	_, err = netlink.LinkByIndex(int(idx))
	var notFound netlink.LinkNotFoundError
	return !errors.As(err, &notFound)
}

// Detach removes xvs's program from dev, whichever way it was attached.
func Detach(pinPath, dev string) error {
	var errs []error
	for _, h := range hooks {
		if l, err := link.LoadPinnedLink(linkPin(pinPath, h, dev), nil); err == nil {
			errs = append(errs, l.Unpin(), l.Close())
		}
	}
	if nl, err := netlink.LinkByName(dev); err == nil {
		errs = append(errs, detachLegacy(nl))
	}
	return errors.Join(errs...)
}

func detachLegacy(nl netlink.Link) error {
	for _, h := range hooks {
		filters, err := netlink.FilterList(nl, h.parent)
		if err != nil {
			return nil // no clsact qdisc: nothing of ours
		}
		for _, f := range filters {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || !strings.HasPrefix(bf.Name, legacyFilterName) {
				continue
			}
			if err := netlink.FilterDel(bf); err != nil {
				return fmt.Errorf("remove tc filter from %s: %w", nl.Attrs().Name, err)
			}
		}
	}
	return nil
}

// Attached lists the devices that carry an xvs program: pinned TCX links
// and clsact filters of ours.
func Attached(pinPath string) ([]Attachment, error) {
	var out []Attachment
	entries, _ := os.ReadDir(filepath.Join(pinPath, "links"))
	for _, e := range entries {
		out = append(out, Attachment{Device: e.Name(), Mode: AttachTCX})
	}
	links, err := netlink.LinkList()
	if err != nil {
		return out, fmt.Errorf("list links: %w", err)
	}
	for _, nl := range links {
		filters, err := netlink.FilterList(nl, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			continue
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, legacyFilterName) {
				out = append(out, Attachment{Device: nl.Attrs().Name, Mode: AttachLegacy})
			}
		}
	}
	return out, nil
}

// Cleanup detaches xvs from every device and removes all its pins and its
// netfilter-mode table: the programs stop, and the maps are freed once
// nothing holds them.
func Cleanup(pinPath string) error {
	var errs []error
	atts, err := Attached(pinPath)
	errs = append(errs, err, detachXDP(pinPath), detachSockets(pinPath), RemoveNetfilter())
	for _, a := range atts {
		errs = append(errs, Detach(pinPath, a.Device))
	}
	if err := os.RemoveAll(pinPath); err != nil && !os.IsNotExist(err) {
		errs = append(errs, fmt.Errorf("remove %s: %w", pinPath, err))
	}
	return errors.Join(errs...)
}
