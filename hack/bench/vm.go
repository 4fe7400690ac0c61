package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// VMOptions shape the IPVS comparison inside the VM rig (hack/vm): this
// host's kernel has no IPVS, so ipvs mode runs in a qemu guest on a
// Debian kernel, against ebpf mode in the same guest.
type VMOptions struct {
	// Kernel is the Debian kernel series to boot (hack/vm/vm.sh run
	// KERNEL); empty skips the comparison.
	Kernel string
	// Traffic shapes the runs inside the guest (its Datapaths default to
	// the floor and both agent modes).
	Traffic TrafficOptions
	// Timeout bounds the VM's life.
	Timeout time.Duration
}

func (o VMOptions) validate() error {
	if o.Kernel == "" {
		return nil
	}
	if len(o.Traffic.Sizes) == 0 {
		return errors.New("vm: no traffic sizes")
	}
	return o.Traffic.validate()
}

var vmDatapaths = []datapath{dpFloor, dpAgentEBPF, dpAgentIPVS}

// vmResult is what the guest measured, and how long the whole VM run took.
type vmResult struct {
	Kernel  string
	Results []trafficResult
	Took    time.Duration
	Command string
}

// measureVM builds the benchmark and the xvs binary statically into a
// directory shared with the guest, boots the rig and runs the traffic
// benchmark inside it (-guest-json), then reads its results back.
func measureVM(ctx context.Context, opts Options) (*vmResult, error) {
	vo := opts.VM
	if vo.Kernel == "" {
		return nil, nil
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	// qemu and the guest userland's packages (a no-op once installed).
	deps := exec.CommandContext(ctx, filepath.Join(root, "hack/vm/vm.sh"), "deps")
	if out, err := deps.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("vm.sh deps: %v: %s", err, out)
	}
	share, err := os.MkdirTemp("", "xvs-bench-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(share)
	for _, b := range [][2]string{{"xvsbench", "./hack/bench"}} {
		// hack/bench is its own module: built from its directory.
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(share, b[0]), ".")
		cmd.Dir = filepath.Join(root, b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v: %s", b[1], err, out)
		}
	}
	if _, err := buildXvs(ctx, share, true); err != nil {
		return nil, err
	}
	to := vo.Traffic
	ds := to.Datapaths
	if len(ds) == 0 {
		ds = vmDatapaths
	}
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.short()
	}
	guest := fmt.Sprintf("./xvsbench -guest-json /host/vm.json -xvs-bin /host/xvs -datapaths %s -traffic-sizes %s -rules-max %d -rounds %d -workers %d -window %v -warmup %v",
		strings.Join(names, ","), joinInts(to.Sizes), to.RulesMax, to.Rounds, to.Workers, to.Window, to.Warmup)
	timeout := vo.Timeout
	if timeout <= 0 {
		timeout = 20 * time.Minute
	}
	logf(opts.Log, "vm: booting %s: %s", vo.Kernel, guest)
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack/vm/vm.sh"), "run", vo.Kernel, "--share", share,
		"--timeout", strconv.Itoa(int(timeout.Seconds())), "--", guest)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("vm.sh run %s: %v:\n%s", vo.Kernel, err, tail(out.String(), 40))
	}
	data, err := os.ReadFile(filepath.Join(share, "vm.json"))
	if err != nil {
		return nil, fmt.Errorf("guest results: %v:\n%s", err, tail(out.String(), 40))
	}
	r := &vmResult{Kernel: vo.Kernel, Took: time.Since(start), Command: "hack/vm/vm.sh run " + vo.Kernel + " -- '" + guest + "'"}
	if err := json.Unmarshal(data, &r.Results); err != nil {
		return nil, fmt.Errorf("guest results: %w", err)
	}
	logf(opts.Log, "vm: done in %v", r.Took.Round(time.Second))
	return r, nil
}

// guestMain is the benchmark inside the guest: the traffic comparison
// only, results as JSON.
func guestMain(ctx context.Context, opts Options, out string) error {
	rs, err := measureTraffic(ctx, opts)
	if err != nil {
		return err
	}
	data, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	return os.WriteFile(out, data, 0o644)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// repoRoot finds the module root (go.mod of github.com/xvs-lb/xvs) from the
// working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/xvs-lb/xvs\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the xvs repository")
		}
		dir = parent
	}
}

// vmReport renders the IPVS section.
func vmReport(opts Options, r *vmResult, plots map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## IPVS mode against ebpf mode, inside the VM rig\n\n")
	if r == nil {
		fmt.Fprintf(&b, "Not run (no -vm kernel).\n\n")
		return b.Bytes()
	}
	fmt.Fprintf(&b, "This host's kernel has no IPVS, so this comparison runs in the VM rig (docs/vm.md): Debian's %s kernel under qemu **with software emulation (TCG, no KVM)**, two virtual CPUs. Every figure here is many times slower than on real hardware and the emulator's costs are not a real CPU's, so only the ratios inside this section mean anything, and they are indicative. Command (on the host, %v in all): `%s`.\n\n",
		r.Kernel, r.Took.Round(time.Second), r.Command)
	fmt.Fprintf(&b, "Same topology, servers, load generator, rounds and ratios as above, inside the guest. Both modes are the real `xvs agent` binary in the node namespace on manifests for the N Services (the file source): `--proxy-mode=ebpf` (tc programs) and `--proxy-mode=ipvs` (kernel IPVS virtual servers, VIPs on the kube-ipvs0 dummy device, nftables rules as kube-proxy's ipvs mode has them). The agent is stopped and `xvs cleanup` run between datapaths.\n\n")
	writeFailures(&b, r.Results)
	writeMetricTable(&b, "New TCP connections per second (VM)", "conn/s", "%.0f", 1, r.Results, mCPS)
	writeMetricTable(&b, "CPU time per new connection (VM, µs)", "µs of process CPU per connection", "%.1f", 1e3, r.Results, mCPUConn)
	writeMetricTable(&b, "Requests per second over kept-alive connections (VM)", "req/s", "%.0f", 1, r.Results, mRPS)
	writeLatencyTable(&b, r.Results)
	writeProgramTable(&b, r.Results)
	if p := plots["vm"]; p != "" {
		fmt.Fprintf(&b, "![VM: new connections per second against the number of Services](%s)\n\n", p)
	}
	return b.Bytes()
}
