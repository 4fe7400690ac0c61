package bpf

// Short names for the generated types; the layouts come from xvs.c's BTF
// through bpf2go and are never written by hand.
type (
	SvcKey    = XvsXvsSvcKey
	SvcValue  = XvsXvsSvcValue
	Backend   = XvsXvsBackend
	CtKey     = XvsXvsCtKey
	CtEntry   = XvsXvsCtEntry
	Stats     = XvsXvsStats
	Verdict   = XvsXvsVerdict
	Kind      = XvsXvsKind
	Sched     = XvsXvsSched
	SvcFlags  = XvsXvsSvcFlags
	CtFlags   = XvsXvsCtFlags
	Scope     = XvsXvsScope
	FragKey   = XvsXvsFragKey
	FragPorts = XvsXvsFragPorts
	SchedKey  = XvsXvsSchedKey
	MemberKey = XvsXvsMemberKey
	AffKey    = XvsXvsAffinityKey
	AffValue  = XvsXvsAffinityValue
	NodeConf  = XvsXvsConfig
	LPMKey    = XvsXvsLpmKey
	VIPKey    = XvsXvsVipKey
	Conns     = XvsXvsConnCounts
	CtState   = XvsXvsCtState
	IfAddrs   = XvsXvsIfAddrs
	PortRange = XvsXvsPortRange
	Event     = XvsXvsEvent
	Hook      = XvsXvsHook
	// MonitorSettings and MonitorBucket are the drop monitor's switch and
	// per-CPU rate limiter (lib/monitor.h).
	MonitorSettings = XvsXvsMonitorSettings
	MonitorBucket   = XvsXvsMonitorBucket
)

const (
	FamilyIPv4 = 4
	FamilyIPv6 = 6
)

// The source ports of a clash remap (enum xvs_port_ranges' XVS_PORTS_CLASH):
// a flow whose reply tuple a live flow of another frontend already holds
// (a client port reused towards two Services of one backend) keeps its
// client's address and gets another port, as netfilter resolves the clash,
// from netfilter's range for a source manip without its own. (The
// masquerade range is for the node's address; in netfilter mode it is
// 32768-65535, which leaves 4,536 ports once the ephemeral range is out.)
const (
	ClashPortMin = 1024
	ClashPortMax = 65535
)

// NewPortRange is lo-hi for the datapath (snat_port_at): its size once the
// skip skipLo-skipHi (0-0: none; the node's ephemeral range), clipped to
// it, is stepped over. A skip that would leave nothing skips nothing (the
// operator asked for exactly those ports; the datapath still asks the
// socket tables).
func NewPortRange(lo, hi, skipLo, skipHi uint16) PortRange {
	if lo == 0 || hi < lo {
		return PortRange{}
	}
	r := PortRange{Min: lo, Span: uint16(uint32(hi) - uint32(lo) + 1)}
	if skipLo, skipHi = max(skipLo, lo), min(skipHi, hi); skipLo == 0 || skipHi < skipLo || (skipLo == lo && skipHi == hi) {
		return r
	}
	r.SkipMin, r.SkipLen = skipLo, skipHi-skipLo+1
	r.Span -= r.SkipLen
	return r
}

// PortRanges is xvs_config.ports: the masquerade range min-max and the
// clash range, each with the node's ephemeral range ephLo-ephHi stepped
// over.
func PortRanges(min, max, ephLo, ephHi uint16) [2]PortRange {
	return [2]PortRange{
		XvsXvsPortRangesXVS_PORTS_MASQ:  NewPortRange(min, max, ephLo, ephHi),
		XvsXvsPortRangesXVS_PORTS_CLASH: NewPortRange(ClashPortMin, ClashPortMax, ephLo, ephHi),
	}
}
