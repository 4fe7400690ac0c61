package harness

import "github.com/xvs-lb/xvs/conformance"

// Command is a subcommand of a developer build of xvs (make build, or go
// build -tags lab ./cmd/xvs): the demo, the lab and the conformance
// runner. The DaemonSet's binary has none of them, and links neither this
// package nor lab nor conformance.
type Command struct {
	Name, Summary string
	Run           func(args []string) error
}

// Commands are the harness's subcommands.
func Commands() []Command {
	return []Command{
		{"demo", "build a node in network namespaces and send traffic to a VIP", RunDemo},
		{"lab", "start the two-node lab in network namespaces (until Ctrl-C)", RunLab},
		{"conformance", "run a directory of conformance scenarios (conformance run DIR --mode ebpf|ipvs)", conformance.RunCommand},
	}
}
