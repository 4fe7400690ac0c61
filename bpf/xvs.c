//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The xvs datapath: Service load balancing at tc ingress.
 *
 * Attached to every interface that carries traffic into the node (external
 * interfaces and pod veths). A packet is, in order:
 *   1. part of a tracked flow: DNAT (forward) or reverse NAT (reply);
 *   2. addressed to a frontend: a new flow, with a backend chosen in the slot
 *      model, or a REJECT/DROP when the Service has nothing to offer;
 *   3. anything else: passed untouched.
 * Rewriting before routing lets the kernel route the translated packet, so
 * no netfilter rule is involved. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lib/affinity.h"
#include "lib/ct.h"
#include "lib/lb.h"
#include "lib/maps.h"
#include "lib/nat.h"
#include "lib/parse.h"
#include "lib/reject.h"
#include "lib/stats.h"
#include "lib/types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Build-time test hook for the conformance "break it" checks: with this
 * knob cleared the reverse NAT is skipped. Always 1 in production. */
volatile const __u8 cfg_rev_nat = 1;

static __always_inline int verdict(int action, __u32 v, const struct __sk_buff *skb)
{
	stats_verdict(v, skb->len);
	return action;
}

static __always_inline __be32 addr_v4(const __u8 addr[16])
{
	__be32 a;

	__builtin_memcpy(&a, addr, sizeof(a));
	return a;
}

/* Reply from a backend: restore the frontend as the source. */
static __always_inline int handle_reply(struct __sk_buff *skb, struct xvs_pkt *p, struct xvs_ct_entry *e,
					__u64 now)
{
	bool first = false;

	if (!(e->flags & XVS_CT_F_SEEN_REPLY)) {
		/* First reply: the forward entry learns the flow is
		 * established, so it takes the long timeout. */
		struct xvs_ct_key fk = {};
		struct xvs_ct_entry *fe;

		ct_key_v4(&fk, p->daddr, addr_v4(e->nat_addr), p->dport, e->nat_port, p->proto);
		fe = bpf_map_lookup_elem(&xvs_conntrack, &fk);
		if (fe) {
			fe->flags |= XVS_CT_F_SEEN_REPLY;
			fe->expires = now + ct_lifetime_ns(p->proto, fe->flags);
			stats_flush(fe);
		}
		first = true;
	}
	ct_touch(e, p, now);
	ct_account(e, skb->len, first);
	if (!cfg_rev_nat)
		return verdict(TC_ACT_OK, XVS_V_REPLY, skb);
	if (nat_rewrite_v4(skb, p, true, addr_v4(e->nat_addr), e->nat_port))
		return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	return verdict(TC_ACT_OK, XVS_V_REPLY, skb);
}

/* First packet of a flow to a frontend: choose a backend, record both
 * directions in conntrack, DNAT. */
static __always_inline int handle_new(struct __sk_buff *skb, struct xvs_pkt *p, struct xvs_svc_key *key,
				      struct xvs_svc_value *svc, __u64 now)
{
	struct xvs_backend *be;
	__u32 backend_id = 0;

	if (svc->count == 0) {
		if (svc->flags & XVS_SVC_F_HAS_ENDPOINTS)
			return verdict(TC_ACT_SHOT, XVS_V_DROP_NO_LOCAL, skb);
		int ret = reject_v4(skb, p);
		if (ret < 0)
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REJECT_FAILED, skb);
		return verdict(ret, XVS_V_REJECT_NO_ENDPOINTS, skb);
	}
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_FLAG_RST))
		return verdict(TC_ACT_SHOT, XVS_V_DROP_INVALID, skb);

	be = NULL;
	if (svc->flags & XVS_SVC_F_AFFINITY)
		be = affinity_lookup(key, svc, p, now, &backend_id);
	if (!be)
		be = lb_select(key, svc, p, &backend_id);
	if (!be)
		return verdict(TC_ACT_SHOT, XVS_V_DROP_NO_BACKEND, skb);
	if (svc->flags & XVS_SVC_F_AFFINITY)
		affinity_update(svc, p, backend_id, now);

	__be32 be_addr = addr_v4(be->addr);
	__be16 be_port = be->port;
	__u16 flags = (p->proto == IPPROTO_TCP && (p->tcp_flags & TCP_FLAG_SYN)) ? XVS_CT_F_SYN : 0;
	__u16 held = 0;

	if (lb_least_conn(svc->sched)) {
		__u32 *n = bpf_map_lookup_elem(&xvs_backend_held, &backend_id);

		if (n) {
			__sync_fetch_and_add(n, 1);
			held = XVS_CT_F_HELD;
		}
	}
	struct xvs_ct_key fk = {}, rk = {};
	struct xvs_ct_entry fwd = {
		.backend_id = backend_id,
		.svc_id = svc->svc_id,
		.nat_port = be_port,
		.flags = flags | held,
		/* The first packet waits in the entry like any other: the
		 * first reply flushes it with the connection count. */
		.packets = 1,
		.bytes = skb->len,
	};
	struct xvs_ct_entry rev = {
		.backend_id = backend_id,
		.svc_id = svc->svc_id,
		.nat_port = p->dport,
		.flags = flags | XVS_CT_F_REPLY,
	};

	__builtin_memcpy(fwd.nat_addr, be->addr, sizeof(fwd.nat_addr));
	__builtin_memcpy(rev.nat_addr, &p->daddr, sizeof(p->daddr));
	fwd.expires = now + ct_lifetime_ns(p->proto, fwd.flags);
	rev.expires = fwd.expires;
	ct_key_v4(&fk, p->saddr, p->daddr, p->sport, p->dport, p->proto);
	ct_key_v4(&rk, be_addr, p->saddr, be_port, p->sport, p->proto);
	/* Reply entry first: once the forward entry exists, replies can come. */
	bpf_map_update_elem(&xvs_conntrack, &rk, &rev, BPF_ANY);
	bpf_map_update_elem(&xvs_conntrack, &fk, &fwd, BPF_ANY);

	if (nat_rewrite_v4(skb, p, false, be_addr, be_port))
		return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	return verdict(TC_ACT_OK, XVS_V_FWD_NEW, skb);
}

