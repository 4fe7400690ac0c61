package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// agentArgs maps the scenario's proxy settings to `xvs agent` flags, the
// way production runs it: the file source with the objects, the node's
// name and addresses, and kube-proxy's flags.
func agentArgs(sc *Scenario, mode, dir, pinPath string) ([]string, error) {
	ips := make([]string, len(sc.nodeAddrs))
	for i, a := range sc.nodeAddrs {
		ips[i] = a.String()
	}
	args := []string{"agent",
		"--objects", dir,
		"--hostname-override", sc.Node.Name,
		"--pin-path", pinPath,
		"--node-ip", strings.Join(ips, ","),
	}
	if mode == ModeIPVS {
		args = append(args, "--proxy-mode", "ipvs")
	}
	if len(sc.Cluster.ServiceCIDRs) > 0 {
		args = append(args, "--service-cluster-ip-range", joinTrimmed(sc.Cluster.ServiceCIDRs))
	}
	// clusterCIDR defaults to cluster.podCIDRs; "" means no detector.
	cidr := joinTrimmed(sc.Cluster.PodCIDRs)
	if sc.Proxy.ClusterCIDR != nil {
		cidr = joinTrimmed(strings.Split(*sc.Proxy.ClusterCIDR, ","))
	}
	if cidr != "" {
		args = append(args, "--cluster-cidr", cidr)
	}
	switch sc.Proxy.DetectLocalMode {
	case "", "ClusterCIDR":
	default:
		// kube-proxy's --detect-local-mode has no xvs flag yet.
		return nil, fmt.Errorf("proxy.detectLocalMode %s: the agent has no way to set it (runner limitation)", sc.Proxy.DetectLocalMode)
	}
	if len(sc.Proxy.NodePortAddresses) > 0 {
		args = append(args, "--nodeport-addresses", joinTrimmed(sc.Proxy.NodePortAddresses))
	}
	if sc.Proxy.MasqueradeAll != nil {
		args = append(args, "--masquerade-all="+strconv.FormatBool(*sc.Proxy.MasqueradeAll))
	}
	if sc.Proxy.Scheduler != "" {
		args = append(args, "--ipvs-scheduler", sc.Proxy.Scheduler)
	}
	return args, nil
}

