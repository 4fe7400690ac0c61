package controller

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/xvs-lb/xvs/model"
)

// Frontend collisions. Two Services can claim one address:port: an
// externalIP that is another Service's LoadBalancer IP, two Services given
// the same externalIP or LB IP. One datapath key serves one of them, and
// which one must not depend on when the agent last started or on the
// order its syncs saw them: a tenant's Service in namespace "aaa" with
// another's address in its externalIPs would otherwise win it at the next
// full sync (the CVE-2020-8554 class, made deterministic).
//
// The rule, one for both modes, applied to the whole State whether it was
// built at once (Translate) or through deltas (Tracker): the frontend goes
// to the claim of the most trusted kind (ClusterIP, allocated by the API
// server; then NodePort; then LoadBalancer, set by the load-balancer
// controller; then ExternalIP, set by whoever may edit the Service), then
// to the older Service (metadata.creationTimestamp), then to the first by
// name (namespace, name, port). The other claimants are translated without
// that frontend, and every claimant of a contested frontend gets a
// Problem (a Warning Event on its Service). The datapaths never see a
// collision; their own first-in-name-order check is a safety net.

// frontendKey identifies what one datapath entry serves.
type frontendKey struct {
	proto model.Protocol
	addr  netip.AddrPort
}

func keyOfFrontend(f model.Frontend) frontendKey {
	return frontendKey{f.Proto, netip.AddrPortFrom(f.Addr.Unmap(), f.Port)}
}

// claim is one ServicePort's claim on a frontend.
type claim struct {
	name    model.ServicePortName
	kind    model.FrontendKind
	created time.Time
}

// kindTrust orders frontend kinds, most trusted first.
func kindTrust(k model.FrontendKind) int {
	switch k {
	case model.ClusterIP:
		return 0
	case model.NodePort:
		return 1
	case model.LoadBalancer:
		return 2
	}
	return 3
}

// compareClaims orders claims, the winner first.
func compareClaims(a, b claim) int {
	return cmp.Or(cmp.Compare(kindTrust(a.kind), kindTrust(b.kind)), a.created.Compare(b.created), a.name.Compare(b.name))
}

// claims indexes the claims on every frontend, each list in winner order.
type claims map[frontendKey][]claim

// add records sp's claims; touched collects the frontends whose claims
// changed.
func (c claims) add(sp *model.ServicePort, created time.Time, touched map[frontendKey]bool) {
	for _, f := range sp.Frontends {
		k := keyOfFrontend(f)
		cl := claim{sp.Name, f.Kind, created}
		i, _ := slices.BinarySearchFunc(c[k], cl, compareClaims)
		c[k] = slices.Insert(c[k], i, cl)
		if touched != nil {
			touched[k] = true
		}
	}
}

// remove takes sp's claims back.
func (c claims) remove(sp *model.ServicePort, touched map[frontendKey]bool) {
	for _, f := range sp.Frontends {
		k := keyOfFrontend(f)
		c[k] = slices.DeleteFunc(c[k], func(cl claim) bool { return cl.name == sp.Name })
		if len(c[k]) == 0 {
			delete(c, k)
		}
		if touched != nil {
			touched[k] = true
		}
	}
}

// served is sp without the frontends another claim wins: sp itself when it
// wins all of them.
func (c claims) served(sp *model.ServicePort) *model.ServicePort {
	if sp == nil {
		return nil
	}
	lost := func(f model.Frontend) bool {
		cl := c[keyOfFrontend(f)]
		return len(cl) > 0 && cl[0].name != sp.Name
	}
	if !slices.ContainsFunc(sp.Frontends, lost) {
		return sp
	}
	out := *sp
	out.Frontends = slices.DeleteFunc(slices.Clone(sp.Frontends), lost)
	return &out
}

// problems says, for a contested frontend, who keeps it and who does not.
func (c claims) problems(k frontendKey) []Problem {
	cl := c[k]
	if len(cl) < 2 {
		return nil
	}
	w := cl[0]
	desc := func(x claim) string {
		return fmt.Sprintf("%s/%s (%s)", x.name.Namespace, x.name.Name, x.kind)
	}
	var out []Problem
	for _, x := range cl[1:] {
		out = append(out, Problem{Kind: "Service", Object: x.name.Namespace + "/" + x.name.Name,
			Reason: fmt.Sprintf("%s %s/%s is also claimed by %s, which keeps it (the most trusted kind, then the older Service, keeps a contested address): not served for this Service",
				x.kind, k.addr, k.proto, desc(w))})
	}
	if w.name.Namespace+"/"+w.name.Name != cl[1].name.Namespace+"/"+cl[1].name.Name {
		out = append(out, Problem{Kind: "Service", Object: w.name.Namespace + "/" + w.name.Name,
			Reason: fmt.Sprintf("%s %s/%s is also claimed by %s: this Service keeps it", w.kind, k.addr, k.proto, desc(cl[1]))})
	}
	return out
}
