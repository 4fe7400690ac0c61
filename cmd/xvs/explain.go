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
	from := fs.String("from", "", "the client, ADDR:PORT (required)")
	to := fs.String("to", "", "the destination, ADDR:PORT[/tcp|udp|sctp] (required; TCP when no protocol is given)")
	established := fs.Bool("established", false, "TCP: a segment of an open connection (an ACK) instead of a SYN")
	dev := fs.String("dev", "", "the interface the packet arrives on (routes are looked up from it)")
	output := fs.String("o", "text", "output format: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := explainPacket(*from, *to, *established, *dev)
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

func explainPacket(from, to string, established bool, dev string) (maps.ExplainPacket, error) {
	var p maps.ExplainPacket
	if from == "" || to == "" {
		return p, fmt.Errorf("--from and --to are required")
	}
	var err error
	if p.From, err = netip.ParseAddrPort(from); err != nil {
		return p, fmt.Errorf("--from: %w", err)
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

func printExplanation(w io.Writer, p maps.ExplainPacket, x *maps.Explanation) {
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
