package harness

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/maps"
)

// Multi is the north-south lab: two nodes joined by a fabric link, each
// running its own agent for its own node name from the same manifests
// (Services, EndpointSlices and both Node objects), a pod on each node,
// and two external clients on node A's external interfaces.
type Multi struct {
	Lab      *lab.Lab
	A, B     *lab.Node
	PodA     *lab.NS // 10.244.0.11, on node A
	PodB     *lab.NS // 10.244.1.11, on node B
	Client   *lab.NS // 192.0.2.10, inside the LB source ranges
	Outsider *lab.NS // 198.51.100.10, outside them
	Dir      string
	Agents   map[string]*lab.Process
	Pins     map[string]string
	Bin      string
}

var (
	MultiNodeA    = netip.MustParseAddr("192.168.60.2")
	MultiNodeB    = netip.MustParseAddr("192.168.60.3")
	MultiPodA     = netip.MustParseAddr("10.244.0.11")
	MultiPodB     = netip.MustParseAddr("10.244.1.11")
	MultiClient   = netip.MustParseAddr("192.0.2.10")
	MultiOutsider = netip.MustParseAddr("198.51.100.10")
	MultiLBIP     = netip.MustParseAddr("203.0.113.10")
	MultiExtIP    = netip.MustParseAddr("203.0.113.20")
)

// MultiManifests: both Nodes, and Services covering the north-south
// cases. Ports: NodePort 30080 (eTP=Cluster, endpoint on B only), 30081
// (eTP=Local, endpoints on A and B), 30082 (no endpoints), an ExternalIP
// and an LB IP with source ranges; all TCP and UDP.
const MultiManifests = `apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: zone-a}
status:
  addresses: [{type: InternalIP, address: 192.168.60.2}]
---
apiVersion: v1
kind: Node
metadata:
  name: node-b
  labels: {topology.kubernetes.io/zone: zone-b}
status:
  addresses: [{type: InternalIP, address: 192.168.60.3}]
---
apiVersion: v1
kind: Service
metadata: {name: remote-only, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.30
  clusterIPs: [172.30.0.30]
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
  - {name: udp, port: 80, targetPort: 8080, nodePort: 30080, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-only-1, namespace: lab, labels: {kubernetes.io/service-name: remote-only}}
addressType: IPv4
endpoints:
- {addresses: [10.244.1.11], nodeName: node-b}
ports:
- {name: tcp, port: 8080, protocol: TCP}
- {name: udp, port: 8080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: lab}
spec:
  type: LoadBalancer
  clusterIP: 172.30.0.31
  clusterIPs: [172.30.0.31]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32001
  externalIPs: [203.0.113.20]
  loadBalancerSourceRanges: [" 192.0.2.0/24"]
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30081, protocol: TCP}
  - {name: udp, port: 80, targetPort: 8080, nodePort: 30081, protocol: UDP}
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.10}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: lab, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.1.11], nodeName: node-b}
ports:
- {name: tcp, port: 8080, protocol: TCP}
- {name: udp, port: 8080, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: lab}
spec:
  type: NodePort
  clusterIP: 172.30.0.32
  clusterIPs: [172.30.0.32]
  ports:
  - {name: tcp, port: 80, targetPort: 8080, nodePort: 30082, protocol: TCP}
  - {name: udp, port: 80, targetPort: 8080, nodePort: 30082, protocol: UDP}
` + MultiPolicyManifests

