package loader

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// testConfig is the default configuration with a pin path of this test
// process's own, removed with the test; it fails the test without root.
func testConfig(t *testing.T, tag string) Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF objects and needs root")
	}
	cfg := DefaultConfig()
	cfg.PinPath = fmt.Sprintf("/sys/fs/bpf/xvs-%s-%d", tag, os.Getpid())
	t.Cleanup(func() { os.RemoveAll(cfg.PinPath) })
	return cfg
}

// TestPrivLazyPrograms: Load verifies only what every node runs; the XDP
// program and the L3 programs come on first use, once, and share the maps
// of the loaded objects.
func TestPrivLazyPrograms(t *testing.T) {
	cfg := testConfig(t, "lazytest")
	objs, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	if objs.XvsTcIngress == nil || objs.XvsTcEgress == nil {
		t.Fatal("the tc programs are not loaded")
	}
	if objs.XvsXdp != nil || objs.XvsTcIngressL3 != nil || objs.XvsTcEgressL3 != nil {
		t.Fatal("a lazy program was loaded by Load")
	}
	first, err := objs.XDPProgram()
	if errors.Is(err, ErrXDPUnsupported) {
		// The 6.12 VM (make test) checks the XDP program's part.
		if _, err := objs.hookProgram(hooks[0], true); err != nil || objs.XvsTcIngressL3 == nil {
			t.Fatalf("the L3 programs are not loaded after their first use (%v)", err)
		}
		t.Skipf("SKIP (kernel) the XDP program: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	again, err := objs.XDPProgram()
	if err != nil || again != first {
		t.Fatalf("second XDPProgram: %p %v, want the first %p", again, err, first)
	}
	if objs.XvsTcIngressL3 != nil {
		t.Fatal("the XDP program brought the L3 programs")
	}
	if _, err := objs.hookProgram(hooks[0], true); err != nil {
		t.Fatal(err)
	}
	if objs.XvsTcIngressL3 == nil || objs.XvsTcEgressL3 == nil {
		t.Fatal("the L3 programs are not loaded after their first use")
	}
	// Shared maps: the lazily loaded program uses the very conntrack
	// tables (through their slots).
	info, err := first.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	ct, err := objs.XvsCtTables.Info()
	if err != nil {
		t.Fatal(err)
	}
	ctID, _ := ct.ID()
	found := false
	for _, id := range ids {
		found = found || id == ctID
	}
	if !found {
		t.Fatalf("the XDP program's maps %v do not include the loaded conntrack slots %d", ids, ctID)
	}
}
