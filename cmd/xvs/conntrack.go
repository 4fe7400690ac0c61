package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// runConntrack is `xvs conntrack flush`: conntrack -D for the datapath's
// own connection table (`xvs list -c` lists it).
func runConntrack(args []string) error {
	if len(args) == 0 || args[0] != "flush" {
		return errors.New("usage: xvs conntrack flush [-p tcp|udp|sctp] [-s CLIENT[:PORT]] [-d FRONTEND[:PORT]] [-r BACKEND[:PORT]] [--pin-path DIR]")
	}
	fs := flag.NewFlagSet("conntrack flush", flag.ContinueOnError)
	pinPath := fs.String("pin-path", loader.DefaultPinPath, "bpffs directory of the xvs maps")
	var f maps.ConnectionFilter
	fs.Func("p", "only flows of this protocol: tcp, udp or sctp", func(v string) (err error) {
		f.Protocol, err = model.ParseProtocol(strings.ToUpper(v))
		return err
	})
	for _, a := range []struct {
		name, what string
		dst        *netip.AddrPort
	}{
		{"s", "the client (conntrack's --orig-src)", &f.Source},
		{"d", "the frontend the client asked for (--orig-dst)", &f.Virtual},
		{"r", "the backend (--reply-src)", &f.Destination},
	} {
		fs.Func(a.name, "only flows from or to this address, ADDR or ADDR:PORT: "+a.what, func(v string) (err error) {
			*a.dst, err = parseFrontend(v)
			return err
		})
	}
	all := fs.Bool("all", false, "flush every flow (no filter given)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f == (maps.ConnectionFilter{}) && !*all {
		return errors.New("no filter: give -p, -s, -d or -r, or --all to end every connection through the node's Services")
	}
	if _, err := os.Stat(*pinPath); err != nil {
		return fmt.Errorf("%w (ebpf mode only; in ipvs mode use conntrack -D and ipvsadm)", err)
	}
	m, err := maps.OpenPinnedForFlush(*pinPath)
	if err != nil {
		return fmt.Errorf("%w (is the agent running with --pin-path=%s?)", err, *pinPath)
	}
	defer m.Close()
	n, err := m.ExpireConnections(f)
	if err != nil {
		return err
	}
	fmt.Printf("%d flows ended: their next packet is a new flow's (a TCP segment mid-connection is dropped as invalid); the agent's reaper removes them\n", n)
	return nil
}
