package loader

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestDeviceWatchQueues: while attachments are slow (the kernel's RCU
// waits), the goroutine reading link updates keeps reading them, so the
// netlink socket does not overflow; the backlog says how many devices wait
// and since when; every device is attached once, at most AttachWorkers at
// a time; a device deleted before its turn is not tried (no failure to
// count for it), and the backlog empties.
func TestDeviceWatchQueues(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	attached := map[string]int{}
	running, most := 0, 0
	attach := func(dev string) (Attachment, error) {
		mu.Lock()
		running++
		most = max(most, running)
		gate := release
		mu.Unlock()
		<-gate
		mu.Lock()
		running--
		attached[dev]++
		mu.Unlock()
		return Attachment{Device: dev, Mode: AttachTCX}, nil
	}
	var failures []error
	report := func(_ Attachment, err error) {
		if err != nil {
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
		}
	}
	w := newDeviceWatch(DeviceSelector{Patterns: []string{"veth*"}}, attach, report,
		func() error { return nil }, func(string) {})
	t0 := time.Unix(1_000_000, 0)
	w.now = func() time.Time { return t0 }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := make(chan netlink.LinkUpdate) // unbuffered: a send returns only once the reader took it
	w.start(ctx, updates)

	link := func(name string, typ uint16) netlink.LinkUpdate {
		u := netlink.LinkUpdate{Link: &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}}
		u.Header.Type = typ
		return u
	}
	const n = 200
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := range n {
			updates <- link(fmt.Sprintf("veth%d", i), unix.RTM_NEWLINK)
			updates <- link(fmt.Sprintf("veth%d", i), unix.RTM_NEWLINK) // a second message about it
		}
		updates <- link("eth9", unix.RTM_NEWLINK) // not selected
		updates <- link(fmt.Sprintf("veth%d", n-1), unix.RTM_DELLINK)
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the link updates were not read while the attachments waited")
	}
	busy := 0
	for start := time.Now(); busy < AttachWorkers && time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) {
		mu.Lock()
		busy = running
		mu.Unlock()
	}
	waiting, since := w.backlog()
	if waiting != n-1 || !since.Equal(t0) || busy != AttachWorkers {
		t.Fatalf("backlog %d devices since %v, %d being attached; want %d (one deleted) since %v, %d being attached",
			waiting, since, busy, n-1, t0, AttachWorkers)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if waiting, _ = w.backlog(); waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d devices still waiting", waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A device removed and created again while its attachment runs: the
	// new one is attached too, at once, not at the next rescan.
	mu.Lock()
	release = make(chan struct{})
	mu.Unlock()
	updates <- link("vethx", unix.RTM_NEWLINK)
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) {
		mu.Lock()
		busy := running
		mu.Unlock()
		if busy == 1 {
			break
		}
	}
	updates <- link("vethx", unix.RTM_DELLINK)
	updates <- link("vethx", unix.RTM_NEWLINK)
	mu.Lock()
	close(release)
	mu.Unlock()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := attached["vethx"]
		mu.Unlock()
		if waiting, _ = w.backlog(); n == 2 && waiting == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("vethx, created again while attached: attached %d times, %d devices waiting; want 2 and 0", n, waiting)
		}
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	delete(attached, "vethx")
	if len(attached) != n-1 || most > AttachWorkers || len(failures) != 0 {
		t.Fatalf("%d devices attached (want %d), at most %d at a time (want <= %d), failures %v",
			len(attached), n-1, most, AttachWorkers, failures)
	}
	for dev, c := range attached {
		if c != 1 {
			t.Fatalf("%s attached %d times", dev, c)
		}
	}
	if attached[fmt.Sprintf("veth%d", n-1)] != 0 || attached["eth9"] != 0 {
		t.Fatal("a deleted or unselected device was attached")
	}
}
