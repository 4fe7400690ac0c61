//go:build lab

package main

import "github.com/xvs-lb/xvs/lab/harness"

// A developer build has the harness's subcommands.
func init() {
	for _, c := range harness.Commands() {
		addCommand(c.Name, c.Summary, c.Run)
	}
}
