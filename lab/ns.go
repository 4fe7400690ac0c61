package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named namespaces are bind-mounted; netns.NewNamed and
// `ip netns` agree on it, so lab namespaces show up in `ip netns list`.
const NetnsDir = "/run/netns"

// Kind says what a namespace stands for in the topology.
type Kind int

const (
	KindNode   Kind = iota // a Kubernetes node: forwards, owns the datapath
	KindPod                // a pod behind a node-side veth
	KindClient             // a host outside the cluster, behind an external link
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindPod:
		return "pod"
	case KindClient:
		return "client"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// NS is one named network namespace created by a Lab.
type NS struct {
	Name   string         // full name, prefix included: /run/netns/<Name>
	Kind   Kind           // role in the topology
	Handle netns.NsHandle // open fd of the namespace; valid until Lab.Close
	Addrs  []netip.Addr   // addresses this namespace owns (node IPs, pod IPs, client IPs)

	// Node and NodeIface are set for pods and clients: the node they hang off
	// and the name of the node-side end of their veth.
	Node      *Node
	NodeIface string
	// For a client behind another (AddClientBehind): that router, and
	// the name of its end of the link to this one.
	router    *NS
	routerDev string

	nl  *netlink.Handle
	lab *Lab
}

// Path is the bind-mount path, usable with `nsenter --net=PATH` or
// netns.GetFromPath. Never use `ip netns exec`: it remounts /sys and hides
// /sys/fs/bpf from the command.
func (n *NS) Path() string { return filepath.Join(NetnsDir, n.Name) }

// Netlink returns a netlink handle bound to the namespace. It is owned by the
// Lab: do not close it.
func (n *NS) Netlink() *netlink.Handle { return n.nl }

func (n *NS) String() string { return n.Name }

// Do runs f on an OS thread that has joined the namespace. Sockets created
// by f stay in the namespace after Do returns. Goroutines started by f do NOT
// inherit the namespace (they run on other threads).
func (n *NS) Do(f func() error) error { return doIn(n.Handle, f) }

// doIn runs f on a fresh goroutine locked to its thread so the caller's
// thread never changes namespace. If the thread cannot be moved back, the
// goroutine exits still locked and the runtime destroys the thread, so a
// stray namespace can never leak into unrelated goroutines.
func doIn(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// newNamed creates /run/netns/name. netns.NewNamed unshares the calling
// thread, so it runs on a throw-away locked thread that is never unlocked.
func newNamed(name string) (netns.NsHandle, error) {
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies inside the new netns
		h, err := netns.NewNamed(name)
		c <- res{h, err}
	}()
	r := <-c
	if r.err != nil {
		return netns.None(), fmt.Errorf("create netns %s: %w", name, r.err)
	}
	return r.h, nil
}

// deleteNamed removes the bind mount; a namespace already gone counts as
// deleted so Close and Cleanup can run in any order.
func deleteNamed(name string) error {
	err := netns.DeleteNamed(name)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Unmount fails with EINVAL when the file exists but is no longer a
	// mount point (half-created namespace): remove the file anyway.
	if errors.Is(err, unix.EINVAL) {
		if rerr := os.Remove(filepath.Join(NetnsDir, name)); rerr == nil || os.IsNotExist(rerr) {
			return nil
		}
	}
	return fmt.Errorf("delete netns %s: %w", name, err)
}

// Cleanup deletes every named namespace whose name starts with prefix, for
// recovery after a crashed run. The prefix must be specific to the caller:
// anything else carrying it is deleted too.
func Cleanup(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	entries, err := os.ReadDir(NetnsDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("cleanup %q: %w", prefix, err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			errs = append(errs, deleteNamed(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// List returns the names of the namespaces in /run/netns starting with prefix.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func checkPrefix(prefix string) error {
	// An empty prefix would make Cleanup delete every namespace on the host.
	if len(prefix) < 3 || strings.ContainsAny(prefix, "/\x00") {
		return fmt.Errorf("lab: invalid namespace prefix %q (need >= 3 chars, no '/')", prefix)
	}
	return nil
}

var prefixSeq atomic.Uint64

// UniquePrefix returns "xvs-<tag><pid>-<n>-": unique per process and call, so
// parallel tests and test binaries never share namespaces, and
// Cleanup("xvs-"+tag) still finds leftovers of crashed runs.
func UniquePrefix(tag string) string {
	return fmt.Sprintf("xvs-%s%d-%d-", tag, os.Getpid(), prefixSeq.Add(1))
}

// Sysctl writes key=value inside the namespace. Keys use the /proc/sys path
// form ("net/ipv4/conf/lxc1/rp_filter") because interface names may contain
// dots. Net sysctls resolve against the writing thread's namespace.
func (n *NS) Sysctl(kv ...string) error {
	if len(kv)%2 != 0 {
		return fmt.Errorf("lab: Sysctl wants key/value pairs")
	}
	return n.Do(func() error { return writeSysctls(kv) })
}

func writeSysctls(kv []string) error {
	for i := 0; i < len(kv); i += 2 {
		p := filepath.Join("/proc/sys", kv[i])
		if err := os.WriteFile(p, []byte(kv[i+1]), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", kv[i], kv[i+1], err)
		}
	}
	return nil
}

// hasIPv6 reports whether the kernel has IPv6 enabled; the lab then skips
// IPv6 sysctls and gateway addresses instead of failing on v4-only hosts.
var hasIPv6 = func() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}()
