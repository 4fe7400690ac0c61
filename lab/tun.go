package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"
)

// AddTunClient attaches an external client to node over an L3 link: a tun
// device in each namespace ("tunN" on the node, "tun0" in the client) and a
// relay in this process that copies each packet from one to the other. To
// the node's programs the link looks like an IPIP or WireGuard tunnel: no
// link-layer header, no neighbours, a point-to-point route. The relay stops
// (and the devices go) when the lab closes.
func (l *Lab) AddTunClient(node *Node, name string, addr netip.Addr) (*NS, error) {
	addr = addr.Unmap()
	ns, err := l.newClientNS(name, addr)
	if err != nil {
		return nil, err
	}
	l.topo.Lock()
	defer l.topo.Unlock()
	nodeDev := node.nextName("tun")
	relay := &tunRelay{}
	for i, end := range []struct {
		ns  *NS
		dev string
	}{{node.NS, nodeDev}, {ns, "tun0"}} {
		f, err := openTun(end.ns, end.dev)
		if err != nil {
			relay.Close()
			return nil, err
		}
		relay.files[i] = f
		link, err := end.ns.nl.LinkByName(end.dev)
		if err != nil {
			relay.Close()
			return nil, fmt.Errorf("%s: %s: %w", end.ns.Name, end.dev, err)
		}
		if err := end.ns.nl.LinkSetUp(link); err != nil {
			relay.Close()
			return nil, fmt.Errorf("%s: up %s: %w", end.ns.Name, end.dev, err)
		}
	}
	if err := l.register(relay); err != nil {
		relay.Close()
		return nil, err
	}
	relay.start()
	link, err := node.nl.LinkByName(nodeDev)
	if err != nil {
		return nil, err
	}
	node.ifaces = append(node.ifaces, Iface{Name: nodeDev, Index: link.Attrs().Index, Role: RoleExternal, Peer: ns, PeerIface: "tun0"})
	ns.Node, ns.NodeIface = node, nodeDev
	host := netip.PrefixFrom(addr, addr.BitLen())
	if err := ns.AddAddr("tun0", host); err != nil {
		return nil, err
	}
	ns.Addrs = append(ns.Addrs, addr)
	if err := node.addRoute(host, netip.Addr{}, nodeDev, node.Primary(addr.Is6())); err != nil {
		return nil, err
	}
	def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if addr.Is6() {
		def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	if err := ns.AddRoute(def, netip.Addr{}, "tun0"); err != nil {
		return nil, err
	}
	return ns, nil
}

// openTun creates tun device dev (IFF_TUN, no packet information: each read
// and write is one IP packet) in ns. The device lives while the file is
// open.
func openTun(ns *NS, dev string) (*os.File, error) {
	if err := ensureTunNode(); err != nil {
		return nil, err
	}
	var f *os.File
	err := ns.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(dev)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s: %w", dev, err)
		}
		// Non-blocking, so that the runtime's poller serves reads and
		// Close interrupts them.
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+dev)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ns.Name, err)
	}
	return f, nil
}

// ensureTunNode makes /dev/net/tun usable where a minimal root (the VM
// rig's guest) has no node for it: the tun module loaded, the character
// device (10, 200) created.
func ensureTunNode() error {
	const path = "/dev/net/tun"
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	_ = exec.Command("modprobe", "tun").Run() // built in, or loaded: either is fine
	if err := os.MkdirAll("/dev/net", 0o755); err != nil {
		return err
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(10, 200))); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// tunRelay copies packets both ways between two tun devices.
type tunRelay struct {
	files [2]*os.File
	wg    sync.WaitGroup
	once  sync.Once
}

func (r *tunRelay) start() {
	for i := range 2 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			buf := make([]byte, 1<<16)
			for {
				n, err := r.files[i].Read(buf)
				if err != nil {
					return
				}
				// A packet the other side cannot take now is lost, as on
				// a wire.
				if _, err := r.files[1-i].Write(buf[:n]); err != nil && errors.Is(err, os.ErrClosed) {
					return
				}
			}
		}()
	}
}

func (r *tunRelay) Close() error {
	r.once.Do(func() {
		for _, f := range r.files {
			if f != nil {
				f.Close()
			}
		}
		r.wg.Wait()
	})
	return nil
}
