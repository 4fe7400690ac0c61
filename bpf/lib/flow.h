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
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

enum xvs_action {
	XVS_ACT_PASS = 0, /* leave the packet alone */
	XVS_ACT_DROP,
	XVS_ACT_REJECT, /* answer with TCP RST / ICMP port unreachable */
	XVS_ACT_NAT,	/* rewrite to xvs_rewrite and forward */
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
	__u64 now;
	__u32 len;
	__u32 verdict;
};

#define __noinline __attribute__((noinline))

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

/* The scratch space with the packet and the decision zeroed (parsing
 * relies on zero-padded addresses); flow_new clears the entry itself, and
 * only when it builds one. NULL never happens with a 1-entry array. */
static __always_inline struct flow_scratch *flow_scratch(void)
{
	__u32 zero = 0;
	struct flow_scratch *sc = bpf_map_lookup_elem(&xvs_scratch, &zero);

	if (sc) {
		__builtin_memset(&sc->pkt, 0, sizeof(sc->pkt));
		__builtin_memset(&sc->res, 0, sizeof(sc->res));
	}
	return sc;
}

/* Build-time test hook for the conformance "break it" checks: with this
 * knob cleared the reverse NAT is skipped. Always 1 in production. */
volatile const __u8 cfg_rev_nat = 1;

/* How many masquerade ports a new flow tries before giving up. */
#define SNAT_TRIES 32

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
	if (e->flags & XVS_CT_F_SNAT) {
		__builtin_memcpy(rw->saddr, e->snat_addr, 16);
		rw->sport = e->snat_port;
	} else {
		__builtin_memcpy(rw->saddr, p->saddr, 16);
		rw->sport = p->sport;
	}
}

/* Reply from a backend: the frontend becomes the source again, and a
 * masqueraded flow goes back to its client. */
static __noinline int flow_reply(const struct xvs_pkt *p, struct xvs_ct_entry *e, struct flow_res *res)
{
	struct xvs_rewrite *rw = &res->rw;
	__u64 now = res->now;
	bool snat = e->flags & XVS_CT_F_SNAT;
	const __u8 *client = snat ? e->snat_addr : p->daddr;
	__be16 cport = snat ? e->snat_port : p->dport;
	bool first = false;

	if (!(e->flags & XVS_CT_F_SEEN_REPLY)) {
		/* First reply: the forward entry learns the flow is
		 * established, so it takes the long timeout. */
		struct xvs_ct_key fk = {};
		struct xvs_ct_entry *fe;

		ct_key(&fk, client, e->nat_addr, cport, e->nat_port, p->proto, p->family);
		fe = bpf_map_lookup_elem(&xvs_conntrack, &fk);
		if (fe) {
			fe->flags |= XVS_CT_F_SEEN_REPLY;
			fe->expires = now + ct_lifetime_ns(p->proto, fe->flags);
			stats_flush(fe);
		}
		first = true;
	}
	ct_touch(e, p, now);
	ct_account(e, res->len, first);
	res->verdict = XVS_V_REPLY;
	if (!cfg_rev_nat)
		return XVS_ACT_PASS;
	__builtin_memcpy(rw->saddr, e->nat_addr, 16);
	rw->sport = e->nat_port;
	__builtin_memcpy(rw->daddr, client, 16);
	rw->dport = cport;
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
	if (hairpin || (cfg->flags & XVS_CFG_MASQ_ALL))
		return true;
	if (svc->kind == XVS_KIND_CLUSTER_IP)
		/* Off-cluster sources, when a detector says what "local" is. */
		return (cfg->flags & XVS_CFG_DETECT_LOCAL) && !pod;
	/* External addresses: always with eTP=Cluster; never with eTP=Local
	 * (external clients keep their address, pods short-circuit). */
	return !(svc->flags & XVS_SVC_F_LOCAL);
}

/* Insert the reply entry of a masqueraded flow under a free source port of
 * the node's address; returns the port, or 0 when none is free. */
