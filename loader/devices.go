package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/util/workqueue"
)

// DeviceSelector decides which interfaces carry the program: the ones that
// bring traffic into the node, external NICs and pod veths alike.
type DeviceSelector struct {
	// Patterns are interface names or shell globs ("eth0", "lxc*"). Empty
	// means every interface but loopback, which is what a node needs:
	// Service traffic can enter on any of them.
	Patterns []string
	// XDP names (or globs) the external interfaces that also get the XDP
	// fast path; empty means none.
	XDP []string
}

// Match reports whether the interface name is selected.
func (s DeviceSelector) Match(name string) bool {
	if name == "lo" {
		return false
	}
	if len(s.Patterns) == 0 {
		return true
	}
	for _, p := range s.Patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Validate checks that every pattern is a well-formed glob.
func (s DeviceSelector) Validate() error {
	for _, p := range append(append([]string(nil), s.Patterns...), s.XDP...) {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("device pattern %q: %w", p, err)
		}
	}
	return nil
}

// Selected lists the current interfaces that match.
func (s DeviceSelector) Selected() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if s.Match(l.Attrs().Name) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// AttachSelected attaches the program to every selected interface and
// returns what it attached, in name order; one failing device does not stop
// the others. AttachWorkers devices are attached at a time.
func (o *Objects) AttachSelected(s DeviceSelector, mode AttachMode) ([]Attachment, []error) {
	names, err := s.Selected()
	if err != nil {
		return nil, []error{err}
	}
	type result struct {
		a   Attachment
		err error
	}
	results := make([]result, len(names))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(AttachWorkers, len(names)) {
		wg.Go(func() {
			for i := range next {
				results[i].a, results[i].err = o.attachDevice(s, names[i], mode)
			}
		})
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	var atts []Attachment
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			if !errors.Is(r.err, ErrXDPUnsupported) { // tc is attached then
				continue
			}
		}
		atts = append(atts, r.a)
	}
	return atts, errs
}

// attachDevice attaches tc, and XDP where the selector asks for it. On a
// kernel that cannot run the XDP program the error is ErrXDPUnsupported
// and tc is attached.
func (o *Objects) attachDevice(s DeviceSelector, dev string, mode AttachMode) (Attachment, error) {
	a, err := o.Attach(dev, mode)
	if err != nil || !s.MatchXDP(dev) {
		return a, err
	}
	a.XDP, err = o.AttachXDP(dev)
	return a, err
}

// DeviceRescanInterval is how often WatchDevices lists the interfaces
// again, for any it missed.
const DeviceRescanInterval = 30 * time.Second

// AttachWorkers is how many devices are attached at a time. An attachment
// waits mostly in the kernel (a TCX attach waits for an RCU grace period:
// about 17 ms each, measured with 240 new veths), so a few at a time
// overlap those waits.
const AttachWorkers = 4

// WatchDevices attaches the program to every selected interface now and
// then to each selected interface that appears later (pod veths are created
// long after the agent starts), until ctx ends. It subscribes before the
// first pass, so no interface falls between the two. The netlink socket can
// fail (ENOBUFS when a burst of pod creations overflows it): the watch then
// subscribes again and lists the interfaces again, and a periodic rescan
// catches anything else missed. The goroutine that reads the socket only
// queues devices: AttachWorkers others attach them, so a burst of new
// devices does not leave the socket unread while each is attached
// (DeviceBacklog says how far behind they are). Pins of the links of
// interfaces that went away are removed. Later attachments and failures
// are reported through report, from other goroutines.
func (o *Objects) WatchDevices(ctx context.Context, s DeviceSelector, mode AttachMode,
	report func(Attachment, error)) ([]Attachment, []error, error) {
	updates, err := subscribeLinks(ctx, report)
	if err != nil {
		return nil, nil, err
	}
	_, unpinErr := o.UnpinDetached()
	atts, errs := o.AttachSelected(s, mode)
	// The programs of a previous build are replaced by now: a conntrack
	// resize it waited for can finish.
	if err := o.FinishResize(); err != nil {
		errs = append(errs, err)
	}
	if unpinErr != nil {
		errs = append(errs, fmt.Errorf("remove the pins of detached links: %w", unpinErr))
	}
	w := newDeviceWatch(s, func(dev string) (Attachment, error) { return o.attachDevice(s, dev, mode) }, report,
		func() error {
			if n, err := o.UnpinDetached(); err != nil {
				return err
			} else if n > 0 {
				slog.Info("removed the pins of links whose device is gone", "pins", n)
			}
			return nil
		},
		func(dev string) {
			for _, h := range hooks {
				_ = os.Remove(linkPin(o.cfg.PinPath, h, dev))
			}
		})
	for _, a := range atts {
		w.seen[a.Device] = true
	}
	o.watchMu.Lock()
	o.watch = w
	o.watchMu.Unlock()
	w.start(ctx, updates)
	return atts, errs, nil
}

// DeviceBacklog is how many selected devices wait to be attached, and
// since when the longest-waiting one does (zero when none waits). A device
// counts as waiting until an attachment has been tried (an attachment
// that hangs in the kernel counts), not until one succeeds:
// a device that keeps failing is counted in the failures, and tried again
// at each rescan.
func (o *Objects) DeviceBacklog() (int, time.Time) {
	o.watchMu.Lock()
	w := o.watch
	o.watchMu.Unlock()
	if w == nil {
		return 0, time.Time{}
	}
	return w.backlog()
}

