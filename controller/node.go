package controller

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/xvs-lb/xvs/model"
)

// env is what translating any one Service needs to know about this node and
// configuration. It changes only when the Node does, which is why a Node
// change forces a full recomputation (nftables' needFullSync).
type env struct {
	cfg           *Config
	node          model.Node
	nodePortAddrs []netip.Addr
	// serviceCIDRs are the ranges ClusterIPs come from: the configured
	// ones, and the Tracker's ServiceCIDR objects.
	serviceCIDRs []netip.Prefix
}

// newEnv resolves the node view. node may be nil (not yet known, or the
// file source has none): then addresses come from cfg.NodeAddresses and
// there is no zone, which disables zone topology filtering.
func newEnv(cfg *Config, node *v1.Node) (*env, []Problem) {
	e := &env{cfg: cfg, node: model.Node{Name: cfg.NodeName}, serviceCIDRs: cfg.ServiceCIDRs}
	sel, probs := cfg.nodePortSelector()
	if node != nil && cfg.NodeName != "" && node.Name != cfg.NodeName {
		probs = append(probs, Problem{Kind: "Node", Object: node.Name,
			Reason: fmt.Sprintf("not this node (%q): ignored", cfg.NodeName)})
		node = nil
	}
	if node != nil {
		e.node.Labels = maps.Clone(node.Labels)
		e.node.Zone = node.Labels[v1.LabelTopologyZone]
	}
	if len(cfg.NodeAddresses) > 0 {
		for _, a := range cfg.NodeAddresses {
			if a = a.Unmap(); a.IsValid() && !containsAddr(e.node.Addresses, a) {
				e.node.Addresses = append(e.node.Addresses, a)
			}
		}
	} else if node != nil {
		var p []Problem
		e.node.Addresses, p = nodeAddresses(node)
		probs = append(probs, p...)
	}
	e.nodePortAddrs = sel.selectNodePortAddrs(e.node.Addresses)
	return e, probs
}

// nodeAddresses orders a Node's addresses as kube-proxy's GetNodeHostIPs
// does: InternalIPs first, then ExternalIPs, so that the first of each
// family is the primary node IP.
func nodeAddresses(node *v1.Node) ([]netip.Addr, []Problem) {
	var out []netip.Addr
	var probs []Problem
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, na := range node.Status.Addresses {
			if na.Type != typ {
				continue
			}
			a, err := parseAddr(na.Address)
			if err != nil {
				probs = append(probs, Problem{Kind: "Node", Object: node.Name,
					Reason: fmt.Sprintf("%s: %v: ignored", typ, err)})
				continue
			}
			if !containsAddr(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, probs
}

// newState returns an empty State carrying the node-wide fields.
func (e *env) newState(services int) *model.State {
	return &model.State{
		Node:          e.node,
		Services:      make(map[model.ServicePortName]*model.ServicePort, services),
		ServiceCIDRs:  slices.Clone(e.cfg.ServiceCIDRs),
		PodCIDRs:      slices.Clone(e.cfg.PodCIDRs),
		MasqueradeAll: e.cfg.MasqueradeAll,
	}
}