static __always_inline __be16 flow_snat_port(const struct xvs_config *cfg, const __u8 *node,
					     const __u8 *be_addr, __be16 be_port, __u8 proto, __u8 family,
					     struct xvs_ct_entry *rev, __u64 now)
{
	__u32 lo = cfg->snat_port_min, hi = cfg->snat_port_max;
	struct xvs_ct_key rk = {};

	if (proto == IPPROTO_SCTP) {
		/* A new SCTP port would need the CRC32c recomputed: keep the
		 * client's own port, and give up if it is taken. */
		lo = hi = bpf_ntohs(rev->snat_port);
	}
	if (lo == 0 || hi < lo)
		return 0;
	__u32 span = hi - lo + 1;
	__u32 start = bpf_get_prandom_u32();

	for (int i = 0; i < SNAT_TRIES; i++) {
		__be16 port = bpf_htons((__u16)(lo + (start + i) % span));
		struct xvs_ct_entry *old;

		ct_key(&rk, be_addr, node, be_port, port, proto, family);
		old = bpf_map_lookup_elem(&xvs_conntrack, &rk);
		if (old && old->expires > now)
			continue;
		if (bpf_map_update_elem(&xvs_conntrack, &rk, rev, old ? BPF_ANY : BPF_NOEXIST) == 0)
			return port;
	}
	return 0;
}

/* First packet of a flow to a frontend: filter, choose a backend, decide
 * on masquerade, record both directions in conntrack. */
static __noinline int flow_new(const struct xvs_pkt *p, struct xvs_svc_key *key, struct xvs_svc_value *svc,
			       struct flow_res *res)
{
	__u32 *verdict = &res->verdict;
	__u64 now = res->now;
	static const struct xvs_config no_config = {};
	const struct xvs_config *cfg;
	__u32 zero = 0;
	bool pod;

	cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);
	if (!cfg)
		cfg = &no_config;
	pod = (cfg->flags & XVS_CFG_DETECT_LOCAL) &&
	      lpm_match(&xvs_pod_cidrs, p->family, p->saddr, p->family);

	if ((svc->flags & XVS_SVC_F_SOURCE_RANGES) &&
	    !lpm_match(&xvs_source_ranges, svc->svc_id, p->saddr, p->family)) {
		*verdict = XVS_V_DROP_SOURCE_RANGE;
		return XVS_ACT_DROP;
	}
	if ((svc->flags & XVS_SVC_F_SHORT_CIRCUIT) && pod) {
		/* eTP=Local: pods reach every endpoint, as kube-proxy
		 * short-circuits them to the cluster set. */
		key->scope = XVS_SCOPE_SHORT_CIRCUIT;
		svc = bpf_map_lookup_elem(&xvs_services, key);
		if (!svc) {
			*verdict = XVS_V_DROP_NO_BACKEND;
			return XVS_ACT_DROP;
		}
	}
	if (svc->count == 0) {
		if (svc->flags & XVS_SVC_F_HAS_ENDPOINTS) {
			*verdict = XVS_V_DROP_NO_LOCAL;
			return XVS_ACT_DROP;
		}
		*verdict = XVS_V_REJECT_NO_ENDPOINTS;
		return XVS_ACT_REJECT;
	}
	/* Only a SYN opens a TCP flow; anything else without conntrack is
	 * conntrack-INVALID (a stray RST, a segment of a forgotten flow). */
	if (p->proto == IPPROTO_TCP &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) != TCP_FLAG_SYN) {
		*verdict = XVS_V_DROP_INVALID;
		return XVS_ACT_DROP;
	}

	struct xvs_backend *be = NULL;
	__u32 backend_id = 0;

	if (svc->flags & XVS_SVC_F_AFFINITY)
		be = affinity_lookup(key, svc, p, now, &backend_id);
	if (!be)
		be = lb_select(key, svc, p, &backend_id);
	if (!be) {
		*verdict = XVS_V_DROP_NO_BACKEND;
		return XVS_ACT_DROP;
	}
	if (svc->flags & XVS_SVC_F_AFFINITY)
		affinity_update(svc, p, backend_id, now);

	const __u8 *be_addr = be->addr;
	__be16 be_port = be->port;
	const __u8 *node = p->family == XVS_FAMILY_IPV4 ? cfg->snat_addr4 : cfg->snat_addr6;
	bool snat = flow_masquerade(cfg, svc, pod, addr_eq(be_addr, p->saddr)) && !addr_is_zero(node);
	__u16 flags = (p->proto == IPPROTO_TCP) ? XVS_CT_F_SYN : 0;
	__be16 sport = p->sport;
	struct xvs_ct_key ck = {};
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
	e->expires = now + ct_lifetime_ns(p->proto, flags);
	e->nat_port = p->dport;
	e->snat_port = p->sport;
	e->flags = flags | XVS_CT_F_REPLY;
	__builtin_memcpy(e->nat_addr, p->daddr, 16);
	__builtin_memcpy(e->snat_addr, p->saddr, 16);
	if (snat) {
		e->flags |= XVS_CT_F_SNAT;
		sport = flow_snat_port(cfg, node, be_addr, be_port, p->proto, p->family, e, now);
		if (!sport) {
			*verdict = XVS_V_DROP_SNAT_EXHAUSTED;
			return XVS_ACT_DROP;
		}
		flags |= XVS_CT_F_SNAT;
	} else {
		ct_key(&ck, be_addr, p->saddr, be_port, p->sport, p->proto, p->family);
		bpf_map_update_elem(&xvs_conntrack, &ck, e, BPF_ANY);
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
	__builtin_memcpy(e->nat_addr, be->addr, sizeof(e->nat_addr));
	e->nat_port = be_port;
	__builtin_memset(e->snat_addr, 0, sizeof(e->snat_addr));
	e->snat_port = 0;
	if (snat) {
		__builtin_memcpy(e->snat_addr, node, 16);
		e->snat_port = sport;
	}
	e->flags = flags;
	e->packets = 1;
	e->bytes = res->len;
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	bpf_map_update_elem(&xvs_conntrack, &ck, e, BPF_ANY);

	__builtin_memcpy(res->rw.saddr, snat ? node : p->saddr, 16);
	res->rw.sport = sport;
	__builtin_memcpy(res->rw.daddr, be_addr, 16);
	res->rw.dport = be_port;
	*verdict = XVS_V_FWD_NEW;
	return XVS_ACT_NAT;
}

/* Decide what to do with a parsed packet; res->len is set. */
static __noinline int flow_process(const struct xvs_pkt *p, struct flow_res *res)
{
	struct xvs_ct_key ck = {};
	struct xvs_ct_entry *e;
	__u64 now = bpf_ktime_get_ns();

	res->now = now;
	ct_key(&ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	e = bpf_map_lookup_elem(&xvs_conntrack, &ck);
	if (e) {
		if (e->flags & XVS_CT_F_REPLY)
			return flow_reply(p, e, res);
		if (ct_usable(e, p, now)) {
			ct_touch(e, p, now);
			ct_account(e, res->len, false);
			flow_forward_rewrite(p, e, &res->rw);
			res->verdict = XVS_V_FWD_ESTABLISHED;
			return XVS_ACT_NAT;
		}
		/* The entry is about to be replaced by a new flow: count
		 * what it still holds, give back its connection. */
		stats_flush(e);
		if (e->flags & (XVS_CT_F_HELD | XVS_CT_F_INACTIVE))
			ct_release(e);
	}
	if (!p->has_l4) {
		res->verdict = XVS_V_PASS_FRAGMENT;
		return XVS_ACT_PASS;
	}

	struct xvs_svc_key key = {};
	struct xvs_svc_value *svc;

	svc_key(&key, p->daddr, p->dport, p->proto, p->family, XVS_SCOPE_POLICY);
	svc = bpf_map_lookup_elem(&xvs_services, &key);
	if (!svc)
		return flow_no_service(p, &res->verdict);
	return flow_new(p, &key, svc, res);
}

#endif
