/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Types shared by the BPF programs and Go (through bpf2go -type): this file
 * is the single boundary between C and Go. Every layout keeps room for IPv6
 * (addresses are 16 bytes; IPv4 uses the first four and zeroes the rest), so
 * adding IPv6 never needs a map migration. */
#ifndef XVS_TYPES_H
#define XVS_TYPES_H

#include <linux/types.h>

/* A BPF subprogram: verified once, with its own stack frame. */
#ifndef __noinline
#define __noinline __attribute__((noinline))
#endif

enum xvs_family {
	XVS_FAMILY_IPV4 = 4,
	XVS_FAMILY_IPV6 = 6,
};

/* The scope of a service key: which endpoint set its slots hold. */
enum xvs_scope {
	/* The set the traffic policy selects (cluster or local). */
	XVS_SCOPE_POLICY = 0,
	/* The cluster set of an eTP=Local frontend, used by pod and host
	 * sources that kube-proxy short-circuits to all endpoints. */
	XVS_SCOPE_SHORT_CIRCUIT = 1,
};

/* Service map key, Cilium's slot model: slot 0 is the service entry itself
 * (count, flags), slots 1..count point at backend IDs. */
struct xvs_svc_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 family;
	__u16 slot;
	__u8 scope;
	__u8 pad;
};

enum xvs_svc_flags {
	/* Some ready or serving-terminating endpoint exists anywhere: an empty
	 * slot set then means DROP (policy filtered everything), else REJECT. */
	XVS_SVC_F_HAS_ENDPOINTS = 1 << 0,
	/* The slot set holds local endpoints only (eTP or iTP Local). */
	XVS_SVC_F_LOCAL = 1 << 1,
	/* sessionAffinity: ClientIP. */
	XVS_SVC_F_AFFINITY = 1 << 2,
	/* loadBalancerSourceRanges apply (LB frontends only). */
	XVS_SVC_F_SOURCE_RANGES = 1 << 3,
	/* A short-circuit slot set (scope 1) exists for pod and host sources. */
	XVS_SVC_F_SHORT_CIRCUIT = 1 << 4,
};

enum xvs_kind {
	XVS_KIND_CLUSTER_IP = 1,
	XVS_KIND_NODE_PORT = 2,
	XVS_KIND_EXTERNAL_IP = 3,
	XVS_KIND_LOAD_BALANCER = 4,
};

enum xvs_sched {
	XVS_SCHED_RANDOM = 0,
	XVS_SCHED_RR = 1,
	XVS_SCHED_WRR = 2,
	XVS_SCHED_LC = 3,
	XVS_SCHED_WLC = 4,
	XVS_SCHED_SED = 5,
	XVS_SCHED_NQ = 6,
	XVS_SCHED_SH = 7,
	XVS_SCHED_DH = 8,
	XVS_SCHED_MH = 9,
};

struct xvs_svc_value {
	/* Slots 1..N: the backend this slot points at. */
	__u32 backend_id;
	/* Every slot: the frontend's stable ID (counters, listing). */
	__u32 svc_id;
	/* Slot 0: the ServicePort's ID, shared by all its frontends, so that
	 * session affinity spans ClusterIP, NodePort and LB addresses. */
	__u32 group_id;
	/* Slot 0: sessionAffinityConfig.clientIP.timeoutSeconds. */
	__u32 affinity_timeout;
	/* Slot 0: entries of the scheduler table (wrr sequence, Maglev
	 * lookup table) in xvs_sched_tables, 0 when the scheduler has none. */
	__u32 table_size;
	/* Slot 0: number of backend slots. */
	__u16 count;
	/* Slot 0: enum xvs_svc_flags. */
	__u16 flags;
	/* Slot 0: enum xvs_sched. */
	__u8 sched;
	/* Slot 0: enum xvs_kind. */
	__u8 kind;
	__u8 pad[2];
};

enum xvs_backend_flags {
	XVS_BACKEND_F_LOCAL = 1 << 0,
	/* The address is one of this node's own (a hostNetwork endpoint
	 * here): flows to it are delivered locally. */
	XVS_BACKEND_F_HOST = 1 << 1,
};

