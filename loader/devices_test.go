package loader

import (
	"os"
	"runtime"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestPrivUnpinDetached: the pins of a device deleted while nothing
// watched are removed (each held its link, and the link an old program);
// the pins of a device renamed since are kept, and its program stays on.
func TestPrivUnpinDetached(t *testing.T) {
	cfg := testConfig(t, "unpintest")
	objs, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()

	// A network namespace of the test's own, on this locked thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Error(err)
		}
		ns.Close()
	}()
	for _, name := range []string{"gone", "renamed"} {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-peer"}
		if err := netlink.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(v); err != nil {
			t.Fatal(err)
		}
		if _, err := objs.Attach(name, AttachTCX); err != nil {
			t.Fatal(err)
		}
	}
	pinned := func(dev string) bool {
		for _, h := range hooks {
			if _, err := os.Stat(linkPin(cfg.PinPath, h, dev)); err != nil {
				return false
			}
		}
		return true
	}
	if !pinned("gone") || !pinned("renamed") {
		t.Fatal("the attachments are not pinned")
	}

	renamed, err := netlink.LinkByName("renamed")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(renamed); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetName(renamed, "renamed-now"); err != nil {
		t.Fatal(err)
	}
	gone, err := netlink.LinkByName("gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(gone); err != nil {
		t.Fatal(err)
	}

	n, err := objs.UnpinDetached()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(hooks) || pinned("gone") {
		t.Fatalf("removed %d pins (the deleted device's still there: %v), want its %d", n, pinned("gone"), len(hooks))
	}
	if !pinned("renamed") {
		t.Fatal("the renamed device's pins were removed")
	}
	l, err := link.LoadPinnedLink(linkPin(cfg.PinPath, hooks[0], "renamed"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.TCX() == nil || int(info.TCX().Ifindex) != renamed.Attrs().Index {
		t.Fatalf("the renamed device's link: %+v, want it on ifindex %d", info.TCX(), renamed.Attrs().Index)
	}
	if n, err := objs.UnpinDetached(); n != 0 || err != nil {
		t.Fatalf("a second pass removed %d (%v), want nothing", n, err)
	}
}
