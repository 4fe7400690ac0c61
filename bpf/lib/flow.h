/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The load-balancing decision, shared by the tc and XDP programs: from a
 * parsed packet to an action and the rewrite it needs. Conntrack, backend
 * choice, masquerade port allocation and counters all happen here; the
 * programs only apply the result to their own kind of packet. */
#ifndef XVS_FLOW_H
#define XVS_FLOW_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "affinity.h"
#include "ct.h"
#include "flags.h"
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "snat.h"
#include "stats.h"
#include "types.h"

enum xvs_action {
	XVS_ACT_PASS = 0, /* leave the packet alone */
	XVS_ACT_DROP,
	XVS_ACT_REJECT,	 /* answer with TCP RST / ICMP port unreachable */
	XVS_ACT_NAT,	 /* rewrite to xvs_rewrite and forward */
	XVS_ACT_NEW,	 /* (internal) no live flow: a new one may start */
	XVS_ACT_PROMOTE, /* (internal) the first reply of an unreplied flow */
};

/* The addresses and ports a packet leaves with (16-byte addresses, as
 * in xvs_pkt). */
struct xvs_rewrite {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
};

/* A decision in progress: inputs (len, now) and results (rw, verdict).
 * Passed by pointer so that the large steps can be BPF subprograms, each
 * with its own stack frame. */
struct flow_res {
	struct xvs_rewrite rw;
	/* The frontend's service key, as the lookup (and the scheduler)
	 * uses it. */
	struct xvs_svc_key key;
	__u64 now;
	__u32 len;
	__u32 verdict;
	/* The flow's XVS_CT_F_NETFILTER and XVS_CT_F_NF_MASQ: how a
	 * translated packet is handed on (see tc_forward). */
	__u32 nf_flags;
};

#define XVS_CT_F_NF_MASK (XVS_CT_F_NETFILTER | XVS_CT_F_NF_MASQ)

/* Per-CPU scratch space for the packet path: the parsed packet, the
 * decision and the conntrack entry being built live here rather than on the
 * 512-byte BPF stack. tc and XDP run in softirq context and never nest on
 * one CPU; the socket hooks do not use it. */
struct flow_scratch {
	struct xvs_pkt pkt;
	struct flow_res res;
	struct xvs_ct_entry entry;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_scratch);
	__uint(max_entries, 1);
} xvs_scratch SEC(".maps");

/* This CPU's scratch space as it is. NULL never happens with a 1-entry
 * array. */
static __always_inline struct flow_scratch *flow_scratch_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&xvs_scratch, &zero);
}

/* The scratch space with the packet and the decision zeroed, at a
 * program's start (parsing relies on zero-padded addresses); flow_new
 * clears the entry itself, and only when it builds one. */
static __always_inline struct flow_scratch *flow_scratch(void)
{
	struct flow_scratch *sc = flow_scratch_get();

	if (sc) {
		__builtin_memset(&sc->pkt, 0, sizeof(sc->pkt));
		__builtin_memset(&sc->res, 0, sizeof(sc->res));
	}
	return sc;
}

/* Build-time test hook for the conformance "break it" checks: with this
 * knob cleared the reverse NAT is skipped. Always 1 in production. */
volatile const __u8 cfg_rev_nat = 1;

/* Is addr (of family) inside a prefix stored under id in an LPM map? */
static __always_inline bool lpm_match(void *map, __u32 id, const __u8 addr[16], __u8 family)
{
	struct xvs_lpm_key k = {.prefixlen = family == XVS_FAMILY_IPV4 ? 64 : 160, .id = id};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(map, &k) != NULL;
}

/* A packet of a tracked flow in the forward direction. */
static __always_inline void flow_forward_rewrite(const struct xvs_pkt *p, const struct xvs_ct_entry *e,
						 struct xvs_rewrite *rw)
{
	__builtin_memcpy(rw->daddr, e->nat_addr, 16);
	rw->dport = e->nat_port;
	if (ct_is_snat(e)) {
		__builtin_memcpy(rw->saddr, e->snat_addr, 16);
		rw->sport = e->snat_port;
	} else {
		__builtin_memcpy(rw->saddr, p->saddr, 16);
		rw->sport = p->sport;
	}
}

/* A packet of a tracked flow from its client. */
static __noinline int flow_established(const struct xvs_pkt *p, struct xvs_ct_entry *e, struct flow_res *res)
{
	ct_touch(e, p, false, res->now);
	ct_account(e, res->len, ct_closing(e->state));
	flow_forward_rewrite(p, e, &res->rw);
	res->nf_flags = e->flags & XVS_CT_F_NF_MASK;
	res->verdict = XVS_V_FWD_ESTABLISHED;
	return XVS_ACT_NAT;
}

