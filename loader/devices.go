package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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
// returns what it attached; one failing device does not stop the others.
func (o *Objects) AttachSelected(s DeviceSelector, mode AttachMode) ([]Attachment, []error) {
	names, err := s.Selected()
	if err != nil {
		return nil, []error{err}
	}
	var atts []Attachment
	var errs []error
	for _, n := range names {
		a, err := o.attachDevice(s, n, mode)
		if err != nil {
			errs = append(errs, err)
			if !errors.Is(err, ErrXDPUnsupported) { // tc is attached then
				continue
			}
		}
		atts = append(atts, a)
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

// WatchDevices attaches the program to every selected interface now and
// then to each selected interface that appears later (pod veths are created
// long after the agent starts), until ctx ends. It subscribes before the
// first pass, so no interface falls between the two. The netlink socket can
// fail (ENOBUFS when a burst of pod creations overflows it): the watch then
// subscribes again and lists the interfaces again, and a periodic rescan
// catches anything else missed. Pins of the links of interfaces that went
// away are removed. Later attachments and failures are reported through
// report, from another goroutine.
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
	w := &deviceWatch{o: o, s: s, mode: mode, report: report, seen: map[string]bool{}}
	for _, a := range atts {
		w.seen[a.Device] = true
	}
	go w.run(ctx, updates)
	return atts, errs, nil
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

type deviceWatch struct {
	o      *Objects
	s      DeviceSelector
	mode   AttachMode
	report func(Attachment, error)
	seen   map[string]bool
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
		delete(w.seen, name)
		// The device is gone, and with it its TCX links; their pins
		// would outlive it.
		for _, h := range hooks {
			_ = os.Remove(linkPin(w.o.cfg.PinPath, h, name))
		}
		return
	}
	w.attach(name)
}

func (w *deviceWatch) attach(name string) {
	if w.seen[name] || !w.s.Match(name) {
		return
	}
	a, err := w.o.attachDevice(w.s, name, w.mode)
	if err == nil || errors.Is(err, ErrXDPUnsupported) { // no retry can help XDP then
		w.seen[name] = true
	}
	w.report(a, err)
}

// rescan attaches every selected interface not attached yet, and removes
// the pins of links whose device went unseen.
func (w *deviceWatch) rescan() {
	if n, err := w.o.UnpinDetached(); err != nil {
		w.report(Attachment{}, fmt.Errorf("remove the pins of detached links: %w", err))
	} else if n > 0 {
		slog.Info("removed the pins of links whose device is gone", "pins", n)
	}
	names, err := w.s.Selected()
	if err != nil {
		w.report(Attachment{}, err)
		return
	}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
		w.attach(n)
	}
	for n := range w.seen {
		if !present[n] {
			delete(w.seen, n)
		}
	}
}
