package reconcile

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// nodeState is what the maps hold beyond the Services: node settings and
// the CIDR sets, as last written.
type nodeState struct {
	config       xbpf.NodeConf
	written      bool
	podCIDRs     map[xbpf.LPMKey]bool
	serviceCIDRs map[xbpf.LPMKey]bool
	// ranges holds each LB frontend's source-range keys, by service ID.
	ranges map[uint32]map[xbpf.LPMKey]bool
	// clusterIPs counts the ServicePorts of each ClusterIP.
	clusterIPs map[netip.Addr]int
	writtenIPs map[netip.Addr]bool
	// dirtyIPs are the ClusterIPs whose count changed since the last
	// write: only those are looked at.
	dirtyIPs map[netip.Addr]bool
	// ifSNAT is what xvs_if_snat holds, by interface index.
	ifSNAT map[uint32]xbpf.IfAddrs
	// hostBackends are the backends on this node's own addresses.
	hostBackends map[maps.BackendKey]struct{}
}

func newNodeState() nodeState {
	return nodeState{
		podCIDRs: map[xbpf.LPMKey]bool{}, serviceCIDRs: map[xbpf.LPMKey]bool{},
		ranges: map[uint32]map[xbpf.LPMKey]bool{}, clusterIPs: map[netip.Addr]int{}, writtenIPs: map[netip.Addr]bool{},
		dirtyIPs: map[netip.Addr]bool{}, ifSNAT: map[uint32]xbpf.IfAddrs{}, hostBackends: map[maps.BackendKey]struct{}{},
	}
}

// lpmKey is an LPM key for prefix p under id; prefixlen counts the ID.
func lpmKey(id uint32, p netip.Prefix) xbpf.LPMKey {
	addr, _ := maps.EncodeAddr(p.Addr())
	return xbpf.LPMKey{Prefixlen: uint32(32 + p.Bits()), Id: id, Addr: addr}
}

func familyID(a netip.Addr) uint32 {
	if a.Unmap().Is4() {
		return xbpf.FamilyIPv4
	}
	return xbpf.FamilyIPv6
}

func cidrKeys(ps []netip.Prefix) map[xbpf.LPMKey]bool {
	out := map[xbpf.LPMKey]bool{}
	for _, p := range ps {
		p = p.Masked()
		out[lpmKey(familyID(p.Addr()), p)] = true
	}
	return out
}

// syncNode writes the node settings and the CIDR sets when they changed.
func (d *Datapath) syncNode(st *model.State) error {
	want := xbpf.NodeConf{
		NetnsCookie: d.netnsCookie,
		Ports:       xbpf.PortRanges(d.snatPortMin, d.snatPortMax, d.ephLo, d.ephHi),
	}
	for _, a := range append(slices.Clone(d.masqAddrs), st.Node.Addresses...) {
		a = a.Unmap()
		if a.Is4() && want.SnatAddr4 == [16]byte{} {
			want.SnatAddr4, _ = maps.EncodeAddr(a)
		}
		if a.Is6() && want.SnatAddr6 == [16]byte{} {
			want.SnatAddr6, _ = maps.EncodeAddr(a)
		}
	}
	if st.MasqueradeAll {
		want.Flags |= uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_MASQ_ALL)
	}
	if d.nfMark != 0 {
		want.Flags |= uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_NETFILTER)
		want.MasqMark = d.nfMark
	}
	if len(st.PodCIDRs) > 0 {
		want.Flags |= uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_DETECT_LOCAL)
	}
	if d.fullSync {
		d.node.ifSNAT = map[uint32]xbpf.IfAddrs{}
		if err := clearAll(d.w.ifSNAT); err != nil {
			return err
		}
	}
	if err := d.syncIfSNAT(); err != nil {
		return err
	}
	if d.fullSync {
		// After a restart, what the tries hold is what counts.
		var err error
		if d.node.podCIDRs, err = readKeys(d.w.podCIDRs); err != nil {
			return err
		}
		if d.node.serviceCIDRs, err = readKeys(d.w.serviceCIDRs); err != nil {
			return err
		}
	}
	// The CIDR sets first: the detector flag must not point at an
	// empty trie.
	if err := syncKeySet(d.w.podCIDRs, d.node.podCIDRs, cidrKeys(st.PodCIDRs)); err != nil {
		return err
	}
	d.node.podCIDRs = cidrKeys(st.PodCIDRs)
	if err := syncKeySet(d.w.serviceCIDRs, d.node.serviceCIDRs, cidrKeys(st.ServiceCIDRs)); err != nil {
		return err
	}
	d.node.serviceCIDRs = cidrKeys(st.ServiceCIDRs)
	return d.writeNodeConfig(want)
}