/* Reply from a backend (rev: its reply entry, fe: the flow): the frontend
 * becomes the source again, and the client the destination. */
static __noinline int flow_reply(const struct xvs_pkt *p, struct xvs_ct_entry *rev, struct xvs_ct_entry *fe,
				 struct flow_res *res)
{
	struct xvs_rewrite *rw = &res->rw;
	bool first = !(fe->flags & XVS_CT_F_SEEN_REPLY);

	ct_touch(fe, p, true, res->now);
	if (first)
		/* The forward entry's first packet and the connection. */
		stats_flush(fe);
	ct_account(rev, res->len, first || ct_closing(fe->state));
	res->verdict = (fe->flags & XVS_CT_F_HOST) ? XVS_V_REPLY_HOST : XVS_V_REPLY;
	if (!cfg_rev_nat)
		return XVS_ACT_PASS;
	__builtin_memcpy(rw->saddr, rev->nat_addr, 16);
	rw->sport = rev->nat_port;
	__builtin_memcpy(rw->daddr, rev->snat_addr, 16);
	rw->dport = rev->snat_port;
	return XVS_ACT_NAT;
}

/* No frontend at daddr:dport. A live ClusterIP on another port is
 * rejected, an unallocated address of a service CIDR dropped; anything
 * else is not ours. */
static __noinline int flow_no_service(const struct xvs_pkt *p, __u32 *verdict)
{
	struct xvs_vip_key vk = {.family = p->family};

	__builtin_memcpy(vk.addr, p->daddr, 16);
	if (bpf_map_lookup_elem(&xvs_cluster_ips, &vk)) {
		*verdict = XVS_V_REJECT_WRONG_PORT;
		return XVS_ACT_REJECT;
	}
	if (lpm_match(&xvs_service_cidrs, p->family, p->daddr, p->family)) {
		*verdict = XVS_V_DROP_UNALLOCATED;
		return XVS_ACT_DROP;
	}
	*verdict = XVS_V_PASS;
	return XVS_ACT_PASS;
}

/* Does kube-proxy masquerade this new connection (SEMANTICS 3.13)? */
static __always_inline bool flow_masquerade(const struct xvs_config *cfg, const struct xvs_svc_value *svc,
					    bool pod, bool hairpin)
{
	if (hairpin || cfg_masquerade_all(cfg))
		return true;
	if (svc->kind == XVS_KIND_CLUSTER_IP)
		/* Off-cluster sources, when a detector says what "local" is. */
		return cfg_detects_local(cfg) && !pod;
	/* External addresses: always with eTP=Cluster; never with eTP=Local
	 * (external clients keep their address, pods short-circuit). */
	return !svc_is_local(svc);
}

/* The backend for a new flow to the frontend at key (svc: its slot 0 of
 * the scope in use): the ClientIP affinity's, else the scheduler's. The
 * one choice every hook makes: tc, XDP and the socket hooks. */
static __noinline struct xvs_backend *flow_choose(const struct xvs_pkt *p, struct xvs_svc_key *key,
						  const struct xvs_svc_value *svc, __u64 now,
						  __u32 *backend_id)
{
	struct xvs_backend *be = NULL;

	if (svc_has_affinity(svc))
		be = affinity_lookup(key, svc, p, now, backend_id);
	if (!be)
		be = lb_select(key, svc, p, backend_id);
	if (be && svc_has_affinity(svc))
		affinity_update(svc, p, *backend_id, now);
	return be;
}

/* The frontend at p's destination (key: its service key, filled in), or
 * NULL when there is none. */
static __always_inline struct xvs_svc_value *flow_frontend(const struct xvs_pkt *p, struct xvs_svc_key *key)
{
	svc_key(key, p->daddr, p->dport, p->proto, p->family, XVS_SCOPE_POLICY);
	return bpf_map_lookup_elem(&xvs_services, key);
}

/* May a new connection to the frontend *svcp (at key) start, and which
 * endpoints does it use? The one admission every hook applies, packets and
 * host sockets alike: the source ranges first, then an in-cluster client
 * (in_cluster: a pod, or the node itself) of an eTP=Local Service is
 * short-circuited to the cluster-wide endpoints (key and *svcp move to
 * that scope), and a Service with nothing to offer drops (endpoints
 * elsewhere only) or rejects (none at all). XVS_ACT_NEW: a backend may be
 * chosen; otherwise XVS_ACT_DROP or XVS_ACT_REJECT with *verdict set. */
