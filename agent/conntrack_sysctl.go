package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	kpv1 "k8s.io/kube-proxy/config/v1alpha1"
)

// The host's netfilter conntrack sysctls, set at start as kube-proxy sets
// them (SEMANTICS 3.17): the node's own connections (hostNetwork pods, the
// kubelet, pod-to-pod traffic through netfilter) keep the timeouts
// operators and the e2e suite expect, whichever mode serves the Services.
// Unset fields take kube-proxy's defaults.
const (
	ctDefaultMaxPerCore  = 32768
	ctDefaultMin         = 131072
	ctDefaultEstablished = 24 * time.Hour
	ctDefaultCloseWait   = time.Hour
)

// conntrackSysctls lists what to write, as kube-proxy computes it.
func conntrackSysctls(ct kpv1.KubeProxyConntrackConfiguration, cores int) map[string]string {
	out := map[string]string{}
	perCore, min := int32(ctDefaultMaxPerCore), int32(ctDefaultMin)
	if ct.MaxPerCore != nil {
		perCore = *ct.MaxPerCore
	}
	if ct.Min != nil {
		min = *ct.Min
	}
	if perCore > 0 {
		out["net/netfilter/nf_conntrack_max"] = strconv.Itoa(max(int(perCore)*cores, int(min)))
	}
	seconds := func(d *time.Duration, def time.Duration) string {
		v := def
		if d != nil {
			v = *d
		}
		if v <= 0 {
			return ""
		}
		return strconv.Itoa(int(v / time.Second))
	}
	var est, cw *time.Duration
	if ct.TCPEstablishedTimeout != nil {
		est = &ct.TCPEstablishedTimeout.Duration
	}
	if ct.TCPCloseWaitTimeout != nil {
		cw = &ct.TCPCloseWaitTimeout.Duration
	}
	for k, v := range map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": seconds(est, ctDefaultEstablished),
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  seconds(cw, ctDefaultCloseWait),
		"net/netfilter/nf_conntrack_udp_timeout":             seconds(&ct.UDPTimeout.Duration, 0),
		"net/netfilter/nf_conntrack_udp_timeout_stream":      seconds(&ct.UDPStreamTimeout.Duration, 0),
	} {
		if v != "" {
			out[k] = v
		}
	}
	if ct.TCPBeLiberal {
		out["net/netfilter/nf_conntrack_tcp_be_liberal"] = "1"
	}
	return out
}

// applyConntrackSysctls writes them under root (/proc/sys), each only when
// it differs; a kernel without nf_conntrack (no such files) is logged, not
// an error, as kube-proxy leaves it.
func applyConntrackSysctls(log *slog.Logger, root string, ct kpv1.KubeProxyConntrackConfiguration) error {
	var errs []error
	for k, v := range conntrackSysctls(ct, runtime.NumCPU()) {
		path := filepath.Join(root, k)
		have, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			log.Info("Host conntrack sysctl not present (nf_conntrack not loaded); left alone", "sysctl", k)
			continue
		}
		if err == nil && strings.TrimSpace(string(have)) == v {
			continue
		}
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("set %s=%s: %w", k, v, err))
			continue
		}
		log.Info("Set host conntrack sysctl", "sysctl", k, "value", v)
	}
	return errors.Join(errs...)
}