struct xvs_backend {
	__u8 addr[16];
	__be16 port;
	__u8 family;
	__u8 flags;
	__u16 weight;
	__u8 proto;
	__u8 pad;
};

/* Conntrack: two keys per flow, one state. The forward entry (keyed by
 * client -> frontend as the client sends it) holds the flow: where to DNAT
 * and masquerade, its TCP state and its expiry. The reply entry (keyed by
 * backend -> client, or -> masquerade address, as the backend answers)
 * holds what to restore, which is exactly the forward entry's key: a reply
 * finds the flow's state through it, so both directions share one state
 * machine and one expiry, and a reply entry is only ever used while its
 * flow is alive and points back at it. */
struct xvs_ct_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

enum xvs_ct_flags {
	/* A reply entry: rewrite the source back to the frontend. */
	XVS_CT_F_REPLY = 1 << 0,
	/* A FIN was seen from the client (forward direction). */
	XVS_CT_F_FIN_ORIG = 1 << 1,
	/* A packet was seen in the reply direction. */
	XVS_CT_F_SEEN_REPLY = 1 << 2,
	/* The flow came in as a TCP SYN. */
	XVS_CT_F_SYN = 1 << 3,
	/* The connection is already in the service and backend "conns"
	 * counters (set by the first flush of the forward entry). */
	XVS_CT_F_COUNTED = 1 << 4,
	/* Source NAT applies: forward packets leave from snat_addr:snat_port,
	 * replies are sent back to snat_addr:snat_port (the client). */
	XVS_CT_F_SNAT = 1 << 5,
	/* The flow counts as one of its backend's active connections
	 * (least-connection schedulers) until it closes... */
	XVS_CT_F_HELD = 1 << 6,
	/* ...and then as an inactive one until its entry goes, as IPVS counts
	 * connections in FIN_WAIT/TIME_WAIT. */
	XVS_CT_F_INACTIVE = 1 << 7,
	/* A FIN was seen from the backend (reply direction). */
	XVS_CT_F_FIN_REPLY = 1 << 8,
	/* The backend is on this node's own address (a hostNetwork pod): the
	 * translated packet is delivered locally, and its replies, which
	 * leave by a device's egress, are reverse-NATed there. */
	XVS_CT_F_HOST = 1 << 9,
	/* Both sides sent a FIN, the backend last (which side's ACK ends the
	 * connection). */
	XVS_CT_F_LAST_FIN_REPLY = 1 << 10,
	/* The flow passes the node's netfilter hooks (netfilter mode): its
	 * forward packets go to the stack once translated, to be routed,
	 * filtered and (with NF_MASQ) masqueraded there, and its replies
	 * pass ingress untouched and are reverse-NATed at the egress of the
	 * device they leave by, after netfilter has seen them. */
	XVS_CT_F_NETFILTER = 1 << 11,
	/* netfilter masquerades the flow: its forward packets carry the
	 * masquerade mark (xvs_config.masq_mark) into POSTROUTING. */
	XVS_CT_F_NF_MASQ = 1 << 12,
	/* (Reply entry) the flow's source port was remapped, its address
	 * kept: another live flow of the client's tuple already held the
	 * reply tuple (a port reused towards another frontend of the same
	 * backend). */
	XVS_CT_F_CLASH = 1 << 13,
};

/* Slots of xvs_ct_tables: the conntrack tables in use, and while the agent
 * resizes them, the old ones they are copied from (slot + XVS_CT_OLD). */
enum xvs_ct_slot {
	XVS_CT_TABLE_ESTABLISHED = 0,
	XVS_CT_TABLE_UNREPLIED = 1,
	XVS_CT_OLD = 2,
	XVS_CT_SLOTS = 4,
};

/* TCP connection states, as netfilter names them (conntrack -L); UDP and
 * SCTP flows stay in XVS_CT_NONE and use the unreplied/stream timeouts. */