static __always_inline int flow_admit(const struct xvs_pkt *p, struct xvs_svc_key *key,
				      struct xvs_svc_value **svcp, bool in_cluster, __u32 *verdict)
{
	struct xvs_svc_value *svc = *svcp;

	if (svc_has_source_ranges(svc) && !lpm_match(&xvs_source_ranges, svc->svc_id, p->saddr, p->family)) {
		*verdict = XVS_V_DROP_SOURCE_RANGE;
		return XVS_ACT_DROP;
	}
	if (svc_short_circuits(svc) && in_cluster) {
		/* As kube-proxy short-circuits pods and the node itself to
		 * the cluster's endpoints. */
		key->scope = XVS_SCOPE_SHORT_CIRCUIT;
		svc = bpf_map_lookup_elem(&xvs_services, key);
		if (!svc) {
			*verdict = XVS_V_DROP_NO_BACKEND;
			return XVS_ACT_DROP;
		}
		*svcp = svc;
	}
	if (svc->count == 0) {
		if (svc_has_endpoints(svc)) {
			*verdict = XVS_V_DROP_NO_LOCAL;
			return XVS_ACT_DROP;
		}
		*verdict = XVS_V_REJECT_NO_ENDPOINTS;
		return XVS_ACT_REJECT;
	}
	return XVS_ACT_NEW;
}

/* Is rev the reply entry of p's client tuple? Its pending counts are
 * flushed when it is. */
static __always_inline bool flow_retire_reply(const struct xvs_pkt *p, struct xvs_ct_entry *rev)
{
	if (!rev || !ct_is_reply(rev) || !addr_eq(rev->snat_addr, p->saddr) || rev->snat_port != p->sport ||
	    !addr_eq(rev->nat_addr, p->daddr) || rev->nat_port != p->dport)
		return false;
	stats_flush(rev);
	return true;
}

/* A closed or expired flow of this client tuple is being replaced: give
 * back what it holds (counters, its least-connection count, its reply
 * entry, so that its masquerade port is free at once). */
static __noinline void flow_retire(const struct xvs_pkt *p, struct xvs_ct_entry *old)
{
	struct xvs_ct_key rk = {};
	struct xvs_ct_entry *rev;

	stats_flush(old);
	ct_release(old);
	if (ct_is_snat(old))
		ct_key(&rk, old->nat_addr, old->snat_addr, old->nat_port, old->snat_port, p->proto,
		       p->family);
	else
		ct_key(&rk, old->nat_addr, p->saddr, old->nat_port, p->sport, p->proto, p->family);
	/* Its reply entry, in whichever table it is. */
	rev = ct_get(XVS_CT_TABLE_ESTABLISHED, &rk);
	if (flow_retire_reply(p, rev)) {
		ct_del(XVS_CT_TABLE_ESTABLISHED, &rk);
		return;
	}
	rev = ct_get(XVS_CT_TABLE_UNREPLIED, &rk);
	if (flow_retire_reply(p, rev))
		ct_del(XVS_CT_TABLE_UNREPLIED, &rk);
}

/* Does a live flow (in either table) hold the reply key ck? A dead one's
 * entry in xvs_conntrack is deleted on the way. A global function (see
 * flow_new_skb). */
__noinline int flow_reply_taken(const struct xvs_ct_key *key, __u64 now)
{
	struct xvs_ct_key k, *ck = &k;
	struct xvs_ct_entry *have;

	if (!key)
		return 0;
	k = *key; /* on the stack: plain memory is no map key to Linux 6.1 */
	have = ct_get(XVS_CT_TABLE_ESTABLISHED, ck);
	if (have) {
		if (ct_flow_of(ck, have, now, false))
			return true;
		ct_del(XVS_CT_TABLE_ESTABLISHED, ck);
	}
	have = ct_get(XVS_CT_TABLE_UNREPLIED, ck);
	return have && ct_flow_of(ck, have, now, true);
}

/* The closed or expired flow of p's client tuple, if any, is replaced by
 * the new one: it is retired (flow_retire), and its masquerade port
 * returned, for the new flow to try first (a reused client port recycles
 * its mapping), or 0. A global function (see flow_new_skb) on the
 * scratch space's packet. */
