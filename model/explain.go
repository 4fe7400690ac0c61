package model

import "net/netip"

// What a datapath does with one packet, and why (`xvs explain`): the ebpf
// datapath answers with its own program (maps.Explainer), the IPVS one
// from the kernel's virtual servers, connections and xvs's rules
// (ipvs.Explain).

// ExplainPacket is the packet to explain: a TCP SYN (or, with Established,
// an ACK) or a UDP or SCTP datagram from From to To; or, with FromHost, a
// socket of the node itself connecting (or sending) to To.
type ExplainPacket struct {
	From, To    netip.AddrPort
	Proto       Protocol
	Established bool
	// FromHost: a socket of the node's own network namespace. In ebpf
	// mode the socket hooks balance its connect() or sendmsg() before any
	// packet exists, and From is not used (the node's address stands in);
	// in ipvs mode IPVS takes its packets at LOCAL_OUT, from the address
	// the socket is bound to (From's, when valid) or else the one routing
	// gives it.
	FromHost bool
	// Ifindex is the interface the packet arrives on (0: none; routes are
	// then looked up as for a packet of no interface).
	Ifindex uint32
}

// Explanation is a datapath's answer.
type Explanation struct {
	// Verdict is the datapath's verdict (ebpf: maps.VerdictName; ipvs:
	// the same names where the outcome is the same), Why the verdict in
	// words, Action what the datapath does: "translate", "drop",
	// "reject" or "pass".
	Verdict string `json:"verdict"`
	Action  string `json:"action"`
	Why     string `json:"why,omitempty"`
	// Tracked: the packet belongs to a flow conntrack (IPVS: an IPVS
	// connection) already has.
	Tracked bool `json:"tracked"`
	// Frontend is the frontend the packet matched (none: not a
	// Service's), Scope "policy" or "short-circuit" (an in-cluster client
	// of an externalTrafficPolicy: Local frontend).
	Frontend string `json:"frontend,omitempty"`
	Scope    string `json:"scope,omitempty"`
	// Backend is where a translated packet goes, and BackendID its ID
	// (ebpf). A new connection of an IPVS virtual server has no Backend
	// until the kernel's scheduler (Scheduler) picks one of Candidates.
	Backend    netip.AddrPort   `json:"backend,omitzero"`
	BackendID  uint32           `json:"backendID,omitempty"`
	Scheduler  string           `json:"scheduler,omitempty"`
	Candidates []netip.AddrPort `json:"candidates,omitempty"`
	// Source is the translated packet's source; Masquerade says who
	// masquerades it: "" (nobody), "xvs" (Source is the masquerade
	// address), "netfilter" (the node's POSTROUTING rule, by mark), or
	// "remap" (a port clash: the client's address with another port).
	Source     netip.AddrPort `json:"source,omitzero"`
	Masquerade string         `json:"masquerade,omitempty"`
	// LocalDelivery: the backend is this node's own address.
	LocalDelivery bool `json:"localDelivery,omitempty"`
	// Host: a socket of the node (ExplainPacket.FromHost); Cause is then
	// the admission's verdict behind a refusal or a drop (ebpf).
	Host  bool   `json:"host,omitempty"`
	Cause string `json:"cause,omitempty"`
}