// MultiPolicyManifests: traffic policies and endpoint conditions, all
// ClusterIP with one endpoint on each node: iTP=Local (.33), zone hints
// (.34), node hints (.35), hints missing on one endpoint (.36), serving
// terminating endpoints only (.37), not-serving terminating only (.38),
// iTP=Local with the only endpoint remote (.39).
const MultiPolicyManifests = `---
apiVersion: v1
kind: Service
metadata: {name: itp-local, namespace: lab}
spec:
  clusterIP: 172.30.0.33
  clusterIPs: [172.30.0.33]
  internalTrafficPolicy: Local
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-local-1, namespace: lab, labels: {kubernetes.io/service-name: itp-local}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a}
- {addresses: [10.244.1.11], nodeName: node-b}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: zone, namespace: lab}
spec:
  clusterIP: 172.30.0.34
  clusterIPs: [172.30.0.34]
  trafficDistribution: PreferSameZone
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zone-1, namespace: lab, labels: {kubernetes.io/service-name: zone}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.1.11], nodeName: node-b, zone: zone-b, hints: {forZones: [{name: zone-b}]}}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: same-node, namespace: lab}
spec:
  clusterIP: 172.30.0.35
  clusterIPs: [172.30.0.35]
  trafficDistribution: PreferSameNode
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: same-node-1, namespace: lab, labels: {kubernetes.io/service-name: same-node}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, hints: {forNodes: [{name: node-a}], forZones: [{name: zone-b}]}}
- {addresses: [10.244.1.11], nodeName: node-b, hints: {forNodes: [{name: node-b}], forZones: [{name: zone-a}]}}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: half-hinted, namespace: lab}
spec:
  clusterIP: 172.30.0.36
  clusterIPs: [172.30.0.36]
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: half-hinted-1, namespace: lab, labels: {kubernetes.io/service-name: half-hinted}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.1.11], nodeName: node-b}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: terminating, namespace: lab}
spec:
  clusterIP: 172.30.0.37
  clusterIPs: [172.30.0.37]
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: terminating-1, namespace: lab, labels: {kubernetes.io/service-name: terminating}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: false, terminating: true}}
- {addresses: [10.244.1.11], nodeName: node-b, conditions: {ready: false, serving: true, terminating: true}}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: not-serving, namespace: lab}
spec:
  clusterIP: 172.30.0.38
  clusterIPs: [172.30.0.38]
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: not-serving-1, namespace: lab, labels: {kubernetes.io/service-name: not-serving}}
addressType: IPv4
endpoints:
- {addresses: [10.244.1.11], nodeName: node-b, conditions: {ready: false, serving: false, terminating: true}}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: itp-remote, namespace: lab}
spec:
  clusterIP: 172.30.0.39
  clusterIPs: [172.30.0.39]
  internalTrafficPolicy: Local
  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-remote-1, namespace: lab, labels: {kubernetes.io/service-name: itp-remote}}
addressType: IPv4
endpoints:
- {addresses: [10.244.1.11], nodeName: node-b}
ports: [{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]
`

// NewMulti builds the namespaces, links and echo servers; agents are
// started by startAgents.
func NewMulti(tag, bin string) (_ *Multi, err error) {
	prefix := lab.UniquePrefix(tag)
	l, err := lab.New(prefix)
	if err != nil {
		return nil, err
	}
	w := &Multi{Lab: l, Bin: bin, Agents: map[string]*lab.Process{}, Pins: map[string]string{}}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.Dir, err = os.MkdirTemp("", prefix); err != nil {
		return nil, err
	}
	if w.A, err = l.AddNode("a", MultiNodeA); err != nil {
		return nil, err
	}
	if w.B, err = l.AddNode("b", MultiNodeB); err != nil {
		return nil, err
	}
	fab, err := l.Link(w.A, w.B)
	if err != nil {
		return nil, err
	}
	// Pod CIDRs per node across the fabric; B answers external clients
	// (when a flow is not masqueraded) through A.
	if err := fab.Route(w.A, netip.MustParsePrefix("10.244.1.0/24")); err != nil {
		return nil, err
	}
	if err := fab.Route(w.B, netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/24")); err != nil {
		return nil, err
	}
	if w.PodA, err = l.AddPod(w.A, "poda", MultiPodA); err != nil {
		return nil, err
	}
	if w.PodB, err = l.AddPod(w.B, "podb", MultiPodB); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		ns *lab.NS
		ip netip.Addr
	}{{w.PodA, MultiPodA}, {w.PodB, MultiPodB}} {
		if _, err := lab.StartBulk(p.ns, netip.AddrPortFrom(p.ip, 8080)); err != nil {
			return nil, err
		}
	}
	if w.Client, err = l.AddClient(w.A, "client", MultiClient); err != nil {
		return nil, err
	}
	if w.Outsider, err = l.AddClient(w.A, "outsider", MultiOutsider); err != nil {
		return nil, err
	}
	// The clients' default routes point at node A, so the LB IP and the
	// ExternalIP reach it as a cloud LB or the network would deliver them.
	return w, os.WriteFile(filepath.Join(w.Dir, "lab.yaml"), []byte(MultiManifests), 0o644)
}