__noinline int flow_replace(void)
{
	struct flow_scratch *sc = flow_scratch_get();
	struct xvs_ct_key ck = {};
	struct xvs_ct_entry *old;
	const struct xvs_pkt *p;
	__be16 prefer = 0;

	if (!sc)
		return 0;
	p = &sc->pkt;
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	old = ct_get(XVS_CT_TABLE_ESTABLISHED, &ck);
	if (old && !ct_is_reply(old)) {
		if (ct_is_snat(old))
			prefer = old->snat_port;
		flow_retire(p, old);
		/* The new flow starts in the unreplied table: the old one
		 * must not answer for its tuple meanwhile. */
		ct_del(XVS_CT_TABLE_ESTABLISHED, &ck);
		return prefer;
	}
	old = ct_get(XVS_CT_TABLE_UNREPLIED, &ck);
	if (old && !ct_is_reply(old)) {
		if (ct_is_snat(old))
			prefer = old->snat_port;
		flow_retire(p, old);
	}
	return prefer;
}

/* Does p open a flow? Only a SYN opens a TCP flow; anything else without
 * conntrack is conntrack-INVALID (a stray RST, a segment of a forgotten
 * flow) and dropped. XVS_ACT_NEW when it does. */
static __always_inline int flow_opens(void *ctx, const struct xvs_pkt *p, const struct xvs_config *cfg,
				      __u32 *verdict)
{
	__u32 ifindex = 0;

	if (p->proto != IPPROTO_TCP ||
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) == TCP_FLAG_SYN)
		return XVS_ACT_NEW;
	/* In netfilter mode, a segment to a port of this node's own address
	 * may be a reply netfilter masqueraded (it chose the port): its
	 * conntrack knows, ours cannot. */
	if (cfg_netfilter(cfg) && flow_route(ctx, p, p->daddr, p->dport, &ifindex) == FLOW_ROUTE_LOCAL) {
		*verdict = XVS_V_PASS;
		return XVS_ACT_PASS;
	}
	*verdict = XVS_V_DROP_INVALID;
	return XVS_ACT_DROP;
}

/* First packet of a flow to a frontend: filter, choose a backend, decide
 * on masquerade, record both directions in conntrack. A closed or
 * expired flow of the same client tuple is replaced. The recording stays
 * in this one function (about 100 lines): its order is the protocol
 * (reply entry before forward entry, both built in one scratch entry), and
 * a subprogram per step would stack frames the deepest chain (the
 * masquerade port search) has no room for. Programs call it as
 * flow_new_skb or flow_new_xdp. */
