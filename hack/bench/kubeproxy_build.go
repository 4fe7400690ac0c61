package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// The real kube-proxy is built from test/kubeproxy (its own Go module:
// upstream cmd/kube-proxy of the k8s.io/kubernetes release in its go.mod)
// into a cache outside the repository, as lab/kubeapi builds the tests' API
// server: <cache>/kube-proxy/<version>-<hash>/kube-proxy, where the hash
// covers go.mod, go.sum, main.go and the Go version, so that an unchanged
// rig is reused across clones and runs and any change builds anew.
const (
	kubeProxySource = "test/kubeproxy"
	// envKubeProxyBin names a kube-proxy binary to use as is (no cache,
	// no build): for a machine that already built one elsewhere.
	envKubeProxyBin = "XVS_KUBE_PROXY_BIN"
	// envAgentArgs adds flags to the real agent's command line (agentrss.go).
	envAgentArgs = "XVS_BENCH_AGENT_ARGS"
	// envCacheDir replaces the cache root, as for lab/kubeapi.
	envCacheDir = "XVS_CACHE_DIR"
)

// kubeProxyBuild is where the binary for the current source lives.
type kubeProxyBuild struct {
	Source  string // absolute path of test/kubeproxy
	Version string // k8s.io/kubernetes version of its go.mod
	Key     string // "<version>-<12 hex of the source hash>"
	Path    string // <cache root>/kube-proxy/<Key>/kube-proxy
}

func locateKubeProxy() (*kubeProxyBuild, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	b := &kubeProxyBuild{Source: filepath.Join(root, kubeProxySource)}
	h := sha256.New()
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		data, err := os.ReadFile(filepath.Join(b.Source, name))
		if err != nil {
			return nil, fmt.Errorf("kube-proxy source: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
		if name == "go.mod" {
			m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(data)
			if m == nil {
				return nil, fmt.Errorf("%s/go.mod: no k8s.io/kubernetes requirement", b.Source)
			}
			b.Version = string(m[1])
		}
	}
	fmt.Fprintf(h, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	b.Key = b.Version + "-" + hex.EncodeToString(h.Sum(nil))[:12]
	cache := os.Getenv(envCacheDir)
	if cache == "" {
		cache = "/var/cache/xvs"
	}
	b.Path = filepath.Join(cache, "kube-proxy", b.Key, "kube-proxy")
	return b, nil
}

// kubeProxyBinary returns the path of the kube-proxy binary, building it
// into the cache first when it is not there (a few minutes cold). One
// build at a time, across processes, under a file lock in the cache
// directory; $XVS_KUBE_PROXY_BIN, when set, wins.
func kubeProxyBinary(ctx context.Context, log io.Writer) (string, error) {
	if p := os.Getenv(envKubeProxyBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", envKubeProxyBin, err)
		}
		return p, nil
	}
	b, err := locateKubeProxy()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(b.Path); err == nil {
		return b.Path, nil
	}
	dir := filepath.Dir(b.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kube-proxy cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("kube-proxy cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("kube-proxy cache lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(b.Path); err == nil {
		return b.Path, nil // another process built it while we waited
	}
	logf(log, "building kube-proxy %s from Go modules into %s (a few minutes, once)", b.Version, dir)
	start := time.Now()
	// The version stamps a release build carries (kube-proxy logs them and
	// exports them as kubernetes_build_info), as hack/e2e stamps kubelet.
	minor := strings.Split(b.Version, ".")[1]
	ldflags := strings.Join([]string{"-s", "-w",
		"-X k8s.io/component-base/version.gitVersion=" + b.Version,
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/component-base/version.gitMinor=" + minor,
		"-X k8s.io/component-base/version.gitTreeState=clean",
	}, " ")
	tmp := b.Path + ".tmp"
	cmd := exec.CommandContext(ctx, goBin(), "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, ".")
	cmd.Dir = b.Source
	// Its own module; a go.work elsewhere must not pull it in. Static, as
	// upstream's release binaries are.
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly -buildvcs=false")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build %s: %w\n%s", b.Source, err, out.Bytes())
	}
	if err := os.Rename(tmp, b.Path); err != nil {
		return "", fmt.Errorf("kube-proxy cache: %w", err)
	}
	logf(log, "built kube-proxy in %v", time.Since(start).Round(time.Second))
	return b.Path, nil
}

// goBin is the go command: from $PATH, else the toolchain this program was
// built with, else /usr/local/go.
func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	for _, p := range []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "/usr/local/go/bin/go"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}
