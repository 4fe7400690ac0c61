// Package version is what the xvs binary was built from, for `xvs
// version`, the agent's start-up log line and the xvs_build_info metric.
package version

import (
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time by `make build` (and `make image`):
//
//	-X github.com/xvs-lb/xvs/version.version=$(git describe --tags --always --dirty)
//	-X github.com/xvs-lb/xvs/version.gitCommit=$(git rev-parse HEAD)
//	-X github.com/xvs-lb/xvs/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)
//
// A plain `go build` leaves the defaults.
var (
	version   = "v0.0.0-dev"
	gitCommit = "unknown"
	buildDate = "unknown"
)

// Version, GitCommit and BuildDate are the link-time values.
func Version() string   { return version }
func GitCommit() string { return gitCommit }
func BuildDate() string { return buildDate }

// String is the one-line `xvs version`.
func String() string {
	return fmt.Sprintf("xvs %s (commit %s, built %s, %s %s/%s)", version, gitCommit, buildDate,
		runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// IsFlag reports whether arg asks for the version, as `xvs --version` or
// `xvs version`.
func IsFlag(arg string) bool {
	return arg == "--version" || arg == "-version" || arg == "version"
}

// BuildInfo is kube-proxy's kubernetes_build_info gauge for xvs: constant
// 1, labelled with what the binary was built from.
func BuildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "xvs_build_info",
		Help: "A metric with a constant '1' value labeled by version, git commit, build date, Go version, compiler and platform from which xvs was built (kubernetes_build_info's labels).",
	}, []string{"git_version", "git_commit", "build_date", "go_version", "compiler", "platform"})
	g.WithLabelValues(version, gitCommit, buildDate, runtime.Version(), runtime.Compiler,
		runtime.GOOS+"/"+runtime.GOARCH).Set(1)
	return g
}
