package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// runExplain says what the live datapath would do with a packet, and why:
// in ebpf mode the datapath's own program, run once over copies of the
// pinned maps (maps.Explain); in ipvs mode the kernel's virtual servers,
// connections and xvs's rules (ipvs.Explain). Nothing the datapath holds
// changes.
func runExplain(args []string) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	from := fs.String("from", "", "the client, ADDR:PORT (required unless --from-pod or --from-host)")
	fromPod := fs.String("from-pod", "", "the client is this pod, NAMESPACE/NAME: its address of the destination's family (status.podIPs, read from the API server with --kubeconfig, or the in-cluster service account, which needs get on pods), source port --from-port")
	fromPort := fs.Uint("from-port", 40999, "with --from-pod: the client's source port")
	kubeconfig := fs.String("kubeconfig", "", "with --from-pod: the kubeconfig to read the pod with (default: the in-cluster service account)")
	fromHost := fs.Bool("from-host", false, "a socket of this node itself (a hostNetwork pod, the kubelet): in ebpf mode the socket hooks' decision at its connect() or sendmsg(); with --from, in ipvs mode, a socket bound to that address (else routing picks the source)")
	to := fs.String("to", "", "the destination, ADDR:PORT[/tcp|udp|sctp] (required; TCP when no protocol is given)")
	established := fs.Bool("established", false, "TCP: a segment of an open connection (an ACK) instead of a SYN")
	dev := fs.String("dev", "", "the interface the packet arrives on (routes are looked up from it)")
	output := fs.String("o", "text", "output format: text, json or yaml (schemaVersion "+explainSchema+")")
	mode := fs.String("proxy-mode", "auto", "datapath to explain: ebpf, ipvs, or auto (ebpf if its maps are pinned, else ipvs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *fromPod != "" {
		if *from != "" || *fromHost {
			return fmt.Errorf("--from-pod, --from and --from-host name the client three ways: give one")
		}
		if *fromPort == 0 || *fromPort > 65535 {
			return fmt.Errorf("--from-port %d: want 1-65535", *fromPort)
		}
		dst, _, _ := strings.Cut(*to, "/")
		d, err := netip.ParseAddrPort(dst)
		if err != nil {
			return fmt.Errorf("--to: %w", err)
		}
		a, err := podAddress(*kubeconfig, *fromPod, d.Addr().Unmap().Is4())
		if err != nil {
			return err
		}
		*from = netip.AddrPortFrom(a, uint16(*fromPort)).String()
	}
	p, err := explainPacket(*from, *to, *established, *dev, *fromHost)
	if err != nil {
		return err
	}
	m := listMode(*mode, *pinPath)
	var x *model.Explanation
	switch m {
	case string(model.ModeEBPF):
		x, err = maps.Explain(*pinPath, p)
	case string(model.ModeIPVS):
		x, err = ipvs.Explain(ipvs.Config{}, p)
	default:
		err = fmt.Errorf("unknown --proxy-mode %q", m)
	}
	if err != nil {
		return err
	}
	if *output == "text" {
		printExplanation(os.Stdout, m, p, x)
		return nil
	}
	return printStructured(os.Stdout, *output, explainSchema, x)
}

// explainSchema names the layout of explain's structured output.
const explainSchema = "xvs.explain/v1"

func explainPacket(from, to string, established bool, dev string, fromHost bool) (model.ExplainPacket, error) {
	p := model.ExplainPacket{FromHost: fromHost}
	switch {
	case to == "":
		return p, fmt.Errorf("--to is required")
	case fromHost && (established || dev != ""):
		return p, fmt.Errorf("--from-host takes neither --established nor --dev: a host socket is balanced at connect() or sendmsg()")
	case !fromHost && from == "":
		return p, fmt.Errorf("--from (or --from-host) is required")
	}
	var err error
	if from != "" {
		if p.From, err = netip.ParseAddrPort(from); err != nil {
			return p, fmt.Errorf("--from: %w", err)
		}
	}
	addr, proto, _ := strings.Cut(to, "/")
	if p.To, err = netip.ParseAddrPort(addr); err != nil {
		return p, fmt.Errorf("--to: %w", err)
	}
	p.Proto = model.TCP
	if proto != "" {
		if p.Proto, err = model.ParseProtocol(strings.ToUpper(proto)); err != nil {
			return p, fmt.Errorf("--to: %w", err)
		}
	}
	p.Established = established && p.Proto == model.TCP
	if dev != "" {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return p, fmt.Errorf("--dev: %w", err)
		}
		p.Ifindex = uint32(ifi.Index)
	}
	return p, nil
}

