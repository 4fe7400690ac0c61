package loader

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// XDP attach modes, as reported in Attachment.XDP.
const (
	XDPNative  = "native"
	XDPGeneric = "generic"
)

// ErrXDPUnsupported: the kernel cannot run the XDP fast path. Its program
// hands each verdict to tc in the packet's metadata
// (bpf_xdp_adjust_meta); a kernel that refuses that helper to XDP
// programs (Linux 6.18.44 builds were seen doing so) refuses the whole
// program. tc serves the devices alone then, as without --xdp-devices.
var ErrXDPUnsupported = errors.New("XDP fast path unsupported by this kernel")

// XDPSupported reports whether the kernel can load the XDP program, by the
// helper it needs (ErrXDPUnsupported when it cannot).
func XDPSupported() error {
	err := features.HaveProgramHelper(ebpf.XDP, asm.FnXdpAdjustMeta)
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("%w: its XDP programs cannot call bpf_xdp_adjust_meta, which hands the XDP verdict to tc; tc serves these devices alone", ErrXDPUnsupported)
	case err != nil:
		return fmt.Errorf("probe the XDP helpers: %w", err)
	}
	return nil
}

func (o *Objects) xdpPin(dev string) string {
	return filepath.Join(o.cfg.PinPath, "xdp-links", dev)
}

// MatchXDP reports whether dev also gets the XDP fast path: an external
// interface named by the XDP patterns.
func (s DeviceSelector) MatchXDP(dev string) bool {
	for _, p := range s.XDP {
		if ok, _ := path.Match(p, dev); ok && dev != "lo" {
			return true
		}
	}
	return false
}

// AttachXDP puts the XDP program on dev, natively where the driver can
// (veth and most NICs) and generically otherwise. A pinned link from an
// earlier agent gets the new program swapped in, as with tc.
func (o *Objects) AttachXDP(dev string) (string, error) {
	nl, err := netlink.LinkByName(dev)
	if err != nil {
		return "", fmt.Errorf("device %s: %w", dev, err)
	}
	prog, err := o.XDPProgram()
	if err != nil {
		return "", err
	}
	ifindex := nl.Attrs().Index
	pin := o.xdpPin(dev)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
			err := l.Update(prog)
			l.Close()
			if err != nil {
				return "", fmt.Errorf("replace XDP program on %s: %w", dev, err)
			}
			return xdpModeOf(nl), nil
		}
		l.Unpin()
		l.Close()
	}
	mode := XDPNative
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		mode = XDPGeneric
		var gerr error
		l, gerr = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPGenericMode})
		if gerr != nil {
			return "", fmt.Errorf("attach XDP to %s: native: %v; generic: %w", dev, err, gerr)
		}
	}
	defer l.Close()
	if err := os.MkdirAll(filepath.Dir(pin), 0o755); err != nil {
		return "", err
	}
	if err := l.Pin(pin); err != nil {
		return "", fmt.Errorf("pin XDP link of %s: %w", dev, err)
	}
	return mode, nil
}

func xdpModeOf(nl netlink.Link) string {
	if x := nl.Attrs().Xdp; x != nil && x.AttachMode == 2 { // XDP_ATTACHED_SKB
		return XDPGeneric
	}
	return XDPNative
}

// detachXDP removes every XDP link xvs pinned under pinPath.
func detachXDP(pinPath string) error {
	return unpinLinks(filepath.Join(pinPath, "xdp-links"))
}

// unpinLinks removes the links pinned in dir: a link whose last reference
// was its pin detaches its program.
func unpinLinks(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open link %s: %w", e.Name(), err))
			continue
		}
		errs = append(errs, l.Unpin(), l.Close())
	}
	return errors.Join(errs...)
}
