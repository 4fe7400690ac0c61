//go:build lab

package main

import (
	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/lab/harness"
)

// A developer build has the harness's subcommands, and the fault-injection
// switches its tests use (--debug-*).
func init() {
	config.EnableDebugSwitches()
	for _, c := range harness.Commands() {
		addCommand(c.Name, c.Summary, c.Run)
	}
}
