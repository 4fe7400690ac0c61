package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xvs-lb/xvs/loader"
	xmetrics "github.com/xvs-lb/xvs/metrics"
)

// TestFallbackOnlyForTheKernel: with --fallback=ipvs, a configuration
// error of the BPF datapath fails the start instead of serving with IPVS,
// which would remove the BPF datapath's pinned maps and every connection
// through them; only a kernelError (the BPF objects cannot load on this
// kernel) falls back. Before, every startEBPF error fell back.
func TestFallbackOnlyForTheKernel(t *testing.T) {
	m := xmetrics.New()
	f := settings{pinPath: t.TempDir() + "/never-used", mode: modeFlags{
		proxyMode: modeEBPF, fallback: modeIPVS, masqPorts: "40000-30000", netfilter: netfilterPass,
	}}
	_, err := startDatapath(slog.Default(), f, &nodeEvents{log: slog.Default()}, m)
	if err == nil || !strings.Contains(err.Error(), "--masquerade-port-range") {
		t.Fatalf("start with a bad --masquerade-port-range: %v, want that error", err)
	}
	if n := testutil.ToFloat64(m.DatapathFallbacks.WithLabelValues(modeIPVS, "BPFLoadFailed")); n != 0 {
		t.Fatalf("fell back to IPVS %v times for a configuration error", n)
	}
	if errors.As(err, new(kernelError)) {
		t.Fatalf("a configuration error classified as the kernel's: %v", err)
	}
	for _, tc := range []struct {
		err    error
		kernel bool
	}{
		{kernelError{errors.New("load programs: permission denied: invalid mem access")}, true},
		{errors.Join(errors.New("context"), kernelError{errors.New("map type not supported")}), true},
		{errors.New("another xvs agent uses this --pin-path"), false},
		{loadError(errors.New("load programs: invalid argument")), true},
		{loadError(fmt.Errorf("%w: xvs_conntrack: a resize to 4096 entries is still to be finished", loader.ErrResizePending)), false},
		{loadError(fmt.Errorf("%w: xvs_services", loader.ErrLayoutChanged)), false},
		{loadError(fmt.Errorf("%w: xvs_services from 8192 to 4 entries", loader.ErrResizeRefused)), false},
		// An oversized --bpf-* size is the operator's to correct: falling
		// back would remove the maps and every connection through them.
		{loadError(fmt.Errorf("%w: the kernel cannot create xvs_conntrack with 2147483648 entries", loader.ErrMapSize)), false},
	} {
		if got := errors.As(tc.err, new(kernelError)); got != tc.kernel {
			t.Errorf("%v: kernel %v, want %v", tc.err, got, tc.kernel)
		}
	}
}

// TestAttachFailuresCounted: a device the programs could not be put on
// (or a failed device watch) counts in xvs_device_attach_failures_total;
// a kernel without the XDP program, which tc serves, does not.
func TestAttachFailuresCounted(t *testing.T) {
	m := xmetrics.New()
	report := attachReporter(slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	report(loader.Attachment{Device: "eth0", Mode: "tcx"}, nil)
	report(loader.Attachment{}, fmt.Errorf("attach lxc12: %w", errors.New("no such device")))
	report(loader.Attachment{Device: "eth1"}, fmt.Errorf("eth1: %w", loader.ErrXDPUnsupported))
	report(loader.Attachment{}, errors.New("link watch: no buffer space available"))
	if n := testutil.ToFloat64(m.AttachFailures); n != 2 {
		t.Fatalf("xvs_device_attach_failures_total %v, want 2", n)
	}
}
