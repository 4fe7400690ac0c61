package lab

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a program started inside a namespace (an xvs agent, usually).
type Process struct {
	cmd  *exec.Cmd
	Log  string // path of the combined stdout/stderr
	done chan error
}

// Start runs bin with args in ns's network namespace only (nsenter --net),
// so /sys/fs/bpf and its pins stay visible, unlike with `ip netns exec`.
// Output goes to logPath.
func Start(ns *NS, logPath, bin string, args ...string) (*Process, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s in %s: %w", bin, ns.Name, err)
	}
	p := &Process{cmd: cmd, Log: logPath, done: make(chan error, 1)}
	go func() {
		p.done <- cmd.Wait()
		out.Close()
	}()
	return p, nil
}

// Stop ends the process it started (by PID: SIGTERM, then SIGKILL after
// the grace period) and waits for it. A process that outlives the grace
// period gets SIGQUIT first, so that a Go program (the agent) writes
// every goroutine's stack to its log: what it was stuck in.
func (p *Process) Stop(grace time.Duration) error {
	if ended, _ := p.Exited(); ended {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		var err error
		select {
		case err = <-p.done:
		case <-time.After(2 * time.Second):
			_ = p.cmd.Process.Kill()
			err = <-p.done
		}
		p.done <- err
		return fmt.Errorf("%s did not stop within %v; stopped with SIGQUIT (a Go program's goroutines are in %s)", p.cmd.Path, grace, p.Log)
	}
}

// Wait waits up to timeout for the process to end on its own and returns
// how it ended; a process still running then is left running.
func (p *Process) Wait(timeout time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running after %v", p.cmd.Path, timeout)
	}
}

// Exited reports whether the process ended on its own, with its error.
func (p *Process) Exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// Run runs bin with args to completion inside ns's network namespace and
// returns its combined output.
func Run(ns *NS, bin string, args ...string) ([]byte, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "--", bin}, args...)...)
	return cmd.CombinedOutput()
}
