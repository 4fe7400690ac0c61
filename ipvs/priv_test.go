package ipvs

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	mobyipvs "github.com/moby/ipvs"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/model"
)

// privNS returns a fresh network namespace for a kernel test; it fails
// (never skips) without root or without kernel IPVS.
func privNS(t *testing.T) *lab.NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("kernel IPVS tests need root; run them as root in the VM (make vmtest)")
	}
	if err := Available(); err != nil {
		t.Fatalf("kernel IPVS tests need IPVS (run them in the VM: make vmtest): %v", err)
	}
	l, err := lab.New(lab.UniquePrefix("ipvs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	node, err := l.AddNode("node", netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	return node.NS
}

func in(t *testing.T, ns *lab.NS, f func() error) {
	t.Helper()
	if err := ns.Do(f); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, ns *lab.NS, name string, args ...string) string {
	t.Helper()
	out, err := lab.Run(ns, name, args...)
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// TestPrivIPVSKernel drives the real kernel: virtual servers, real servers,
// the dummy interface, the sysctls, the rules, a scheduler the kernel
// lacks, and a cleanup that leaves a foreign virtual server alone.
func TestPrivIPVSKernel(t *testing.T) {
	ns := privNS(t)
	cfg := Config{StateFile: filepath.Join(t.TempDir(), "state.json"), StrictARP: true}
	var d *Datapath
	// Someone else's virtual server on the node.
	foreign := &mobyipvs.Service{Address: net.ParseIP("192.0.2.1"), Protocol: syscall.IPPROTO_TCP, Port: 2049,
		AddressFamily: syscall.AF_INET, SchedName: "wlc", Netmask: 0xffffffff}
	in(t, ns, func() error {
		h, err := mobyipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		return h.NewService(foreign)
	})
	in(t, ns, func() (err error) {
		d, err = New(cfg)
		return err
	})
	defer d.Close()

	sp := webPort(ep(ep1, true), ep(ep2, false))
	sp.Affinity = model.Affinity{ClientIP: true, TimeoutSeconds: 300}
	sp.Scheduler = "sh"
	sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	st := state(sp, dnsPort(ep(ep1, true)))
	in(t, ns, func() error { return d.Sync(context.Background(), st) })

	out := run(t, ns, "ipvsadm", "-Ln")
	for _, want := range []string{
		"TCP 10.96.0.10:80 sh persistent 300",
		"TCP 192.0.2.1:30080 sh persistent 300",
		"TCP 203.0.113.7:80 sh persistent 300",
		"UDP 10.96.0.10:53 rr",
		"-> 10.244.0.2:8080 Masq 1",
		"-> 10.244.0.2:5353 Masq 1",
		"TCP 192.0.2.1:2049 wlc",
	} {
		if !strings.Contains(squeeze(out), want) {
			t.Errorf("ipvsadm -Ln lacks %q:\n%s", want, out)
		}
	}
	addrs := run(t, ns, "ip", "-o", "addr", "show", "dev", DefaultDevice)
	for _, want := range []string{"10.96.0.10/32", "203.0.113.7/32", "198.51.100.9/32"} {
		if !strings.Contains(addrs, want) {
			t.Errorf("%s lacks %s: %s", DefaultDevice, want, addrs)
		}
	}
	if strings.Contains(addrs, "192.0.2.1") {
		t.Errorf("node address bound to %s: %s", DefaultDevice, addrs)
	}
	for path, want := range map[string]string{
		"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
		"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/conf/all/arp_ignore": "1",
		"net/ipv4/conf/all/arp_announce": "2",
	} {
		if got := strings.TrimSpace(run(t, ns, "cat", "/proc/sys/"+path)); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	// -p: protocols as numbers, whether or not the node has /etc/protocols.
	rules := run(t, ns, "nft", "-p", "list", "table", "ip", TableName)
	for _, want := range []string{"10.96.0.10 . 6 . 80", "10.96.0.10 . 17 . 53", "masquerade", "reject", "203.0.113.7 . 6 . 80 . 192.0.2.0/24"} {
		if !strings.Contains(rules, want) {
			t.Errorf("nft table lacks %q:\n%s", want, rules)
		}
	}

	// A scheduler the kernel does not have: the probe says which module.
	in(t, ns, func() error {
		err := d.probeScheduler("nosuch")
		if err == nil || !strings.Contains(err.Error(), "ip_vs_nosuch") {
			t.Errorf("probe of an unknown scheduler: %v", err)
		}
		return nil
	})

	// The Service goes: its virtual servers go, the foreign one stays.
	in(t, ns, func() error { return d.Sync(context.Background(), state()) })
	out = run(t, ns, "ipvsadm", "-Ln")
	if strings.Contains(out, "10.96.0.10") || !strings.Contains(out, "192.0.2.1:2049") {
		t.Errorf("after removing every Service:\n%s", out)
	}

	in(t, ns, func() error { return d.Sync(context.Background(), st) })
	in(t, ns, func() error { return Cleanup(cfg) })
	out = run(t, ns, "ipvsadm", "-Ln")
	if strings.Contains(out, "10.96.0.10") || strings.Contains(out, "30080") || !strings.Contains(out, "192.0.2.1:2049") {
		t.Errorf("after cleanup:\n%s", out)
	}
	if out, err := lab.Run(ns, "ip", "link", "show", DefaultDevice); err == nil {
		t.Errorf("%s left after cleanup: %s", DefaultDevice, out)
	}
	if out, err := lab.Run(ns, "nft", "list", "table", "ip", TableName); err == nil {
		t.Errorf("nft table left after cleanup: %s", out)
	}
}

// squeeze collapses runs of blanks, as ipvsadm pads its columns.
func squeeze(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		b.WriteString(strings.Join(strings.Fields(line), " "))
		b.WriteString("\n")
	}
	return b.String()
}
