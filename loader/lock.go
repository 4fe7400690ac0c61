package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// PinLock is an exclusive lock on a pin directory: one agent per set of
// pinned maps. Two agents on one node (a manual run beside the DaemonSet's,
// an overlapping canary) would each allocate service and backend IDs from
// their own view and write over each other's entries. The lock is flock(2)
// on the directory itself (bpffs holds no regular files); the kernel drops
// it when the process ends, however it ends, so there is nothing stale to
// clean up after a crash.
type PinLock struct {
	f *os.File
}

// ErrPinPathLocked is returned (wrapped, with the holder) when another
// process holds the pin directory.
var ErrPinPathLocked = errors.New("another process holds the pin directory")

// LockPinPath locks path (created if missing, on a bpffs mounted if
// needed), waiting up to wait for a holder to let go; waiting, if set, is
// called with the holder's pid (0 when it cannot be told) about every
// second while it waits.
func LockPinPath(path string, wait time.Duration, waiting func(holder int)) (*PinLock, error) {
	if err := ensurePinPath(path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pin path for its lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return &PinLock{f: f}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := PinPathHolder(path)
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, fmt.Errorf("%s: %w (%s) after %v", path, ErrPinPathLocked, describeHolder(holder), wait)
		}
		if waiting != nil {
			waiting(holder)
		}
		time.Sleep(min(time.Second, time.Until(deadline)))
	}
}

// Close releases the lock.
func (l *PinLock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// PinPathHolder is the pid of the process holding path's lock, read from
// /proc/locks (0: none, or not visible from this PID namespace).
func PinPathHolder(path string) int {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	// /proc/locks: "1: FLOCK  ADVISORY  WRITE 4242 00:1f:17 0 EOF", the
	// device in hex as major:minor, then the inode.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil {
			return pid
		}
	}
	return 0
}

func describeHolder(pid int) string {
	if pid == 0 {
		return "holder not visible from here"
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(cmd) == 0 {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d: %s", pid, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
}