func joinTrimmed(ss []string) string {
	var out []string
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

// The sentinel tells the runner when the agent has applied a version of
// the objects, in any datapath mode and without sleeping blindly: every
// write of the directory carries a runner-owned UDP Service whose port is
// the write's generation; the runner sends datagrams to that port from its
// own pod and waits for its own backend to receive one. The backend seeing
// the datagram needs only the forward DNAT, so a datapath broken on the
// reply path (the break-it tests) still syncs. The sentinel file is written
// last: once generation N answers, the agent has read the directory after
// every other file of generation N was in place.
const (
	sentinelNamespace = "xvs-conformance"
	sentinelName      = "sync"
	sentinelFile      = "zz-xvs-conformance-sync.yaml"
	sentinelBasePort  = 20000
	sentinelTarget    = 9
)

type sentinel struct {
	vip, client, backend netip.Addr
	clientNS, backendNS  *lab.NS
	conn                 *net.UDPConn
	seen                 atomic.Int64
	done                 chan struct{}
}

// pickSentinel chooses three addresses in 198.18.0.0/15 (RFC 2544, never
// routed) that the scenario does not mention and that are outside its
// Service CIDRs, so the sentinel cannot change any probed outcome.
func pickSentinel(sc *Scenario, text []byte) (vip, client, backend netip.Addr, err error) {
	for i := 0; i < 500; i++ {
		base := netip.AddrFrom4([4]byte{198, 18 + byte(i/256), byte(i % 256), 0})
		a := [3]netip.Addr{}
		ok := true
		for j := range a {
			a[j] = netip.AddrFrom4([4]byte{base.As4()[0], base.As4()[1], base.As4()[2], byte(j + 1)})
			if bytes.Contains(text, []byte(a[j].String())) || prefixesContain(sc.serviceCIDRs, a[j]) ||
				prefixesContain(sc.podCIDRs, a[j]) {
				ok = false
			}
		}
		if ok {
			return a[0], a[1], a[2], nil
		}
	}
	return vip, client, backend, errors.New("no free sentinel addresses in 198.18.0.0/15")
}

// sentinelPodAddr picks a free address near the top of the first IPv4
// pod CIDR that the scenario does not mention.
func sentinelPodAddr(sc *Scenario, text []byte, l *lab.Lab) (netip.Addr, bool) {
	for _, p := range sc.podCIDRs {
		if !p.Addr().Is4() || p.Bits() > 24 {
			continue
		}
		v := p.Addr().As4()
		host := uint32(1)<<(32-p.Bits()) - 1
		base := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
		for i := uint32(2); i < 66; i++ {
			x := base | (host - i)
			a := netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
			if !bytes.Contains(text, []byte(a.String())) && l.Owner(a) == nil && !prefixesContain(sc.serviceCIDRs, a) {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func (w *world) startSentinel(text []byte) error {
	vip, c, b, err := pickSentinel(w.sc, text)
	if err != nil {
		return err
	}
	// The client sits inside the cluster CIDR when the scenario has an IPv4
	// one, so its datagrams are pod traffic and need no masquerade (a node
	// without an IPv4 address could not masquerade them).
	if pc, ok := sentinelPodAddr(w.sc, text, w.lab); ok {
		c = pc
	}
	s := &sentinel{vip: vip, client: c, backend: b, done: make(chan struct{})}
	if s.clientNS, err = w.lab.AddPod(w.node, "syncc", c); err != nil {
		return err
	}
	if s.backendNS, err = w.lab.AddPod(w.node, "syncb", b); err != nil {
		return err
	}
	err = s.backendNS.Do(func() error {
		var err error
		s.conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, sentinelTarget)))
		return err
	})
	if err != nil {
		return fmt.Errorf("sentinel listener: %w", err)
	}
	go func() {
		defer close(s.done)
		buf := make([]byte, 128)
		for {
			n, err := s.conn.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			f := strings.Fields(string(buf[:n]))
			if len(f) == 2 && f[0] == "xvs-sync" {
				if g, err := strconv.ParseInt(f[1], 10, 64); err == nil && g > s.seen.Load() {
					s.seen.Store(g)
				}
			}
		}
	}()
	w.sentinel = s
	return nil
}

func (s *sentinel) close() {
	if s != nil && s.conn != nil {
		s.conn.Close()
		<-s.done
	}
}

// sentinelManifest is the runner's Service and EndpointSlice for gen.
func (w *world) sentinelManifest(gen int) []byte {
	s := w.sentinel
	return fmt.Appendf(nil, `# Written by the conformance runner: tells it when the agent has applied
# this version of the directory (generation %[1]d).
apiVersion: v1
kind: Service
metadata: {name: %[2]s, namespace: %[3]s}
spec:
  type: ClusterIP
  clusterIP: %[4]s
  clusterIPs: [%[4]s]
  ports: [{name: sync, port: %[5]d, targetPort: %[6]d, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[2]s-1
  namespace: %[3]s
  labels: {kubernetes.io/service-name: %[2]s}
addressType: IPv4
endpoints:
- addresses: [%[7]s]
  nodeName: %[8]q
  conditions: {ready: true}
ports: [{name: sync, port: %[6]d, protocol: UDP}]
`, gen, sentinelName, sentinelNamespace, s.vip, sentinelBasePort+gen, sentinelTarget, s.backend, w.sc.Node.Name)
}

// nodeManifest is the Node FORMAT.md has the runner supply when objects
// hold none named node.name: its InternalIP is the first node address.
func (w *world) nodeManifest() []byte {
	return fmt.Appendf(nil, `# Supplied by the conformance runner (the scenario has no Node %[1]q).
apiVersion: v1
kind: Node
metadata: {name: %[1]q}
status:
  addresses: [{type: InternalIP, address: %[2]q}]
`, w.sc.Node.Name, w.sc.nodeAddrs[0].String())
}

// writeObjects makes the agent's directory hold exactly the current
// objects (one file per object, rewritten only when changed), then the
// sentinel of a new generation.
func (w *world) writeObjects() error {
	want := map[string][]byte{}
	for _, k := range w.objs.order {
		m, err := w.objs.manifest(k)
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", k.Kind, k.Namespace, k.Name, err)
		}
		want[k.fileName()] = m
	}
	if !w.objs.has(objKey{"Node", "", w.sc.Node.Name}) {
		want["obj-node-supplied.yaml"] = w.nodeManifest()
	}
	for name := range w.written {
		if _, ok := want[name]; !ok {
			if err := os.Remove(filepath.Join(w.dir, name)); err != nil {
				return err
			}
			delete(w.written, name)
		}
	}
	for _, name := range sortedKeys(want) {
		if bytes.Equal(w.written[name], want[name]) {
			continue
		}
		if err := writeFileAtomic(filepath.Join(w.dir, name), want[name]); err != nil {
			return err
		}
		w.written[name] = want[name]
	}
	w.gen++
	return writeFileAtomic(filepath.Join(w.dir, sentinelFile), w.sentinelManifest(w.gen))
}

// writeFileAtomic replaces path by rename, so the agent never reads half a
// file. The temporary name starts with "." so the file source skips it.
func writeFileAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// waitSynced sends sentinel datagrams until the backend has seen the
// current generation, the agent exits, or timeout passes.
func (w *world) waitSynced(ctx context.Context, timeout time.Duration) error {
	s := w.sentinel
	gen := w.gen
	dst := netip.AddrPortFrom(s.vip, uint16(sentinelBasePort+gen))
	var c *net.UDPConn
	err := s.clientNS.Do(func() error {
		var err error
		c, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.client, 0)), net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return fmt.Errorf("sentinel client: %w", err)
	}
	defer c.Close()
	msg := []byte("xvs-sync " + strconv.Itoa(gen))
	deadline := time.Now().Add(timeout)
	for s.seen.Load() < int64(gen) {
		if ended, aerr := w.agent.Exited(); ended {
			return fmt.Errorf("agent exited (%v)", aerr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent did not apply the objects within %v (sentinel %s/UDP never reached its backend)", timeout, dst)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c.Write(msg) // errors (ICMP from earlier datagrams) are expected until programmed
		time.Sleep(20 * time.Millisecond)
	}
	// The datapath writes one State in a single Sync; the sentinel may be
	// among the first services written. A few milliseconds cover the rest.
	time.Sleep(30 * time.Millisecond)
	return nil
}

// logTail returns the last n lines of a file, for failure reports.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(slices.Clip(lines), "\n")
}
