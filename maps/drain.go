package maps

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Draining is the way back from xvs to another Service proxy (kube-proxy)
// without cutting what xvs serves: with XVS_CFG_DRAIN set, the programs
// keep translating the flows they have, and leave every new one untouched
// to the node's netfilter rules, which the other proxy programs. Once no
// flow of xvs's is open, its programs and maps can go. A running agent
// rewrites the node configuration, and with it clears the flag: draining
// is for the pinned datapath of a stopped agent (xvs cleanup --drain).

// SetDraining sets or clears XVS_CFG_DRAIN in the node configuration
// pinned under pinPath.
func SetDraining(pinPath string, on bool) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, xbpf.XvsMapXvsNodeConfig), nil)
	if err != nil {
		return fmt.Errorf("open pinned node config: %w", err)
	}
	defer m.Close()
	var c xbpf.NodeConf
	if err := m.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("read node config: %w", err)
	}
	drain := uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_DRAIN)
	if on {
		c.Flags |= drain
	} else {
		c.Flags &^= drain
	}
	if err := m.Put(uint32(0), c); err != nil {
		return fmt.Errorf("write node config: %w", err)
	}
	return nil
}

// OpenFlows counts the flows xvs still carries: TCP connections not yet
// closed (TIME_WAIT and CLOSE only wait out their last segments, which
// the other proxy's conntrack does not need) and unexpired UDP and SCTP
// flows.
func (m *Maps) OpenFlows() (int, error) {
	cs, err := m.Connections(ConnectionFilter{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range cs {
		if c.Protocol == model.TCP.String() && (c.State == "TIME_WAIT" || c.State == "CLOSE") {
			continue
		}
		n++
	}
	return n, nil
}