// writeNodeConfig writes the node settings (with the host-backend flag as
// the backends have it) when they changed.
func (d *Datapath) writeNodeConfig(want xbpf.NodeConf) error {
	host := uint32(xbpf.XvsXvsConfigFlagsXVS_CFG_HOST_BACKENDS)
	want.Flags &^= host
	if len(d.node.hostBackends) > 0 {
		want.Flags |= host
	}
	if d.node.written && d.node.config == want && !d.fullSync {
		return nil
	}
	if err := d.w.nodeConfig.put([]uint32{0}, []xbpf.NodeConf{want}); err != nil {
		return fmt.Errorf("write node config: %w", err)
	}
	d.node.config, d.node.written = want, true
	return nil
}

// syncKeySet makes an LPM map hold exactly want, given what it held.
func syncKeySet(m kvMap[xbpf.LPMKey, uint32], have, want map[xbpf.LPMKey]bool) error {
	var add, del []xbpf.LPMKey
	for k := range want {
		if !have[k] {
			add = append(add, k)
		}
	}
	for k := range have {
		if !want[k] {
			del = append(del, k)
		}
	}
	ones := make([]uint32, len(add))
	for i := range ones {
		ones[i] = 1
	}
	if err := m.put(add, ones); err != nil {
		return err
	}
	return m.del(del)
}