enum xvs_ct_state {
	XVS_CT_NONE = 0,
	XVS_CT_SYN_SENT = 1,
	XVS_CT_SYN_RECV = 2,
	XVS_CT_ESTABLISHED = 3,
	XVS_CT_FIN_WAIT = 4,
	XVS_CT_CLOSE_WAIT = 5,
	XVS_CT_LAST_ACK = 6,
	XVS_CT_TIME_WAIT = 7,
	XVS_CT_CLOSE = 8,
};

struct xvs_ct_entry {
	/* Forward entry: CLOCK_MONOTONIC ns after which the flow is dead.
	 * Reply entry: unused (the flow's expiry is the forward entry's). */
	__u64 expires;
	/* The backend chosen for the flow, for counters and schedulers. The
	 * address is also kept below: an endpoint removed from the Service
	 * keeps its established TCP flows until they close, as with netfilter
	 * conntrack. */
	__u32 backend_id;
	__u32 svc_id;
	/* Forward: the backend address; reply: the frontend address. */
	__u8 nat_addr[16];
	/* Forward, with XVS_CT_F_SNAT: the masquerade source. Reply: the
	 * client, to restore as destination (always set). */
	__u8 snat_addr[16];
	__be16 nat_port;
	__be16 snat_port;
	/* enum xvs_ct_flags. */
	__u16 flags;
	/* Forward: enum xvs_ct_state. */
	__u8 state;
	__u8 pad;
	/* Packets and bytes of this direction not yet added to the per-CPU
	 * service and backend counters: they are flushed in batches (see
	 * ct.h), so a packet of an established flow touches only its own
	 * conntrack entries. `xvs list --stats` adds what is still pending. */
	__u32 packets;
	__u32 bytes;
};

enum xvs_config_flags {
	/* masqueradeAll: every Service connection is masqueraded. */
	XVS_CFG_MASQ_ALL = 1 << 0,
	/* A local-traffic detector is configured (clusterCIDR): sources in
	 * xvs_pod_cidrs are pods, any other source is off-cluster. */
	XVS_CFG_DETECT_LOCAL = 1 << 1,
	/* Some backend is on this node's own address: the tc egress program
	 * reverse-NATs the replies of such flows (otherwise it returns at
	 * once). */
	XVS_CFG_HOST_BACKENDS = 1 << 2,
	/* Netfilter mode: new flows pass the node's netfilter hooks with
	 * their translated addresses (XVS_CT_F_NETFILTER) instead of being
	 * redirected past them. */
	XVS_CFG_NETFILTER = 1 << 3,
	/* Draining (xvs cleanup --drain): the flows xvs has go on, new ones
	 * are left untouched, for the node's netfilter rules (kube-proxy's,
	 * on the way back to it) to serve. */
	XVS_CFG_DRAIN = 1 << 4,
};

/* Source ports a new flow may take: span ports from min, stepping over
 * skip_len ports from skip_min (the node's ephemeral range,
 * net.ipv4.ip_local_port_range, where local sockets pick theirs; 0 skips
 * nothing). The agent computes span; 0 leaves no port to take. */
struct xvs_port_range {
	__u16 min;
	__u16 span;
	__u16 skip_min;
	__u16 skip_len;
};

enum xvs_port_ranges {
	/* Masquerade: ports of the node's address. */
	XVS_PORTS_MASQ = 0,
	/* Clash remaps (XVS_CT_F_CLASH), the client's address kept:
	 * netfilter's range for a source manip without one of its own,
	 * 1024-65535. */
	XVS_PORTS_CLASH = 1,
	XVS_PORTS_N,
};

/* Node-wide settings the agent writes to xvs_node_config[0]. */
struct xvs_config {
	/* The address masqueraded connections leave from (the node's
	 * primary address per family). */
	__u8 snat_addr4[16];
	__u8 snat_addr6[16];
	/* enum xvs_config_flags. */
	__u32 flags;
	/* Netfilter mode: the packet mark bit the node's POSTROUTING
	 * masquerades by (kube-proxy's 0x4000). */
	__u32 masq_mark;
	/* enum xvs_port_ranges. */
	struct xvs_port_range ports[XVS_PORTS_N];
	/* The agent's network namespace: the socket-level load balancer
	 * only serves processes of the node itself (pods have their own
	 * namespaces and go through tc). */
	__u64 netns_cookie;
};

