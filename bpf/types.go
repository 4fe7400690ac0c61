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
)

const (
	FamilyIPv4 = 4
	FamilyIPv6 = 6
)
