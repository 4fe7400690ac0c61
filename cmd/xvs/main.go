// Command xvs is the eXpress Virtual Server: an eBPF Kubernetes Service
// proxy that replaces kube-proxy's IPVS mode.
//
//	xvs agent     run the proxy (Kubernetes API or a directory of manifests)
//	xvs list      show what is programmed, like ipvsadm -Ln
//	xvs explain   what the datapath does with a packet, and why
//	xvs monitor   the packets the datapath drops or refuses, as they happen
//	xvs conntrack flush   end connections, as conntrack -D does
//	xvs cleanup   detach and remove every xvs program, link and map
//
// A developer build (make build: go build -tags lab) adds the harness's
// subcommands (lab/harness): demo, lab and conformance. The DaemonSet's
// binary (make build-node, the Dockerfile) has only the ones above.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/xvs-lb/xvs/version"
)

type command struct {
	name, summary string
	run           func(args []string) error
}

// extra holds the subcommands a developer build adds (harness.go).
var extra []command

func addCommand(name, summary string, run func(args []string) error) {
	extra = append(extra, command{name, summary, run})
}

func commands() []command {
	return append([]command{
		{"agent", "run the proxy", runAgent},
		{"list", "show the programmed services (ipvsadm -Ln style)", runList},
		{"explain", "say what the datapath does with a packet, and why", runExplain},
		{"monitor", "print the packets the datapath drops or refuses, with the reason", runMonitor},
		{"conntrack", "flush: end connections, as conntrack -D does (filters: -p, -s, -d, -r)", runConntrack},
		{"cleanup", "remove every xvs program, link and pinned map", runCleanup},
	}, extra...)
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: xvs <command> [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-12s %s\n", c.name, c.summary)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	for _, c := range commands() {
		if c.name == os.Args[1] {
			if err := c.run(os.Args[2:]); err != nil {
				if !errors.As(err, new(loggedError)) {
					fmt.Fprintf(os.Stderr, "xvs %s: %v\n", c.name, err)
				}
				os.Exit(1)
			}
			return
		}
	}
	if version.IsFlag(os.Args[1]) {
		fmt.Println(version.String())
		return
	}
	if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		return
	}
	fmt.Fprintf(os.Stderr, "xvs: unknown command %q\n", os.Args[1])
	usage()
	os.Exit(2)
}