/* The masquerade address of an egress interface (by ifindex), as
 * MASQUERADE picks it: the interface's first primary address of each
 * family. A missing entry or family falls back to xvs_config's. */
struct xvs_if_addrs {
	__u8 addr4[16];
	__u8 addr6[16];
};

/* Socket-level load balancing (host processes): per socket, the backend
 * chosen for a frontend, and the frontend to show for a backend. */
struct xvs_sock_key {
	__u64 cookie;
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad[5];
};

struct xvs_sock_value {
	__u8 addr[16];
	__be16 port;
	__u8 pad[6];
};

/* LPM key: an ID (family for node-wide CIDR sets, the service ID for
 * source ranges) and an address; prefixlen counts the 32 ID bits too. */
struct xvs_lpm_key {
	__u32 prefixlen;
	__u32 id;
	__u8 addr[16];
};

/* A ClusterIP (any port): traffic to it on a port that is not a Service
 * port is rejected. */
struct xvs_vip_key {
	__u8 addr[16];
	__u8 family;
	__u8 pad[3];
};

/* Connections of a backend as the least-connection schedulers count them
 * (IPVS's activeconns and inactconns). */
struct xvs_conn_counts {
	__u32 active;
	__u32 inactive;
};

/* Key of a scheduler table: one per (frontend, scope). */
struct xvs_sched_key {
	__u32 svc_id;
	__u8 scope;
	__u8 pad[3];
};

/* Session affinity: the backend a client was last sent to, per ServicePort
 * (group), shared by all frontends of the port. */
struct xvs_affinity_key {
	__u32 group_id;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct xvs_affinity_value {
	/* CLOCK_MONOTONIC ns of the last new connection. */
	__u64 last_used;
	__u32 backend_id;
	__u32 pad;
};

/* Membership of a backend in a frontend's slot set (affinity services
 * only): lets a sticky choice be checked against the current endpoints. */
struct xvs_member_key {
	__u32 svc_id;
	__u32 backend_id;
	__u8 scope;
	__u8 pad[3];
};

/* Tracks IPv4 fragments: the first fragment records its ports so later
 * fragments (which carry no L4 header) follow the same flow. */
struct xvs_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

/* The same for IPv6 fragments (RFC 8200 4.5: the Fragment header's
 * identification, per source and destination). */
struct xvs_frag6_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 id;
	__u8 proto;
	__u8 pad[3];
};

struct xvs_frag_ports {
	__be16 sport;
	__be16 dport;
};

/* IPVS-style statistics, per CPU: `xvs list --stats` sums them. */
struct xvs_stats {
	__u64 conns;
	__u64 packets_in;
	__u64 packets_out;
	__u64 bytes_in;
	__u64 bytes_out;
};

