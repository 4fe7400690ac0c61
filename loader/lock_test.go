package loader

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestPrivPinPathLock: a second lock on a held pin directory waits, then
// fails naming the holder; once the holder lets go it succeeds at once.
func TestPrivPinPathLock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts bpffs and needs root")
	}
	path := fmt.Sprintf("/sys/fs/bpf/xvs-locktest-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(path) })
	first, err := LockPinPath(path, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pid := PinPathHolder(path); pid != os.Getpid() {
		t.Errorf("holder %d, want this process (%d)", pid, os.Getpid())
	}
	var told []int
	start := time.Now()
	_, err = LockPinPath(path, 1500*time.Millisecond, func(pid int) { told = append(told, pid) })
	if !errors.Is(err, ErrPinPathLocked) {
		t.Fatalf("second lock: %v, want ErrPinPathLocked", err)
	}
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Errorf("gave up after %v, before its wait", d)
	}
	if len(told) == 0 || told[0] != os.Getpid() {
		t.Errorf("waiting told %v, want this process's pid", told)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := LockPinPath(path, 0, nil)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
	if pid := PinPathHolder(path); pid != 0 {
		t.Errorf("holder %d after release", pid)
	}
}