func printExplanation(w io.Writer, mode string, p model.ExplainPacket, x *model.Explanation) {
	kind := "a new connection"
	switch {
	case p.Proto != model.TCP:
		kind = "a datagram"
	case p.Established:
		kind = "a segment of an open connection"
	}
	if x.Host {
		hook := "the socket hooks balance its connect() or sendmsg()"
		if mode == string(model.ModeIPVS) {
			hook = "IPVS takes its packets at LOCAL_OUT"
		}
		fmt.Fprintf(w, "socket    this node (%s) -> %s/%s (%s: %s)\n", x.Source.Addr(), p.To, p.Proto, kind, hook)
	} else {
		fmt.Fprintf(w, "packet    %s -> %s/%s (%s)\n", p.From, p.To, p.Proto, kind)
	}
	if x.Frontend != "" {
		fmt.Fprintf(w, "frontend  %s", x.Frontend)
		if x.Scope != "" {
			fmt.Fprintf(w, ", %s endpoints", x.Scope)
		}
		if x.Scheduler != "" {
			fmt.Fprintf(w, ", scheduler %s", x.Scheduler)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "verdict   %s: %s\n", x.Verdict, x.Why)
	if x.Cause != "" {
		fmt.Fprintf(w, "because   %s: %s\n", x.Cause, maps.VerdictReason(x.Cause))
	}
	if x.Action != "translate" {
		fmt.Fprintf(w, "outcome   %s\n", x.Action)
		return
	}
	switch {
	case x.Backend.IsValid():
		fmt.Fprintf(w, "backend   %s", x.Backend)
		if x.BackendID != 0 {
			fmt.Fprintf(w, " (backend id %d)", x.BackendID)
		}
		if x.LocalDelivery {
			fmt.Fprint(w, ", on this node's own address")
		}
		if x.Host && mode != string(model.ModeIPVS) {
			fmt.Fprint(w, ": the socket's peer; getpeername() and recvmsg() still show the frontend")
		}
		fmt.Fprintln(w)
		if len(x.Candidates) > 1 {
			fmt.Fprintf(w, "          (one draw of the %s scheduler, among %s)\n", x.Scheduler, joinAddrPorts(x.Candidates))
		}
	default:
		fmt.Fprintf(w, "backend   one of %s (the kernel's %s scheduler picks)\n", joinAddrPorts(x.Candidates), x.Scheduler)
	}
	switch {
	case x.Host && mode != string(model.ModeIPVS):
	case x.Masquerade == "xvs":
		fmt.Fprintf(w, "source    masqueraded by xvs to %s (a port of the run's choosing)\n", x.Source.Addr())
	case x.Masquerade == "netfilter":
		fmt.Fprintf(w, "source    %s, masqueraded by netfilter (the node's POSTROUTING rule, by mark)\n", x.Source)
	case x.Masquerade == "remap":
		fmt.Fprintf(w, "source    %s with another port (another flow of this client port reaches that backend)\n", x.Source.Addr())
	default:
		fmt.Fprintf(w, "source    %s, kept\n", x.Source)
	}
}

func joinAddrPorts(l []netip.AddrPort) string {
	s := make([]string, len(l))
	for i, a := range l {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// podAddress reads pod NAMESPACE/NAME's address of one family from the
// API server.
func podAddress(kubeconfig, ref string, v4 bool) (netip.Addr, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return netip.Addr{}, fmt.Errorf("--from-pod %q: want NAMESPACE/NAME", ref)
	}
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		err = fmt.Errorf("%w (outside a cluster, give --kubeconfig)", err)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--from-pod: %w", err)
	}
	cfg.UserAgent = "xvs-explain"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--from-pod: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--from-pod: %w", err)
	}
	family := "IPv6"
	if v4 {
		family = "IPv4"
	}
	var have []string
	for _, ip := range pod.Status.PodIPs {
		have = append(have, ip.IP)
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Unmap().Is4() == v4 {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("--from-pod: pod %s has no %s address (status.podIPs: %v)", ref, family, have)
}