/* Why a packet got the verdict it got; indexes the per-CPU verdict counters. */
enum xvs_verdict {
	XVS_V_PASS = 0,		   /* not service traffic: untouched */
	XVS_V_FWD_NEW,		   /* new flow: backend chosen, DNAT */
	XVS_V_FWD_ESTABLISHED,	   /* conntrack hit: DNAT */
	XVS_V_REPLY,		   /* reply: reverse NAT */
	XVS_V_PASS_MALFORMED,	   /* truncated or malformed: untouched */
	XVS_V_PASS_FRAGMENT,	   /* fragment of an unknown flow: untouched */
	XVS_V_DROP_NO_LOCAL,	   /* endpoints exist, policy set empty */
	XVS_V_REJECT_NO_ENDPOINTS, /* no usable endpoint anywhere */
	XVS_V_DROP_NO_BACKEND,	   /* slot points at a missing backend */
	XVS_V_DROP_INVALID,	   /* TCP RST/out-of-state without conntrack */
	XVS_V_DROP_REWRITE,	   /* a packet rewrite helper failed */
	XVS_V_DROP_REJECT_FAILED,  /* could not build the reject reply */
	XVS_V_DROP_SOURCE_RANGE,   /* LB IP: source outside loadBalancerSourceRanges */
	XVS_V_REJECT_WRONG_PORT,   /* a live ClusterIP, but no such port/protocol */
	XVS_V_DROP_UNALLOCATED,	   /* an unallocated address in a service CIDR */
	XVS_V_DROP_SNAT_EXHAUSTED, /* no free masquerade port for the backend */
	XVS_V_FWD_XDP,		   /* NATed by the XDP program; forwarded by tc */
	XVS_V_SOCK_CONNECT,	   /* a host socket connected to a backend */
	XVS_V_SOCK_REFUSED,	   /* a host socket refused (no endpoints) */
	XVS_V_SOCK_DROPPED,	   /* a host socket failed as DROP would */
	XVS_V_REPLY_HOST,	   /* reply of a host-network endpoint: reverse NAT at egress */
	XVS_V_PASS_FRAG_NEEDED,	   /* too big for the egress MTU, may fragment: the stack's */
	XVS_V_REJECT_FRAG_NEEDED,  /* too big for the egress MTU: ICMP frag-needed sent */
	XVS_V_REPLY_ICMP,	   /* an ICMP error about a flow, translated for its client */
	XVS_V_PASS_DRAINING,	   /* a new flow while xvs drains: left to the node's netfilter */
	XVS_V_FWD_ICMP,		   /* an ICMP error about a reply, translated for its backend */
	XVS_V_PASS_VLAN,	   /* tagged for a VLAN: its VLAN device's program decides */
	XVS_V_MAX,
};

/* The verdicts `xvs monitor` reports, one bit each: a packet dropped or
 * refused by the datapath (lib/monitor.h). */
#define XVS_V_MONITORED                                                                                      \
	((1u << XVS_V_DROP_NO_LOCAL) | (1u << XVS_V_REJECT_NO_ENDPOINTS) | (1u << XVS_V_DROP_NO_BACKEND) |   \
	 (1u << XVS_V_DROP_INVALID) | (1u << XVS_V_DROP_REWRITE) | (1u << XVS_V_DROP_REJECT_FAILED) |        \
	 (1u << XVS_V_DROP_SOURCE_RANGE) | (1u << XVS_V_REJECT_WRONG_PORT) |                                 \
	 (1u << XVS_V_DROP_UNALLOCATED) | (1u << XVS_V_DROP_SNAT_EXHAUSTED) |                                \
	 (1u << XVS_V_REJECT_FRAG_NEEDED) | (1u << XVS_V_SOCK_REFUSED) | (1u << XVS_V_SOCK_DROPPED))

/* Where an event was raised. */
enum xvs_hook {
	XVS_HOOK_TC = 1, /* tc ingress or egress */
	XVS_HOOK_XDP,
	XVS_HOOK_SOCK, /* a host socket's connect() or sendmsg() */
};

/* One drop or reject, as `xvs monitor` reads it from the xvs_events ring:
 * the packet as it arrived (before any translation). */
struct xvs_event {
	__u64 ts; /* CLOCK_MONOTONIC, ns */
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 ifindex;
	__u32 verdict;
	__u32 len;
	__u8 proto;
	__u8 family;
	__u8 hook;
	__u8 tcp_flags;
};

/* The monitor's switch and rate, set by `xvs monitor`: events are written
 * only while enabled, at most rate a second per CPU with bursts of burst. */
struct xvs_monitor_settings {
	__u32 enabled;
	__u32 rate;
	__u32 burst;
	__u32 pad;
	/* What the program uses, derived by the monitor: the ns between
	 * events at the rate (1e9 / rate), and how far ahead of the clock the
	 * schedule may run (cost * (burst - 1)). */
	__u64 cost;
	__u64 ahead;
};

/* Per CPU: the rate limiter and what it and the ring turned away. */
struct xvs_monitor_bucket {
	__u64 next;	  /* when the next event is due at the rate (GCRA) */
	__u64 suppressed; /* events over the rate */
	__u64 lost;	  /* events the full ring had no room for */
};

#endif