// subscribeLinks opens a link subscription that lasts until ctx ends or the
// socket fails (the channel is closed then).
func subscribeLinks(ctx context.Context, report func(Attachment, error)) (<-chan netlink.LinkUpdate, error) {
	updates := make(chan netlink.LinkUpdate, 1024)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { report(Attachment{}, fmt.Errorf("link watch: %w", err)) },
	}); err != nil {
		return nil, fmt.Errorf("subscribe to link updates: %w", err)
	}
	go func() {
		<-ctx.Done()
		close(done)
	}()
	return updates, nil
}

// deviceWatch is WatchDevices' state: the reader's queue of devices to
// attach and what the workers attached.
type deviceWatch struct {
	s       DeviceSelector
	attach  func(dev string) (Attachment, error)
	report  func(Attachment, error)
	unpin   func() error     // the pins of links whose device is gone
	forget  func(dev string) // the pins of a device that went away
	queue   workqueue.TypedInterface[string]
	workers sync.WaitGroup

	mu sync.Mutex
	// seen are the devices attached; waiting the devices queued and not
	// tried yet, with the time each was first queued; gen counts each
	// device's removals, so that an attachment that raced with one does
	// not mark a later device of that name attached.
	seen    map[string]bool
	waiting map[string]time.Time
	gen     map[string]uint64
	now     func() time.Time
}

func newDeviceWatch(s DeviceSelector, attach func(string) (Attachment, error), report func(Attachment, error),
	unpin func() error, forget func(string)) *deviceWatch {
	return &deviceWatch{s: s, attach: attach, report: report, unpin: unpin, forget: forget,
		queue: workqueue.NewTyped[string](), seen: map[string]bool{}, waiting: map[string]time.Time{},
		gen: map[string]uint64{}, now: time.Now}
}

// start runs the reader and the workers until ctx ends.
func (w *deviceWatch) start(ctx context.Context, updates <-chan netlink.LinkUpdate) {
	for range AttachWorkers {
		w.workers.Go(w.work)
	}
	go func() {
		w.run(ctx, updates)
		w.queue.ShutDownWithDrain()
		w.workers.Wait()
	}()
}

func (w *deviceWatch) run(ctx context.Context, updates <-chan netlink.LinkUpdate) {
	rescan := time.NewTicker(DeviceRescanInterval)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rescan.C:
			w.rescan()
		case u, ok := <-updates:
			if ok {
				w.update(u)
				continue
			}
			// The subscription failed: take a new one, then list what
			// happened meanwhile.
			for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 5*time.Second) {
				var err error
				if updates, err = subscribeLinks(ctx, w.report); err == nil {
					break
				}
				w.report(Attachment{}, err)
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
			}
			w.rescan()
		}
	}
}

func (w *deviceWatch) update(u netlink.LinkUpdate) {
	name := u.Link.Attrs().Name
	if u.Header.Type != unix.RTM_NEWLINK {
		w.mu.Lock()
		delete(w.seen, name)
		delete(w.waiting, name)
		w.gen[name]++
		w.mu.Unlock()
		// The device is gone, and with it its TCX links; their pins
		// would outlive it.
		w.forget(name)
		return
	}
	w.enqueue(name)
}

// enqueue queues a selected device not attached yet.
func (w *deviceWatch) enqueue(name string) {
	if !w.s.Match(name) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[name] {
		return
	}
	if _, ok := w.waiting[name]; !ok {
		w.waiting[name] = w.now()
	}
	w.queue.Add(name)
}

// work attaches queued devices until the queue shuts down. The queue
// never hands one device to two workers at once.
func (w *deviceWatch) work() {
	for {
		name, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.tryAttach(name)
		w.queue.Done(name)
	}
}

func (w *deviceWatch) tryAttach(name string) {
	w.mu.Lock()
	_, queued := w.waiting[name]
	gen, skip := w.gen[name], w.seen[name] || !queued // attached since, or gone since
	w.mu.Unlock()
	if skip {
		return
	}
	a, err := w.attach(name)
	w.mu.Lock()
	// A device of this name removed meanwhile (and perhaps created
	// again, queued anew) is not this one: its wait and its turn stay.
	if w.gen[name] == gen {
		delete(w.waiting, name)
		if err == nil || errors.Is(err, ErrXDPUnsupported) { // no retry can help XDP then
			w.seen[name] = true
		}
	}
	w.mu.Unlock()
	w.report(a, err)
}

func (w *deviceWatch) backlog() (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var oldest time.Time
	for _, t := range w.waiting {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return len(w.waiting), oldest
}

// rescan queues every selected interface not attached yet, and removes
// the pins of links whose device went unseen.
func (w *deviceWatch) rescan() {
	if err := w.unpin(); err != nil {
		w.report(Attachment{}, fmt.Errorf("remove the pins of detached links: %w", err))
	}
	names, err := w.s.Selected()
	if err != nil {
		w.report(Attachment{}, err)
		return
	}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
	}
	w.mu.Lock()
	for n := range w.seen {
		if !present[n] {
			delete(w.seen, n)
		}
	}
	for n := range w.waiting {
		if !present[n] {
			delete(w.waiting, n)
		}
	}
	w.mu.Unlock()
	for _, n := range names {
		w.enqueue(n)
	}
}
