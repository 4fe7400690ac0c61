package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// runExplain says what the live datapath would do with a packet, and why:
// the datapath's own program, run once over copies of the pinned maps
// (maps.Explain). Nothing the datapath holds changes.
func runExplain(args []string) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	from := fs.String("from", "", "the client, ADDR:PORT (required unless --from-host)")
	fromHost := fs.Bool("from-host", false, "a socket of this node itself (a hostNetwork pod, the kubelet): the socket hooks' decision at its connect() or sendmsg()")
	to := fs.String("to", "", "the destination, ADDR:PORT[/tcp|udp|sctp] (required; TCP when no protocol is given)")
	established := fs.Bool("established", false, "TCP: a segment of an open connection (an ACK) instead of a SYN")
	dev := fs.String("dev", "", "the interface the packet arrives on (routes are looked up from it)")
	output := fs.String("o", "text", "output format: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := explainPacket(*from, *to, *established, *dev, *fromHost)
	if err != nil {
		return err
	}
	if listMode("auto", *pinPath) != string(model.ModeEBPF) {
		return fmt.Errorf("no xvs maps pinned at %s: explain reads the ebpf datapath's maps", *pinPath)
	}
	x, err := maps.Explain(*pinPath, p)
	if err != nil {
		return err
	}
	switch *output {
	case "json":
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(x)
	case "text":
		printExplanation(os.Stdout, p, x)
		return nil
	}
	return fmt.Errorf("unknown output format %q", *output)
}

func explainPacket(from, to string, established bool, dev string, fromHost bool) (maps.ExplainPacket, error) {
	p := maps.ExplainPacket{FromHost: fromHost}
	switch {
	case to == "":
		return p, fmt.Errorf("--to is required")
	case fromHost && (from != "" || established || dev != ""):
		return p, fmt.Errorf("--from-host takes none of --from, --established, --dev: a host socket is balanced at connect() or sendmsg(), from the node's own address")
	case !fromHost && from == "":
		return p, fmt.Errorf("--from (or --from-host) is required")
	}
	var err error
	if !fromHost {
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
	if fromHost && p.Proto != model.TCP && p.Proto != model.UDP {
		return p, fmt.Errorf("--from-host: the socket hooks balance TCP and UDP only")
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

func printExplanation(w io.Writer, p maps.ExplainPacket, x *maps.Explanation) {
	if x.Host {
		printHostExplanation(w, p, x)
		return
	}
	kind := "a new connection"
	switch {
	case p.Proto != model.TCP:
		kind = "a datagram"
	case p.Established:
		kind = "a segment of an open connection"
	}
	fmt.Fprintf(w, "packet    %s -> %s/%s (%s)\n", p.From, p.To, p.Proto, kind)
	if x.Frontend != "" {
		fmt.Fprintf(w, "frontend  %s, %s endpoints\n", x.Frontend, x.Scope)
	}
	fmt.Fprintf(w, "verdict   %s: %s\n", x.Verdict, x.Reason())
	switch x.Action {
	case "translate":
		fmt.Fprintf(w, "backend   %s (backend id %d)", x.Backend, x.BackendID)
		if x.LocalDelivery {
			fmt.Fprint(w, ", on this node's own address")
		}
		fmt.Fprintln(w)
		switch x.Masquerade {
		case "xvs":
			fmt.Fprintf(w, "source    masqueraded by xvs to %s (a port of the run's choosing)\n", x.Source.Addr())
		case "netfilter":
			fmt.Fprintf(w, "source    %s, masqueraded by netfilter (the node's POSTROUTING rule, by mark)\n", x.Source)
		case "remap":
			fmt.Fprintf(w, "source    %s with another port (another flow of this client port reaches that backend)\n", x.Source.Addr())
		default:
			fmt.Fprintf(w, "source    %s, kept\n", x.Source)
		}
	default:
		fmt.Fprintf(w, "outcome   %s\n", x.Action)
	}
}

// printHostExplanation prints the socket hooks' decision for a socket of
// the node.
func printHostExplanation(w io.Writer, p maps.ExplainPacket, x *maps.Explanation) {
	fmt.Fprintf(w, "socket    this node (%s) -> %s/%s (a host socket's connect() or sendmsg())\n", x.Source.Addr(), p.To, p.Proto)
	if x.Frontend != "" {
		fmt.Fprintf(w, "frontend  %s, %s endpoints\n", x.Frontend, x.Scope)
	}
	fmt.Fprintf(w, "verdict   %s: %s\n", x.Verdict, x.Reason())
	if x.Cause != "" {
		fmt.Fprintf(w, "because   %s: %s\n", x.Cause, (&maps.Explanation{Verdict: x.Cause}).Reason())
	}
	switch x.Action {
	case "translate":
		fmt.Fprintf(w, "backend   %s (backend id %d): the socket's peer; getpeername() and recvmsg() still show the frontend\n", x.Backend, x.BackendID)
	case "pass":
		fmt.Fprintln(w, "outcome   the socket is left alone: its packets take the node's path (netfilter, routes, xvs's tc programs on the way out)")
	default:
		fmt.Fprintf(w, "outcome   %s\n", x.Action)
	}
}
