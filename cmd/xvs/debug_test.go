package main

import "github.com/xvs-lb/xvs/config"

// The test binary is also the namespace tests' agent (os.Executable): it
// has the fault-injection switches, as the developer build has.
func init() { config.EnableDebugSwitches() }
