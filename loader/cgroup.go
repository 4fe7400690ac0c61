package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// FallbackCgroup2Path is where xvs mounts a cgroup2 hierarchy when the host
// has none mounted (a cgroup v1 host).
const FallbackCgroup2Path = "/run/xvs/cgroupv2"

// Cgroup2Path finds the cgroup2 mount, mounting one at
// FallbackCgroup2Path when there is none.
func Cgroup2Path() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... mountpoint ... - fstype source options
		fields := strings.Fields(sc.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	if err := os.MkdirAll(FallbackCgroup2Path, 0o755); err != nil {
		return "", err
	}
	if err := unix.Mount("none", FallbackCgroup2Path, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("mount cgroup2 at %s: %w", FallbackCgroup2Path, err)
	}
	return FallbackCgroup2Path, nil
}

// AttachSockets attaches the socket-level load balancer (connect4,
// sendmsg4, recvmsg4, getpeername4) to the cgroup2 root at cgroupPath ("" =
// find it), with links pinned under the pin path; on restart the programs
// are swapped under the live links. The programs only act on sockets of
// the agent's own network namespace.
func (o *Objects) AttachSockets(cgroupPath string) error {
	if cgroupPath == "" {
		var err error
		if cgroupPath, err = Cgroup2Path(); err != nil {
			return err
		}
	}
	dir := filepath.Join(o.cfg.PinPath, "cgroup-links")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, h := range []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"connect4", o.XvsSockConnect4, ebpf.AttachCGroupInet4Connect},
		{"sendmsg4", o.XvsSockSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"recvmsg4", o.XvsSockRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"getpeername4", o.XvsSockGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"connect6", o.XvsSockConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg6", o.XvsSockSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg6", o.XvsSockRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername6", o.XvsSockGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	} {
		pin := filepath.Join(dir, h.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			err := l.Update(h.prog)
			l.Close()
			if err == nil {
				continue
			}
			errs = append(errs, fmt.Errorf("replace %s program: %w", h.name, err))
			continue
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.attach, Program: h.prog})
		if err != nil {
			errs = append(errs, fmt.Errorf("attach %s to %s: %w", h.name, cgroupPath, err))
			continue
		}
		if err := l.Pin(pin); err != nil {
			errs = append(errs, fmt.Errorf("pin %s link: %w", h.name, err))
		}
		l.Close()
	}
	return errors.Join(errs...)
}

// detachSockets removes the socket-level links xvs pinned under pinPath.
func detachSockets(pinPath string) error {
	return unpinLinks(filepath.Join(pinPath, "cgroup-links"))
}
