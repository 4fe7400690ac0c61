//go:build !lab

package main

import "github.com/xvs-lb/xvs/lab/harness"

// The test binary runs as xvs (TestMain) with the harness's subcommands,
// as a developer build (harness.go) has them.
func init() {
	for _, c := range harness.Commands() {
		addCommand(c.Name, c.Summary, c.Run)
	}
}
