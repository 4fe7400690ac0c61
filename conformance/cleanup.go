package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/xvs-lb/xvs/ipvs"
	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/version"
)

// stalePrefixTag makes every runner namespace, pin directory and temporary
// directory start with "xvs-cf<pid>-": lab.UniquePrefix(stalePrefixTag).
const stalePrefixTag = "cf"

// CleanupStale removes what runs that died without cleaning up (a crash, a
// SIGKILL) left behind: namespaces (with their agents' records in
// /run/xvs), bpffs pins and object directories whose
// owning runner process no longer exists. A live run's leftovers are never
// touched, so two runs (or a run and a test) can share the machine. Agents
// of a dead run are already gone: they are started tied to the runner
// (lab.StartTied) and killed by the kernel when it dies.
func CleanupStale() error {
	var errs []error
	names, err := lab.List("xvs-" + stalePrefixTag)
	if err != nil {
		errs = append(errs, err)
	}
	for _, n := range names {
		if stale(n) {
			// The per-namespace records of its agent (a SIGKILLed one
			// could not remove them), before the namespace goes.
			var st unix.Stat_t
			if unix.Stat(filepath.Join(lab.NetnsDir, n), &st) == nil {
				for _, prefix := range ipvs.NamespaceFilePrefixes {
					if err := os.Remove(ipvs.NamespaceFileOf(prefix, st.Ino)); err != nil && !os.IsNotExist(err) {
						errs = append(errs, err)
					}
				}
			}
			errs = append(errs, lab.Cleanup(n))
		}
	}
	for _, glob := range []string{"/sys/fs/bpf/xvs-" + stalePrefixTag + "*", filepath.Join(os.TempDir(), "xvs-"+stalePrefixTag+"*")} {
		matches, _ := filepath.Glob(glob)
		for _, m := range matches {
			if stale(filepath.Base(m)) {
				errs = append(errs, os.RemoveAll(m))
			}
		}
	}
	var failed []error
	for _, e := range errs {
		if e != nil {
			failed = append(failed, e)
		}
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	return fmt.Errorf("%d leftovers could not be removed (first: %w)", len(failed), failed[0])
}

// stale reports whether name ("xvs-cf<pid>-...") belongs to a process that
// is gone.
func stale(name string) bool {
	rest, ok := strings.CutPrefix(name, "xvs-"+stalePrefixTag)
	if !ok {
		return false
	}
	pidStr, _, ok := strings.Cut(rest, "-")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	return unix.Kill(pid, 0) == unix.ESRCH
}

// buildRevision is the commit the binary was built from: the one `make
// build` stamps, else the Go toolchain's VCS stamp (absent from builds
// outside a git work tree, such as the VM rig's).
func buildRevision() string {
	if c := version.GitCommit(); c != "unknown" {
		if len(c) > 12 {
			c = c[:12]
		}
		return c
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// sctpKernel says whether the kernel's SCTP module is present, without
// loading it (opening an SCTP socket would auto-load sctp.ko).
func sctpKernel() string {
	if _, err := os.Stat("/sys/module/sctp"); err == nil {
		return "the kernel has SCTP"
	}
	return "the kernel has no SCTP module loaded"
}