static __always_inline int flow_new(void *ctx, const struct xvs_pkt *p, struct flow_res *res)
{
	struct xvs_svc_key *key = &res->key;
	struct xvs_svc_value *svc;
	struct xvs_ct_key ck = {};
	__u32 *verdict = &res->verdict;
	__u64 now = res->now;
	static const struct xvs_config no_config = {};
	const struct xvs_config *cfg;
	__u32 zero = 0;
	bool pod;

	cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);
	if (!cfg)
		cfg = &no_config;
	if (cfg_draining(cfg)) {
		/* Every decision on a new flow is the other proxy's now. */
		*verdict = XVS_V_PASS_DRAINING;
		return XVS_ACT_PASS;
	}
	svc = flow_frontend(p, key);
	if (!svc)
		return flow_no_service(p, verdict);
	pod = cfg_detects_local(cfg) && lpm_match(&xvs_pod_cidrs, p->family, p->saddr, p->family);

	int act = flow_admit(p, key, &svc, pod, verdict);

	if (act != XVS_ACT_NEW)
		return act;
	act = flow_opens(ctx, p, cfg, verdict);
	if (act != XVS_ACT_NEW)
		return act;

	__u32 backend_id = 0;
	struct xvs_backend *be = flow_choose(p, key, svc, now, &backend_id);

	if (!be) {
		*verdict = XVS_V_DROP_NO_BACKEND;
		return XVS_ACT_DROP;
	}

	const __u8 *be_addr = be->addr;
	__be16 be_port = be->port;
	const __u8 *node = p->family == XVS_FAMILY_IPV4 ? cfg->snat_addr4 : cfg->snat_addr6;
	bool snat = flow_masquerade(cfg, svc, pod, addr_eq(be_addr, p->saddr)) && !addr_is_zero(node);
	__u16 flags = p->proto == IPPROTO_TCP ? XVS_CT_F_SYN : 0;
	__u8 state = p->proto == IPPROTO_TCP ? XVS_CT_SYN_SENT : XVS_CT_NONE;
	__be16 sport = p->sport, prefer;

	snat = flow_nat_path(ctx, p, cfg, be, snat, &flags, &node);
	prefer = flow_replace();

	/* The entry is built in per-CPU scratch space: two of them on the
	 * stack would not fit the BPF stack beside everything else. */
	struct flow_scratch *sc = bpf_map_lookup_elem(&xvs_scratch, &zero);

	if (!sc) {
		*verdict = XVS_V_DROP_NO_BACKEND;
		return XVS_ACT_DROP;
	}
	struct xvs_ct_entry *e = &sc->entry;

	/* Reply entry first: once the forward entry exists, replies can come. */
	__builtin_memset(e, 0, sizeof(*e));
	e->backend_id = backend_id;
	e->svc_id = svc->svc_id;
	e->nat_port = p->dport;
	e->snat_port = p->sport;
	e->flags = flags | XVS_CT_F_REPLY;
	__builtin_memcpy(e->nat_addr, p->daddr, 16);
	__builtin_memcpy(e->snat_addr, p->saddr, 16);
	if (!snat) {
		ct_key(&ck, be_addr, p->saddr, be_port, p->sport, p->proto, p->family);
		if (flow_reply_taken(&ck, now)) {
			/* Another live flow of this client port already
			 * reaches this backend (through another frontend): as
			 * netfilter resolves such a clash, this one gets
			 * another source port. */
			node = p->saddr;
			snat = true;
			e->flags |= XVS_CT_F_CLASH;
		} else {
			ct_put(XVS_CT_TABLE_UNREPLIED, &ck, e, BPF_ANY);
		}
	}
	if (snat) {
		e->flags |= XVS_CT_F_SNAT;
		sport = flow_snat_port(ctx, cfg, node, be_addr, be_port, p, e, prefer, now);
		if (!sport) {
			*verdict = XVS_V_DROP_SNAT_EXHAUSTED;
			return XVS_ACT_DROP;
		}
		flags |= XVS_CT_F_SNAT;
	}
	if (lb_least_conn(svc->sched)) {
		struct xvs_conn_counts *c = bpf_map_lookup_elem(&xvs_backend_held, &backend_id);

		if (c) {
			__sync_fetch_and_add(&c->active, 1);
			flags |= XVS_CT_F_HELD;
		}
	}
	/* Now the forward entry, in the same space. The first packet waits
	 * in it like any other: the first reply flushes it with the
	 * connection count. */
	__builtin_memcpy(e->nat_addr, be_addr, sizeof(e->nat_addr));
	e->nat_port = be_port;
	__builtin_memset(e->snat_addr, 0, sizeof(e->snat_addr));
	e->snat_port = 0;
	if (snat) {
		__builtin_memcpy(e->snat_addr, node, 16);
		e->snat_port = sport;
	}
	e->flags = flags;
	e->state = state;
	e->expires = now + ct_timeout_ns(p->proto, state, flags);
	e->packets = 1;
	e->bytes = res->len;
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	ct_put(XVS_CT_TABLE_UNREPLIED, &ck, e, BPF_ANY);

	__builtin_memcpy(res->rw.saddr, snat ? node : p->saddr, 16);
	res->rw.sport = sport;
	__builtin_memcpy(res->rw.daddr, be_addr, 16);
	res->rw.dport = be_port;
	res->nf_flags = flags & XVS_CT_F_NF_MASK;
	*verdict = XVS_V_FWD_NEW;
	return XVS_ACT_NAT;
}

/* flow_new for each kind of program context: global functions, each
 * verified once on its own, whatever state the program is in when it calls
 * it. A static subprogram is verified again for every caller state the
 * verifier cannot prune: on Linux 6.1 that tripled the tc program's
 * verification (685k instructions processed of the 1M limit, 20 s under
 * qemu). They work on the packet and the decision in the per-CPU scratch
 * space, where the program put them: a pointer argument would be plain
 * memory to the verifier, which Linux 6.1 does not take as a map key. */
__noinline int flow_new_skb(struct __sk_buff *skb)
{
	struct flow_scratch *sc = flow_scratch_get();

	if (!sc)
		return XVS_ACT_PASS;
	return flow_new(skb, &sc->pkt, &sc->res);
}

__noinline int flow_new_xdp(struct xdp_md *ctx)
{
	struct flow_scratch *sc = flow_scratch_get();

	if (!sc)
		return XVS_ACT_PASS;
	return flow_new(ctx, &sc->pkt, &sc->res);
}

