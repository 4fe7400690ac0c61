// Command apiserver-build builds the test API server rig (test/apiserver)
// into its cache, or finds it there, and prints the binary's path. `make
// apiserver` runs it so that a cold build (about ten minutes) happens
// before `go test`, whose default timeout is also ten minutes.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/xvs-lb/xvs/lab/kubeapi"
)

func main() {
	b, err := kubeapi.Locate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apiserver-build:", err)
		os.Exit(1)
	}
	_, statErr := os.Stat(b.Path)
	start := time.Now()
	path, err := kubeapi.Binary(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "apiserver-build:", err)
		os.Exit(1)
	}
	if os.Getenv(kubeapi.EnvBinary) == "" && statErr != nil {
		fmt.Fprintf(os.Stderr, "apiserver-build: built %s in %v\n", b.Key, time.Since(start).Round(time.Second))
	}
	fmt.Println(path)
}