static __always_inline int handle_ipv4(struct __sk_buff *skb)
{
	struct xvs_pkt p = {};
	struct xvs_ct_key ck = {};
	struct xvs_ct_entry *e;
	__u64 now = bpf_ktime_get_ns();

	switch (parse_ipv4(skb, ETH_HLEN, &p)) {
	case XVS_PARSE_OK:
		break;
	case XVS_PARSE_IGNORE:
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	case XVS_PARSE_FRAGMENT:
		return verdict(TC_ACT_OK, XVS_V_PASS_FRAGMENT, skb);
	default:
		return verdict(TC_ACT_OK, XVS_V_PASS_MALFORMED, skb);
	}

	ct_key_v4(&ck, p.saddr, p.daddr, p.sport, p.dport, p.proto);
	e = bpf_map_lookup_elem(&xvs_conntrack, &ck);
	if (e) {
		if (e->flags & XVS_CT_F_REPLY)
			return handle_reply(skb, &p, e, now);
		if (ct_usable(e, &p, now)) {
			ct_touch(e, &p, now);
			ct_account(e, skb->len, false);
			if (nat_rewrite_v4(skb, &p, false, addr_v4(e->nat_addr), e->nat_port))
				return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
			return verdict(TC_ACT_OK, XVS_V_FWD_ESTABLISHED, skb);
		}
		/* The entry is about to be replaced by a new flow: count
		 * what it still holds, give back its connection. */
		stats_flush(e);
		if (e->flags & XVS_CT_F_HELD)
			ct_release(e);
	}

	if (!p.has_l4)
		return verdict(TC_ACT_OK, XVS_V_PASS_FRAGMENT, skb);

	struct xvs_svc_key key = {};
	struct xvs_svc_value *svc;

	svc_key_v4(&key, p.daddr, p.dport, p.proto, XVS_SCOPE_POLICY);
	svc = bpf_map_lookup_elem(&xvs_services, &key);
	if (!svc)
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	return handle_new(skb, &p, &key, svc, now);
}

SEC("tc")
int xvs_tc_ingress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return handle_ipv4(skb);
	return verdict(TC_ACT_OK, XVS_V_PASS, skb);
}

/* The floor for benchmarks: the cheapest possible tc program. */
SEC("tc")
int xvs_tc_empty(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

/* Enums that only travel through u8/u16 fields never reach BTF on their
 * own; these unused pointers put them there so bpf2go emits them for Go. */
const enum xvs_kind *_unused_kind __attribute__((unused));
const enum xvs_sched *_unused_sched __attribute__((unused));
const enum xvs_backend_flags *_unused_backend_flags __attribute__((unused));
const enum xvs_scope *_unused_scope __attribute__((unused));
const enum xvs_svc_flags *_unused_svc_flags __attribute__((unused));
const struct xvs_sched_key *_unused_sched_key __attribute__((unused));
const struct xvs_affinity_key *_unused_affinity_key __attribute__((unused));
const struct xvs_affinity_value *_unused_affinity_value __attribute__((unused));
const struct xvs_member_key *_unused_member_key __attribute__((unused));
const enum xvs_ct_flags *_unused_ct_flags __attribute__((unused));
const enum xvs_verdict *_unused_verdict __attribute__((unused));
