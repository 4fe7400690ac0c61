// Command kube-proxy is upstream kube-proxy, built from the
// k8s.io/kubernetes module at the version in go.mod: the peer the traffic
// benchmark (hack/bench) runs beside xvs, in nftables and iptables mode.
//
// It is cmd/kube-proxy/proxy.go of that release, unchanged, in a module of
// its own so that xvs's go.mod never depends on k8s.io/kubernetes (as
// test/apiserver does for the tests' API server). hack/bench builds it into
// a cache outside the repository, with the version stamps a release build
// carries; nothing runs it but the benchmark.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metric registration
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
