package ipvs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// sysctl is one /proc/sys setting; the paths are per network namespace.
type sysctl struct{ path, value string }

// kubeProxySysctls are the settings kube-proxy's IPVS mode makes
// (SEMANTICS 3.18), for a kernel of the given release.
func kubeProxySysctls(release string, strictARP bool) []sysctl {
	s := []sysctl{
		{"net/ipv4/vs/conntrack", "1"},          // SNAT of IPVS connections needs conntrack
		{"net/ipv4/vs/expire_nodest_conn", "1"}, // packets to removed real servers end the flow
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	if kernelBefore(release, 5, 9) {
		// The 1 s port-reuse delay (#70747) and traffic to deleted pods
		// (#81775) were fixed in 5.9; older kernels need reuse mode 0.
		s = append(s, sysctl{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	if strictARP {
		s = append(s, sysctl{"net/ipv4/conf/all/arp_ignore", "1"}, sysctl{"net/ipv4/conf/all/arp_announce", "2"})
	}
	return s
}

// kernelBefore reports whether release (uname -r) is older than major.minor.
func kernelBefore(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma < major || (ma == major && mi < minor)
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// PrepareNode is what ipvs mode needs of the node that a container with
// capabilities alone cannot do (its /proc/sys is read-only, it may not
// load modules): load ip_vs and write kube-proxy's IPVS sysctls. The agent
// does it again at start, and finds it done (xvs agent --init-only, in a
// privileged init container, runs it first).
func PrepareNode(strictARP bool, log *slog.Logger) error {
	if err := Available(); err != nil {
		return err
	}
	return setSysctls(Config{StrictARP: strictARP}, log)
}

func setSysctls(cfg Config, log *slog.Logger) error {
	for _, s := range kubeProxySysctls(kernelRelease(), cfg.StrictARP) {
		p := filepath.Join("/proc/sys", s.path)
		cur, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("sysctl %s: %w", s.path, err)
		}
		if strings.TrimSpace(string(cur)) == s.value {
			continue
		}
		if err := os.WriteFile(p, []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", s.path, s.value, err)
		}
		log.Info("sysctl set", "key", strings.ReplaceAll(s.path, "/", "."), "value", s.value)
	}
	return nil
}
