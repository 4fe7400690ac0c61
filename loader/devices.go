package loader

import (
	"context"
	"fmt"
	"path"

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
			continue
		}
		atts = append(atts, a)
	}
	return atts, errs
}

// attachDevice attaches tc, and XDP where the selector asks for it.
func (o *Objects) attachDevice(s DeviceSelector, dev string, mode AttachMode) (Attachment, error) {
	a, err := o.Attach(dev, mode)
	if err != nil || !s.MatchXDP(dev) {
		return a, err
	}
	a.XDP, err = o.AttachXDP(dev)
	return a, err
}

// WatchDevices attaches the program to every selected interface now and
// then to each selected interface that appears later (pod veths are created
// long after the agent starts), until ctx ends. It subscribes before the
// first pass, so no interface falls between the two. Later attachments and
// failures are reported through report, from another goroutine.
func (o *Objects) WatchDevices(ctx context.Context, s DeviceSelector, mode AttachMode,
	report func(Attachment, error)) ([]Attachment, []error, error) {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { report(Attachment{}, fmt.Errorf("link watch: %w", err)) },
	}); err != nil {
		return nil, nil, fmt.Errorf("subscribe to link updates: %w", err)
	}
	atts, errs := o.AttachSelected(s, mode)
	seen := map[string]bool{}
	for _, a := range atts {
		seen[a.Device] = true
	}
	go func() {
		<-ctx.Done()
		close(done)
	}()
	go func() {
		for u := range updates {
			name := u.Link.Attrs().Name
			if u.Header.Type != unix.RTM_NEWLINK {
				delete(seen, name)
				continue
			}
			if seen[name] || !s.Match(name) {
				continue
			}
			a, err := o.attachDevice(s, name, mode)
			if err == nil {
				seen[name] = true
			}
			report(a, err)
		}
	}()
	return atts, errs, nil
}
