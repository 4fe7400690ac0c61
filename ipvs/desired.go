package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xvs-lb/xvs/model"
)

// IPVS service flags (include/uapi/linux/ip_vs.h).
const (
	flagPersistent = 0x1
	flagHashed     = 0x2 // set by the kernel on every listed service; never ours to set
	flagSchedSH2   = 0x10
	// kube-proxy sets IP_VS_SVC_F_SCHED2 for mh (mh-port: hash the source
	// port as well), as its FlagSourceHash.
	flagMHPort = flagSchedSH2
)

// vsKey identifies a virtual server: address, protocol and port.
type vsKey struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

func (k vsKey) String() string {
	return fmt.Sprintf("%s %s", k.Proto, netip.AddrPortFrom(k.Addr, k.Port))
}

func (k vsKey) compare(o vsKey) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Proto, o.Proto); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

// rsKey identifies a real server of a virtual server.
type rsKey struct {
	Addr netip.Addr
	Port uint16
}

func (k rsKey) String() string { return netip.AddrPortFrom(k.Addr, k.Port).String() }

// virtualServer is the desired state of one IPVS virtual server.
type virtualServer struct {
	Key       vsKey
	Kind      model.FrontendKind
	Owner     model.ServicePortName
	Scheduler string
	Flags     uint32
	Timeout   uint32 // persistence timeout (seconds) when Flags has persistent
	// Reals maps every real server to its weight.
	Reals map[rsKey]int
	// Masquerade says whether new connections to this frontend are SNATed
	// (always for external frontends with eTP=Cluster).
	Masquerade bool
	// SourceRanges filter LoadBalancer frontends (loadBalancerSourceRanges
	// of the frontend's family; empty = not filtered).
	SourceRanges []netip.Prefix
}

// hasWeight says whether IPVS can schedule a new connection to vs: some
// real server has a weight above 0.
func (vs *virtualServer) hasWeight() bool {
	for _, w := range vs.Reals {
		if w > 0 {
			return true
		}
	}
	return false
}

// desired is what one State asks of kernel IPVS.
type desired struct {
	Servers map[vsKey]*virtualServer
	// VIPs are the addresses bound to the dummy interface: ClusterIPs,
	// external IPs and LoadBalancer IPs (never node addresses).
	VIPs map[netip.Addr]bool
	// Serving maps every UDP frontend to the endpoint addresses that may
	// answer for it (stale UDP conntrack cleanup).
	Serving map[vsKey]map[netip.Addr]bool
	// Problems are the parts of the State that could not be programmed.
	Problems []string
}

// schedulerFor returns the IPVS scheduler for a ServicePort: its own, else
// the configured default, else rr (kube-proxy's default).
func schedulerFor(sp *model.ServicePort, def string) string {
	if sp.Scheduler != "" {
		return sp.Scheduler
	}
	if def != "" {
		return def
	}
	return "rr"
}

// buildDesired turns a State into virtual servers. A frontend claimed by
// two ServicePorts goes to the first in name order, as in the BPF datapath.
// localAddrs are addresses already on other interfaces: an external or LB
// IP among them is not bound to the dummy interface (kube-proxy does the
// same), but still gets its virtual server.
func buildDesired(st *model.State, defScheduler string, localAddrs map[netip.Addr]bool) *desired {
	d := &desired{
		Servers: map[vsKey]*virtualServer{},
		VIPs:    map[netip.Addr]bool{},
		Serving: map[vsKey]map[netip.Addr]bool{},
	}
	names := make([]model.ServicePortName, 0, len(st.Services))
	for n := range st.Services {
		names = append(names, n)
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	for _, name := range names {
		sp := st.Services[name]
		sched := schedulerFor(sp, defScheduler)
		var flags, timeout uint32
		if sp.Affinity.ClientIP {
			flags |= flagPersistent
			timeout = sp.Affinity.TimeoutSeconds
			if timeout == 0 {
				timeout = 10800
			}
		}
		if sched == "mh" {
			flags |= flagMHPort
		}
		for _, f := range sp.Frontends {
			k := vsKey{Addr: f.Addr.Unmap(), Proto: f.Proto, Port: f.Port}
			if prev, ok := d.Servers[k]; ok {
				d.Problems = append(d.Problems, fmt.Sprintf("%s: frontend %s already belongs to %s", name, k, prev.Owner))
				continue
			}
			vs := &virtualServer{
				Key: k, Kind: f.Kind, Owner: name, Scheduler: sched, Flags: flags, Timeout: timeout,
				Reals:      map[rsKey]int{},
				Masquerade: f.Kind.External() && !sp.LocalPolicy(f.Kind),
			}
			if f.Kind == model.LoadBalancer {
				vs.SourceRanges = sp.SourceRangesFor(k.Addr)
			}
			for _, e := range realsFor(sp, f) {
				vs.Reals[rsKey{Addr: e.Addr.Unmap(), Port: e.Port}] = int(e.SchedWeight())
			}
			d.Servers[k] = vs
			if f.Kind != model.NodePort && !localAddrs[k.Addr] {
				d.VIPs[k.Addr] = true
			}
			if f.Proto == model.UDP {
				serving := map[netip.Addr]bool{}
				for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
					for _, e := range set {
						if e.Serving {
							serving[e.Addr.Unmap()] = true
						}
					}
				}
				d.Serving[k] = serving
			}
		}
	}
	return d
}

// realsFor returns the endpoints of frontend f's virtual server: those of
// its policy and family, as EndpointsForFrontend; but when the policy is
// Local and no local endpoint of the family exists, the cluster endpoints
// of the family, as kube-proxy's IPVS proxier does (syncEndpoint, PR
// #97081: "allow access from local PODs even if no local endpoints
// exist"; SEMANTICS 3.8 and 3.23). The cluster set is empty when the
// Service does not use it (iTP=Local on a Service not reachable from
// outside), and the virtual server then has no real servers, which the
// kernel answers with ICMP port-unreachable (SEMANTICS 3.9, 3.12).
func realsFor(sp *model.ServicePort, f model.Frontend) []model.Endpoint {
	eps := sp.EndpointsForFrontend(f)
	local := sp.LocalPolicy(f.Kind)
	if len(eps) > 0 || !local {
		return eps
	}
	var out []model.Endpoint
	for _, e := range sp.ClusterEndpoints {
		if e.Addr.Unmap().Is4() == f.Addr.Unmap().Is4() {
			out = append(out, e)
		}
	}
	return out
}

// sortedKeys returns the virtual servers in address order (stable output
// for rules, listings and tests).
func (d *desired) sortedKeys() []vsKey {
	keys := make([]vsKey, 0, len(d.Servers))
	for k := range d.Servers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	return keys
}