/* The conntrack half of the decision: a packet of a live flow gets its
 * translation; anything else is XVS_ACT_NEW for flow_new. */
static __always_inline int flow_track_in(const struct xvs_pkt *p, const struct xvs_ct_key *ck,
					 struct xvs_ct_entry *e, struct flow_res *res, bool unreplied)
{
	if (!e)
		return XVS_ACT_NEW;
	if (ct_is_reply(e)) {
		struct xvs_ct_entry *fe = ct_flow_of(ck, e, res->now, unreplied);

		/* A stale reply entry (the reaper removes it) says nothing:
		 * the packet is not part of a live flow of ours. */
		if (!fe)
			return XVS_ACT_NEW;
		/* A reply of a netfilter-mode flow meets netfilter as it
		 * left the backend; its egress translates it. */
		if (ct_via_netfilter(e)) {
			res->verdict = XVS_V_PASS;
			return XVS_ACT_PASS;
		}
		if (unreplied)
			return XVS_ACT_PROMOTE;
		return flow_reply(p, e, fe, res);
	}
	if (ct_usable(e, p, res->now))
		return flow_established(p, e, res);
	return XVS_ACT_NEW;
}

static __noinline int flow_track(const struct xvs_pkt *p, struct flow_res *res)
{
	struct xvs_ct_key ck = {};
	struct xvs_ct_entry *e;
	int act;

	res->now = bpf_ktime_get_ns();
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	act = flow_track_in(p, &ck, ct_get(XVS_CT_TABLE_ESTABLISHED, &ck), res, false);
	if (act != XVS_ACT_NEW)
		return act;
	e = ct_get(XVS_CT_TABLE_UNREPLIED, &ck);
	act = flow_track_in(p, &ck, e, res, true);
	if (act != XVS_ACT_PROMOTE)
		return act;
	/* The flow's first reply: it moves to the established table, and
	 * the reply is handled there. */
	ct_promote(&ck, e);
	return flow_track_in(p, &ck, ct_get(XVS_CT_TABLE_ESTABLISHED, &ck), res, false);
}

/* Decide what to do with a parsed packet at ingress; res->len is set. ctx
 * is the program's context (skb or XDP buffer), for route and socket
 * lookups. The two halves are separate subprograms so that their stack
 * frames are siblings, not nested. */
static __always_inline int flow_process(void *ctx, bool xdp, const struct xvs_pkt *p, struct flow_res *res)
{
	int act = flow_track(p, res);

	if (act != XVS_ACT_NEW)
		return act;
	if (!p->has_l4) {
		res->verdict = XVS_V_PASS_FRAGMENT;
		return XVS_ACT_PASS;
	}
	/* p and res are the scratch space's (flow_new_skb). */
	return xdp ? flow_new_xdp(ctx) : flow_new_skb(ctx);
}

/* At a device's egress: a reply of a flow whose backend is this node's own
 * address (a hostNetwork endpoint), or of any flow in netfilter mode,
 * leaves the node's stack here, and gets its reverse NAT. Anything else
 * passes. */
/* The live flow of a reply entry e that is reverse-NATed at egress. */
static __always_inline struct xvs_ct_entry *flow_egress_of(const struct xvs_ct_key *ck,
							   struct xvs_ct_entry *e, __u64 now, bool unreplied)
{
	if (!e || !ct_is_reply(e) || !ct_reversed_at_egress(e))
		return NULL;
	return ct_flow_of(ck, e, now, unreplied);
}

static __noinline int flow_egress(const struct xvs_pkt *p, struct flow_res *res)
{
	struct xvs_ct_key ck = {};
	struct xvs_ct_entry *e, *fe;

	res->now = bpf_ktime_get_ns();
	res->verdict = XVS_V_PASS;
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	e = ct_get(XVS_CT_TABLE_ESTABLISHED, &ck);
	fe = flow_egress_of(&ck, e, res->now, false);
	if (!fe) {
		/* The flow's first reply, still in the unreplied table. */
		e = ct_get(XVS_CT_TABLE_UNREPLIED, &ck);
		if (!flow_egress_of(&ck, e, res->now, true))
			return XVS_ACT_PASS;
		ct_promote(&ck, e);
		e = ct_get(XVS_CT_TABLE_ESTABLISHED, &ck);
		fe = flow_egress_of(&ck, e, res->now, false);
		if (!fe)
			return XVS_ACT_PASS;
	}
	return flow_reply(p, e, fe, res);
}

#endif