// startAgents runs one agent per node, node A with the XDP fast path on its
// external interfaces, and waits until both have programmed the Services.
func (w *Multi) StartAgents(extra ...string) error {
	for _, n := range []struct {
		node *lab.Node
		name string
		args []string
	}{
		{w.A, "node-a", []string{"--xdp-devices", "ext*"}},
		{w.B, "node-b", nil},
	} {
		pin := filepath.Join("/sys/fs/bpf", strings.TrimSuffix(w.Lab.Prefix, "-")+"-"+n.name)
		w.Pins[n.name] = pin
		args := append([]string{"agent", "--objects", w.Dir, "--hostname-override", n.name, "--pin-path", pin,
			"--cluster-cidr", "10.244.0.0/16", "--service-cluster-ip-range", "172.30.0.0/16"}, n.args...)
		args = append(args, extra...)
		p, err := lab.Start(n.node.NS, filepath.Join(os.TempDir(), filepath.Base(pin)+"-agent.log"), w.Bin, args...)
		if err != nil {
			return err
		}
		w.Agents[n.name] = p
	}
	// Loading and verifying the programs takes about 1.5 s here, and ten
	// times that in the emulated VM rig, two agents at once.
	deadline := time.Now().Add(60 * time.Second)
	for name, pin := range w.Pins {
		for {
			n, err := CountServices(pin)
			if err == nil && n >= 14 {
				break
			}
			if ended, aerr := w.Agents[name].Exited(); ended {
				log, _ := os.ReadFile(w.Agents[name].Log)
				return fmt.Errorf("agent %s exited (%v):\n%s", name, aerr, log)
			}
			if time.Now().After(deadline) {
				log, _ := os.ReadFile(w.Agents[name].Log)
				return fmt.Errorf("agent %s: services not programmed (%d, %v):\n%s", name, n, err, log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// CountServices counts the frontends programmed under pin.
func CountServices(pin string) (int, error) {
	m, err := maps.OpenPinned(pin)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	snap, err := m.Read(false)
	if err != nil {
		return 0, err
	}
	return len(snap.Services), nil
}

// Close stops the agents, removes both datapaths and every namespace.
func (w *Multi) Close() error {
	for _, p := range w.Agents {
		p.Stop(5 * time.Second)
	}
	for name, pin := range w.Pins {
		node := w.A
		if name == "node-b" {
			node = w.B
		}
		lab.Run(node.NS, w.Bin, "cleanup", "--pin-path", pin)
		os.RemoveAll(pin)
		if p := w.Agents[name]; p != nil {
			os.Remove(p.Log)
		}
	}
	err := w.Lab.Close()
	if w.Dir != "" {
		os.RemoveAll(w.Dir)
	}
	return err
}

// RunLab is `xvs lab`: the multi-node lab for hands-on work. It builds the
// namespaces, starts both agents and waits for Ctrl-C, then removes it all.
func RunLab(args []string) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the lab needs root (network namespaces, BPF)")
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	w, err := NewMulti("lab", bin)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.StartAgents(); err != nil {
		return err
	}
	fmt.Printf(`xvs lab is up: two nodes, each with its own agent.

  node A %s (XDP on ext*), pod 10.244.0.11:8080 (echo)
  node B %s, pod 10.244.1.11:8080 (echo)
  client 192.0.2.10 and outsider 198.51.100.10, behind node A
  manifests: %s (edit them: the agents follow)

Try:
  nsenter --net=%s %s list --pin-path %s
  nsenter --net=%s nc %s 30080 </dev/null
Press Ctrl-C to tear it all down.
`, MultiNodeA, MultiNodeB, w.Dir, w.A.NS.Path(), bin, w.Pins["node-a"], w.Client.Path(), MultiNodeA)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}
