package controller

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// The service ranges of the unallocated-address DROP (docs/semantics.md
// §3.2) are the union of two inputs: the configured ranges
// (Config.ServiceCIDRs, xvs's --service-cluster-ip-range) and the
// spec.cidrs of every networking.k8s.io/v1 ServiceCIDR, which is where a
// v1.37 cluster keeps them. The API server creates the "kubernetes"
// ServiceCIDR from its own --service-cluster-ip-range, and an
// administrator extends the cluster's ranges by creating more, so the
// drop follows the cluster with no flag at all, as kube-proxy's nftables
// mode does (its OnServiceCIDRsChanged). A ServiceCIDR that is being
// deleted keeps counting until it is gone: the API server removes its
// finalizer only once no Service holds an address in it.

func (t *Tracker) OnServiceCIDRAdd(c *networkingv1.ServiceCIDR) bool { return t.setServiceCIDR(c) }
func (t *Tracker) OnServiceCIDRUpdate(_, c *networkingv1.ServiceCIDR) bool {
	return t.setServiceCIDR(c)
}

func (t *Tracker) OnServiceCIDRDelete(c *networkingv1.ServiceCIDR) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.cidrObjs[c.Name]; !ok {
		return false
	}
	delete(t.cidrObjs, c.Name)
	delete(t.cidrProblems, c.Name)
	return t.recomputeServiceCIDRs()
}

func (t *Tracker) setServiceCIDR(c *networkingv1.ServiceCIDR) bool {
	prefixes, probs := parseServiceCIDR(c)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cidrObjs[c.Name] = prefixes
	if len(probs) > 0 {
		t.cidrProblems[c.Name] = probs
	} else {
		delete(t.cidrProblems, c.Name)
	}
	return t.recomputeServiceCIDRs()
}

// parseServiceCIDR reads spec.cidrs. The API server accepts only
// canonical CIDRs (the address is the network's), so anything else can
// come from a manifest file only; it is reported and left out, as the API
// server would have refused the object.
func parseServiceCIDR(c *networkingv1.ServiceCIDR) ([]netip.Prefix, []Problem) {
	var out []netip.Prefix
	var probs []Problem
	for i, s := range c.Spec.CIDRs {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			probs = append(probs, Problem{Kind: "ServiceCIDR", Object: c.Name,
				Reason: fmt.Sprintf("spec.cidrs[%d] %q: not a CIDR: ignored", i, s)})
		case p != p.Masked():
			probs = append(probs, Problem{Kind: "ServiceCIDR", Object: c.Name,
				Reason: fmt.Sprintf("spec.cidrs[%d] %q: not canonical (the network is %s): ignored", i, s, p.Masked())})
		default:
			out = append(out, p)
		}
	}
	return out, probs
}

// recomputeServiceCIDRs sets the effective ranges and reports whether
// they changed (the caller holds mu).
func (t *Tracker) recomputeServiceCIDRs() bool {
	next := slices.Clone(t.cfg.ServiceCIDRs)
	for _, ps := range t.cidrObjs {
		next = append(next, ps...)
	}
	slices.SortFunc(next, comparePrefix)
	next = slices.Compact(next)
	if slices.Equal(next, t.serviceCIDRs) {
		return false
	}
	t.serviceCIDRs = next
	t.cidrsChanged = true
	// Whether an externalIP is served depends on the ranges.
	if !t.cfg.AllowExternalIPsInServiceCIDRs {
		for k, svc := range t.services {
			if len(svc.Spec.ExternalIPs) > 0 {
				t.dirty[k] = true
			}
		}
	}
	return true
}

// comparePrefix orders IPv4 before IPv6, then by address and length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}
