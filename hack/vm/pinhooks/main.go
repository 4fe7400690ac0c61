// Command pinhooks keeps the kernel's cgroup socket-address hooks switched
// on for the whole boot of the test VM (hack/vm). It attaches a program that
// allows everything, for each hook xvs's socket-level balancer uses, to an
// empty cgroup of its own, and pins the links, so they outlive it.
//
// Each hook is behind a static key that the kernel switches, by patching
// its own code (text_poke_bp), when the first program of that kind is
// attached anywhere and when the last one goes. The tests and the corpus
// start and stop agents all the time, and under multi-threaded TCG a code
// patch racing another vCPU has hung or crashed the guest (docs/vm.md).
// With the keys held, no agent's attach or detach patches code. The VM's
// init holds the netfilter and tc keys the same way.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

const (
	cgroupDir = "/sys/fs/cgroup/xvs-vm-pin"
	pinDir    = "/sys/fs/bpf/xvs-vm-pin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pinhooks:", err)
		os.Exit(1)
	}
}

func run() error {
	if err := os.MkdirAll(cgroupDir, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(pinDir, 0o755); err != nil {
		return err
	}
	for name, attach := range map[string]ebpf.AttachType{
		"connect4": ebpf.AttachCGroupInet4Connect, "connect6": ebpf.AttachCGroupInet6Connect,
		"sendmsg4": ebpf.AttachCGroupUDP4Sendmsg, "sendmsg6": ebpf.AttachCGroupUDP6Sendmsg,
		"recvmsg4": ebpf.AttachCGroupUDP4Recvmsg, "recvmsg6": ebpf.AttachCGroupUDP6Recvmsg,
		"getpeername4": ebpf.AttachCgroupInet4GetPeername, "getpeername6": ebpf.AttachCgroupInet6GetPeername,
	} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "vm_pin_hook", Type: ebpf.CGroupSockAddr, AttachType: attach, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		})
		if err != nil {
			return fmt.Errorf("%s: load: %w", name, err)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupDir, Attach: attach, Program: prog})
		if err != nil {
			return fmt.Errorf("%s: attach: %w", name, err)
		}
		if err := l.Pin(filepath.Join(pinDir, name)); err != nil {
			return fmt.Errorf("%s: pin: %w", name, err)
		}
	}
	return nil
}