func readKeys(m kvMap[xbpf.LPMKey, uint32]) (map[xbpf.LPMKey]bool, error) {
	out := map[xbpf.LPMKey]bool{}
	if err := m.each(func(k *xbpf.LPMKey, _ *uint32) { out[*k] = true }); err != nil {
		return nil, err
	}
	return out, nil
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

// sourceRangeKeys are the keys of an LB frontend's loadBalancerSourceRanges:
// the ranges of its family and, when one of them holds a node address, the
// Service's own LB IPs (the node reaching its LB IP may pick that IP as
// source, SEMANTICS 3.6).
func sourceRangeKeys(svcID uint32, sp *model.ServicePort, f model.Frontend, node []netip.Addr) map[xbpf.LPMKey]bool {
	ranges := sp.SourceRangesFor(f.Addr)
	out := map[xbpf.LPMKey]bool{}
	holdsNode := false
	for _, p := range ranges {
		out[lpmKey(svcID, p.Masked())] = true
		for _, a := range node {
			holdsNode = holdsNode || p.Contains(a)
		}
	}
	if holdsNode {
		for _, lb := range sp.Frontends {
			if lb.Kind == model.LoadBalancer && lb.Addr.Is4() == f.Addr.Is4() {
				out[lpmKey(svcID, netip.PrefixFrom(lb.Addr, lb.Addr.BitLen()))] = true
			}
		}
	}
	return out
}

// planRanges records the wanted source ranges of one frontend.
func (d *Datapath) planRanges(svcID uint32, want map[xbpf.LPMKey]bool, ws *writeSet) {
	have := d.node.ranges[svcID]
	for k := range want {
		if !have[k] {
			ws.addRanges = append(ws.addRanges, k)
		}
	}
	for k := range have {
		if !want[k] {
			ws.delRanges = append(ws.delRanges, k)
		}
	}
	if len(want) == 0 {
		delete(d.node.ranges, svcID)
	} else {
		d.node.ranges[svcID] = want
	}
}

// countRanges is how many entries the source-ranges map holds: read from
// the map when what it holds is not known exactly (a full sync: the first
// one keeps a previous agent's entries until its sweep), else what the
// frontends hold.
func (d *Datapath) countRanges() (int, error) {
	n := 0
	if d.fullSync {
		err := d.w.sourceRanges.each(func(*xbpf.LPMKey, *uint32) { n++ })
		if err != nil {
			return 0, fmt.Errorf("read source ranges: %w", err)
		}
		return n, nil
	}
	for _, r := range d.node.ranges {
		n += len(r)
	}
	return n, nil
}

// recoverRanges takes the pinned source ranges of the recovered frontends
// as theirs, so that replanning one writes only what it lacks; entries of
// other IDs are left for the first sync's sweep.
func (d *Datapath) recoverRanges() error {
	ids := make(map[uint32]bool, len(d.recovered))
	for fk := range d.recovered {
		if id, ok := d.svcIDs.lookup(fk); ok {
			ids[id] = true
		}
	}
	return d.w.sourceRanges.each(func(lk *xbpf.LPMKey, _ *uint32) {
		if !ids[lk.Id] {
			return
		}
		if d.node.ranges[lk.Id] == nil {
			d.node.ranges[lk.Id] = map[xbpf.LPMKey]bool{}
		}
		d.node.ranges[lk.Id][*lk] = true
	})
}

// syncClusterIPs writes the set of ClusterIPs (wrong-port REJECT).
func (d *Datapath) syncClusterIPs() error {
	one := uint32(1)
	var add, del []xbpf.VIPKey
	var addVals []uint32
	for a := range d.node.dirtyIPs {
		switch n := d.node.clusterIPs[a]; {
		case n > 0 && !d.node.writtenIPs[a]:
			add = append(add, vipKey(a))
			addVals = append(addVals, one)
			d.node.writtenIPs[a] = true
		case n <= 0:
			if d.node.writtenIPs[a] {
				del = append(del, vipKey(a))
			}
			delete(d.node.writtenIPs, a)
			delete(d.node.clusterIPs, a)
		}
	}
	d.node.dirtyIPs = map[netip.Addr]bool{} // not clear: see d.unreferenced
	if err := d.w.clusterIPs.put(add, addVals); err != nil {
		return err
	}
	return d.w.clusterIPs.del(del)
}

func vipKey(a netip.Addr) xbpf.VIPKey {
	addr, fam := maps.EncodeAddr(a)
	return xbpf.VIPKey{Addr: addr, Family: fam}
}

// sweepNodeState removes ClusterIPs and source ranges no frontend wants
// (left by a previous agent).
func (d *Datapath) sweepNodeState(ws *writeSet) error {
	var stale []xbpf.VIPKey
	// What the map holds is what counts: rewrite every ClusterIP that is
	// wanted and missing.
	clear(d.node.writtenIPs)
	for a := range d.node.clusterIPs {
		d.node.dirtyIPs[a] = true
	}
	err := d.w.clusterIPs.each(func(vk *xbpf.VIPKey, _ *uint32) {
		a := maps.DecodeAddr(vk.Addr, vk.Family)
		if d.node.clusterIPs[a] <= 0 {
			stale = append(stale, *vk)
		} else {
			d.node.writtenIPs[a] = true
		}
	})
	if err != nil {
		return fmt.Errorf("read cluster IPs: %w", err)
	}
	if err := d.w.clusterIPs.del(stale); err != nil {
		return err
	}
	return d.w.sourceRanges.each(func(lk *xbpf.LPMKey, _ *uint32) {
		if !d.node.ranges[lk.Id][*lk] && !slices.Contains(ws.delRanges, *lk) {
			ws.delRanges = append(ws.delRanges, *lk)
		}
	})
}

// netnsCookie is the cookie of the calling thread's network namespace
// (SO_NETNS_COOKIE, Linux 5.14+), which scopes the socket-level load
// balancer to the agent's namespace; 0 (socket LB off) where unknown.
func netnsCookie() uint64 {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0
	}
	return c
}
