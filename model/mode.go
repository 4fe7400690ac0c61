package model

// Mode is a datapath mode, as --proxy-mode and the KubeProxyConfiguration's
// mode name it. kube-proxy's own iptables, nftables and kernelspace are not
// xvs modes.
type Mode string

const (
	// ModeEBPF is xvs's tc/XDP datapath, the default.
	ModeEBPF Mode = "ebpf"
	// ModeIPVS is the kernel IPVS datapath: the fallback for kernels
	// without the BPF features xvs needs, and the second implementation
	// the conformance corpus checks.
	ModeIPVS Mode = "ipvs"
)

// Modes are the datapath modes, the default first.
var Modes = []Mode{ModeEBPF, ModeIPVS}

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, bool) {
	for _, m := range Modes {
		if string(m) == s {
			return m, true
		}
	}
	return "", false
}
