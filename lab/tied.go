package lab

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// StartTied is Start for a process that must not outlive the caller: it
// gets SIGKILL when the calling process dies, however it dies (a crash, a
// SIGKILL of a test binary), so no agent is left running against deleted
// namespaces. The kernel sends the parent-death signal when the *thread*
// that forked exits, so the fork happens on a goroutine that keeps its
// thread locked until the child has exited.
func StartTied(ns *NS, logPath, bin string, args ...string) (*Process, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Process{cmd: cmd, Log: logPath, done: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the child
		if err := cmd.Start(); err != nil {
			started <- err
			out.Close()
			return
		}
		started <- nil
		p.done <- cmd.Wait()
		out.Close()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", bin, ns.Name, err)
	}
	return p, nil
}

// Pid is the process ID (of nsenter, which execs bin in place).
func (p *Process) Pid() int { return p.cmd.Process.Pid }
