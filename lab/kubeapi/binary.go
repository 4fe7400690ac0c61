package kubeapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"syscall"
)

// The rig's source: a separate Go module, relative to the xvs repository root.
const sourceDir = "test/apiserver"

// Environment overrides.
const (
	// EnvBinary names a prebuilt rig binary to use as is (no cache, no build).
	EnvBinary = "XVS_APISERVER_BIN"
	// EnvCache replaces the cache root (default /var/cache/xvs when
	// writable, else the user cache directory + /xvs).
	EnvCache = "XVS_CACHE_DIR"
)

// Build describes where the rig binary for the current source lives.
type Build struct {
	Source string // absolute path of test/apiserver
	Key    string // "<kubernetes version>-<12 hex of the source hash>"
	Path   string // cached binary: <cache root>/apiserver/<Key>/apiserver
}

// Locate computes the cache key of the rig's current source without
// building anything. The key is the k8s.io/kubernetes version from
// test/apiserver/go.mod and a hash of go.mod, go.sum, main.go and the Go
// version, so any change to the rig or its pinned modules builds anew while
// an unchanged rig is reused across clones and runs.
func Locate() (*Build, error) {
	src, err := findSource()
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	var version string
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return nil, fmt.Errorf("rig source: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
		if name == "go.mod" {
			m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(b)
			if m == nil {
				return nil, fmt.Errorf("%s/go.mod: no k8s.io/kubernetes requirement", src)
			}
			version = string(m[1])
		}
	}
	fmt.Fprintf(h, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	key := version + "-" + hex.EncodeToString(h.Sum(nil))[:12]
	root, err := cacheRoot()
	if err != nil {
		return nil, err
	}
	return &Build{Source: src, Key: key, Path: filepath.Join(root, "apiserver", key, "apiserver")}, nil
}

// Binary returns the path of the rig binary, building it into the cache
// when it is not there yet (a cold build takes about ten minutes; `make
// apiserver` does it ahead of `go test`, whose default timeout is ten
// minutes too). Concurrent callers, in this process or others, wait for one
// build under a file lock. $XVS_APISERVER_BIN, when set, wins.
func Binary(ctx context.Context) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", EnvBinary, err)
		}
		return p, nil
	}
	b, err := Locate()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(b.Path); err == nil {
		return b.Path, nil
	}
	return b.Path, b.build(ctx)
}

func (b *Build) build(ctx context.Context) error {
	dir := filepath.Dir(b.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("rig cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("rig cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("rig cache lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(b.Path); err == nil {
		return nil // another process built it while we waited
	}

	gobin, err := goTool()
	if err != nil {
		return err
	}
	tmp := b.Path + ".tmp"
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", tmp, ".")
	cmd.Dir = b.Source
	// The rig is its own module; a go.work elsewhere must not pull it in.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s: %w\n%s", b.Source, err, out.Bytes())
	}
	if err := os.Rename(tmp, b.Path); err != nil {
		return fmt.Errorf("rig cache: %w", err)
	}
	return nil
}

// findSource finds test/apiserver from this file's location (set at
// compile time) or, for a -trimpath build, by walking up from the working
// directory to the xvs module root.
func findSource() (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			if mod, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil &&
				bytes.HasPrefix(mod, []byte("module github.com/xvs-lb/xvs\n")) {
				return filepath.Join(d, sourceDir), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", errors.New("cannot find the xvs repository root (go.mod of github.com/xvs-lb/xvs) from this package or the working directory")
}

func cacheRoot() (string, error) {
	if d := os.Getenv(EnvCache); d != "" {
		return d, nil
	}
	const system = "/var/cache/xvs"
	if err := os.MkdirAll(system, 0o755); err == nil && syscall.Access(system, 2 /* W_OK */) == nil {
		return system, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory: set $%s: %w", EnvCache, err)
	}
	return filepath.Join(d, "xvs"), nil
}

func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	for _, p := range []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "/usr/local/go/bin/go"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no go command in $PATH or /usr/local/go/bin")
}
