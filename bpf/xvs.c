//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The xvs datapath: Service load balancing at tc ingress, with an XDP fast
 * path on the node's external interfaces.
 *
 * tc ingress runs on every interface that carries traffic into the node
 * (external interfaces, pod veths, links to other nodes). A packet is, in
 * order:
 *   1. part of a tracked flow: DNAT (forward) or reverse NAT (reply), with
 *      the masquerade of that flow if it has one;
 *   2. addressed to a frontend: a new flow (lib/flow.h), or a REJECT/DROP
 *      when the Service has nothing to offer or the source is not allowed;
 *   3. addressed to a live ClusterIP on another port (REJECT) or to an
 *      unallocated service address (DROP);
 *   4. anything else: passed untouched.
 * A rewritten packet is forwarded straight to its egress interface
 * (bpf_fib_lookup, then bpf_redirect with the neighbour's MAC, or
 * bpf_redirect_neigh with the next hop when the neighbour is not resolved
 * yet), so no netfilter rule is involved and a masqueraded packet, whose
 * source is now a node address, never meets the stack's martian-source
 * check. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lib/affinity.h"
#include "lib/ct.h"
#include "lib/flow.h"
#include "lib/icmp.h"
#include "lib/lb.h"
#include "lib/maps.h"
#include "lib/nat.h"
#include "lib/parse.h"
#include "lib/reject.h"
#include "lib/sock.h"
#include "lib/stats.h"
#include "lib/types.h"
#include "lib/xdp.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define AF_INET	 2
#define AF_INET6 10

static __always_inline int verdict(int action, __u32 v, const struct __sk_buff *skb)
{
	stats_verdict(v, skb->len);
	return action;
}

static __always_inline int tc_rewrite(struct __sk_buff *skb, const struct xvs_pkt *p,
				      const struct xvs_rewrite *rw);

/* Is the packet one a router may not fragment (IPv4 DF, or IPv6)? */
static __always_inline bool tc_dont_fragment(struct __sk_buff *skb, const struct xvs_pkt *p)
{
	__be16 frag_off;

	if (p->family == XVS_FAMILY_IPV6)
		return true;
	if (bpf_skb_load_bytes(skb, p->l3_off + offsetof(struct iphdr, frag_off), &frag_off,
			       sizeof(frag_off)))
		return false;
	return frag_off & bpf_htons(0x4000);
}

/* Is the packet too big for ifindex's MTU? A GSO/GRO packet is checked by
 * its segments, as the forwarding path does. Any other is checked by its
 * network length here: the helper counts the egress device's link-layer
 * header against the skb's, which differ between an Ethernet device and
 * an L3 one (tun, IPIP, WireGuard: none), either way. *mtu gets the MTU. */
static __always_inline bool tc_too_big(struct __sk_buff *skb, const struct xvs_pkt *p, __u32 ifindex,
				       __u32 *mtu)
{
	long r = bpf_check_mtu(skb, ifindex, mtu, 0, BPF_MTU_CHK_SEGS);

	if (r < 0 || r == BPF_MTU_CHK_RET_SEGS_TOOBIG)
		return true;
	if (skb->gso_size)
		return false;
	return skb->len - p->l3_off > *mtu;
}

enum {
	TC_FWD_REWRITE = 1 << 0, /* translate the packet (XDP has not) */
	TC_FWD_STACK = 1 << 1,	 /* netfilter mode: hand it to the stack */
};

/* Translate a packet (with TC_FWD_REWRITE in how; XDP may have done it)
 * and send it to where its new destination routes, or, with TC_FWD_STACK
 * (netfilter mode), hand it to the stack once the MTU is checked. Falls
 * back to the stack (TC_ACT_OK) for local destinations and anything the
 * FIB cannot answer.
 * The TTL (hop limit) drops by one, as forwarding does. The route is
 * looked up once: with the neighbour resolved, the FIB's MACs go into the
 * Ethernet header and bpf_redirect sends it; without, the next hop goes to
 * bpf_redirect_neigh, which resolves it (and would otherwise route the
 * packet a second time). A packet too big for the egress MTU is answered
 * with ICMP frag-needed / packet-too-big quoting the untranslated packet,
 * as the node's forwarding would answer if it knew the frontend (in both
 * modes: the stack would quote the translated header, which the client's
 * socket does not know). *v is the verdict, changed where the packet takes
 * another way. */
static __noinline int tc_forward(struct __sk_buff *skb, const struct xvs_pkt *p, const struct xvs_rewrite *rw,
				 __u32 *v, __u32 how)
{
	bool rewrite = how & TC_FWD_REWRITE;
	struct bpf_fib_lookup fib = {
		.l4_protocol = p->proto,
		.sport = rw->sport,
		.dport = rw->dport,
		.ifindex = skb->ingress_ifindex,
	};
	bool v6 = p->family == XVS_FAMILY_IPV6;
	__u32 ttl_off = p->l3_off + (v6 ? offsetof(struct ipv6hdr, hop_limit) : offsetof(struct iphdr, ttl));

	if (v6) {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, rw->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, rw->daddr, 16);
	} else {
		fib.family = AF_INET;
		fib.ipv4_src = addr_v4(rw->saddr);
		fib.ipv4_dst = addr_v4(rw->daddr);
	}
	/* tot_len stays 0: a packet's IP length says nothing of a GSO/GRO
	 * packet's segments, which tc_too_big checks (below), as the
	 * kernel's forwarding path does. */
	long ret = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);

	/* The helper's own check of the skb (tot_len 0) counts link-layer
	 * headers as tc_too_big's comment says; its FRAG_NEEDED comes after
	 * a complete lookup (neighbour included), and tc_too_big decides. */
	if (ret == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		ret = BPF_FIB_LKUP_RET_SUCCESS;
	if (ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH)
		goto stack;

	__u32 mtu = 0;

	if (tc_too_big(skb, p, fib.ifindex, &mtu)) {
		if (rewrite && tc_dont_fragment(skb, p)) {
			int r = reject_too_big(skb, p, mtu);

			if (r >= 0) {
				*v = XVS_V_REJECT_FRAG_NEEDED;
				return r;
			}
		}
		/* IPv4 without DF: the stack fragments it. */
		*v = XVS_V_PASS_FRAG_NEEDED;
		goto stack;
	}
	if (how & TC_FWD_STACK)
		/* Netfilter mode: the stack routes it (and decrements the
		 * TTL) through PREROUTING, FORWARD and POSTROUTING. */
		goto stack;
	if (rewrite && tc_rewrite(skb, p, rw)) {
		*v = XVS_V_DROP_REWRITE;
		return TC_ACT_SHOT;
	}

	__u8 ttl;

	if (bpf_skb_load_bytes(skb, ttl_off, &ttl, 1) || ttl <= 1)
		return TC_ACT_OK; /* the stack sends time-exceeded */
	ttl--;
	if (bpf_skb_store_bytes(skb, ttl_off, &ttl, 1, 0))
		return TC_ACT_SHOT;
	if (!v6) {
		/* TTL and protocol share a 16-bit checksum word. */
		__be16 old = bpf_htons((__u16)(ttl + 1) << 8 | p->proto),
		       new = bpf_htons((__u16)ttl << 8 | p->proto);

		if (bpf_l3_csum_replace(skb, p->l3_off + IPV4_CSUM_OFF, old, new, sizeof(new)))
			return TC_ACT_SHOT;
	}
	if (!p->l3_off) {
		/* From a device without a link-layer header (l3_off 0): both
		 * redirect helpers want one, so it gets an Ethernet header (the
		 * FIB's MACs; bpf_redirect_neigh replaces a zero one, and a
		 * device without MACs drops it again). */
		struct ethhdr eth = {.h_proto = v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP)};

		if (ret == BPF_FIB_LKUP_RET_SUCCESS) {
			__builtin_memcpy(eth.h_dest, fib.dmac, ETH_ALEN);
			__builtin_memcpy(eth.h_source, fib.smac, ETH_ALEN);
		}
		if (bpf_skb_change_head(skb, ETH_HLEN, 0) ||
		    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0))
			return TC_ACT_SHOT;
		if (ret == BPF_FIB_LKUP_RET_SUCCESS)
			return bpf_redirect(fib.ifindex, 0);
	} else if (ret == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), fib.dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), fib.smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	}

	/* The lookup left the next hop (gateway or destination) in the
	 * destination field of the next hop's family. */
	struct bpf_redir_neigh nh = {.nh_family = fib.family};

	if (fib.family == AF_INET6)
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
	else
		nh.ipv4_nh = fib.ipv4_dst;
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);

stack:
	/* Local delivery, or a route the program does not take: the stack
	 * gets the translated packet. */
	if (rewrite && tc_rewrite(skb, p, rw)) {
		*v = XVS_V_DROP_REWRITE;
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

/* Apply a rewrite: source first, then destination (each helper updates
 * the checksums for its own field). */
static __always_inline int tc_rewrite(struct __sk_buff *skb, const struct xvs_pkt *p,
				      const struct xvs_rewrite *rw)
{
	if (p->family == XVS_FAMILY_IPV6) {
		if (nat_rewrite_v6(skb, p, true, rw->saddr, rw->sport))
			return -1;
		return nat_rewrite_v6(skb, p, false, rw->daddr, rw->dport);
	}
	if (nat_rewrite_v4(skb, p, true, rw->saddr, rw->sport))
		return -1;
	return nat_rewrite_v4(skb, p, false, rw->daddr, rw->dport);
}

/* The forwarding of a translated packet, from its flow's netfilter flags;
 * a flow netfilter masquerades gets the mark its POSTROUTING rule looks
 * for. */
static __always_inline __u32 tc_how(struct __sk_buff *skb, __u32 nf_flags, __u32 how)
{
	if (!(nf_flags & XVS_CT_F_NETFILTER))
		return how;
	if (nf_flags & XVS_CT_F_NF_MASQ) {
		__u32 zero = 0;
		const struct xvs_config *cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);

		if (cfg)
			skb->mark |= cfg->masq_mark;
	}
	return how | TC_FWD_STACK;
}

/* l3: the device has no link-layer header (tun, IPIP, WireGuard): the
 * network header is the packet's start. */
static __always_inline int handle_ip(struct __sk_buff *skb, bool l3)
{
	bool v6 = skb->protocol == bpf_htons(ETH_P_IPV6);
	__u32 l3_off = l3 ? 0 : ETH_HLEN;
	struct flow_scratch *sc = flow_scratch();
	__u32 xdp_nf = 0;
	bool xdp = xdp_done(skb, &xdp_nf);
	int ret;

	if (!sc)
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	struct xvs_pkt *p = &sc->pkt;
	struct flow_res *res = &sc->res;

	res->len = skb->len;
	switch (v6 ? parse_ipv6(skb, l3_off, p) : parse_ipv4(skb, l3_off, p)) {
	case XVS_PARSE_OK:
		break;
	case XVS_PARSE_IGNORE:
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	case XVS_PARSE_FRAGMENT:
		return verdict(TC_ACT_OK, XVS_V_PASS_FRAGMENT, skb);
	default:
		return verdict(TC_ACT_OK, XVS_V_PASS_MALFORMED, skb);
	}
	if (xdp) {
		/* The XDP program already translated it: only forwarding is
		 * left (see lib/xdp.h). */
		__builtin_memcpy(res->rw.saddr, p->saddr, 16);
		__builtin_memcpy(res->rw.daddr, p->daddr, 16);
		res->rw.sport = p->sport;
		res->rw.dport = p->dport;
		res->verdict = XVS_V_FWD_XDP;
		ret = tc_forward(skb, p, &res->rw, &res->verdict, tc_how(skb, xdp_nf, 0));
		return verdict(ret, res->verdict, skb);
	}

	p->ifindex = skb->ingress_ifindex;
	switch (flow_process(skb, p, res)) {
	case XVS_ACT_NAT:
		ret = tc_forward(skb, p, &res->rw, &res->verdict, tc_how(skb, res->nf_flags, TC_FWD_REWRITE));
		return verdict(ret, res->verdict, skb);
	case XVS_ACT_DROP:
		return verdict(TC_ACT_SHOT, res->verdict, skb);
	case XVS_ACT_REJECT:
		ret = reject_packet(skb, p);
		if (ret < 0)
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REJECT_FAILED, skb);
		return verdict(ret, res->verdict, skb);
	}
	return verdict(TC_ACT_OK, res->verdict, skb);
}

SEC("tc")
int xvs_tc_ingress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP) || skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_ip(skb, false);
	return verdict(TC_ACT_OK, XVS_V_PASS, skb);
}

/* The same for devices without a link-layer header (the loader picks it by
 * the device's type). */
SEC("tc")
int xvs_tc_ingress_l3(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP) || skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_ip(skb, true);
	return verdict(TC_ACT_OK, XVS_V_PASS, skb);
}

/* tc egress: replies of hostNetwork endpoints on this node, and in
 * netfilter mode of every flow (see flow_egress). They were routed (and
 * filtered) by the stack already and go on out of this device; only their
 * source changes back to the frontend. A node in bypass mode without such
 * endpoints pays one map lookup per packet. */
static __always_inline int handle_egress(struct __sk_buff *skb, bool v6, bool l3)
{
	__u32 l3_off = l3 ? 0 : ETH_HLEN;
	__u32 zero = 0;
	const struct xvs_config *cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);

	if (!cfg || !(cfg->flags & (XVS_CFG_HOST_BACKENDS | XVS_CFG_NETFILTER)))
		return TC_ACT_OK;
	struct flow_scratch *sc = flow_scratch();

	if (!sc)
		return TC_ACT_OK;
	struct xvs_pkt *p = &sc->pkt;
	struct flow_res *res = &sc->res;

	res->len = skb->len;
	switch (v6 ? parse_ipv6(skb, l3_off, p) : parse_ipv4(skb, l3_off, p)) {
	case XVS_PARSE_OK:
		break;
	case XVS_PARSE_IGNORE:
		/* Perhaps an ICMP error about one of the flows reverse-NATed
		 * here (lib/icmp.h). */
		if (!v6 && icmp_error_egress(skb, l3_off) < 0)
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
	p->ifindex = skb->ifindex;
	if (flow_egress(p, res) != XVS_ACT_NAT)
		return TC_ACT_OK;
	if (tc_rewrite(skb, p, &res->rw))
		return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	return verdict(TC_ACT_OK, res->verdict, skb);
}

SEC("tc")
int xvs_tc_egress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return handle_egress(skb, false, false);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_egress(skb, true, false);
	return TC_ACT_OK;
}

SEC("tc")
int xvs_tc_egress_l3(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return handle_egress(skb, false, true);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_egress(skb, true, true);
	return TC_ACT_OK;
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
const enum xvs_config_flags *_unused_config_flags __attribute__((unused));
const enum xvs_port_ranges *_unused_port_ranges __attribute__((unused));
const struct xvs_sched_key *_unused_sched_key __attribute__((unused));
const struct xvs_affinity_key *_unused_affinity_key __attribute__((unused));
const struct xvs_affinity_value *_unused_affinity_value __attribute__((unused));
const struct xvs_member_key *_unused_member_key __attribute__((unused));
const struct xvs_lpm_key *_unused_lpm_key __attribute__((unused));
const struct xvs_vip_key *_unused_vip_key __attribute__((unused));
const struct xvs_sock_key *_unused_sock_key __attribute__((unused));
const struct xvs_sock_value *_unused_sock_value __attribute__((unused));
const enum xvs_ct_flags *_unused_ct_flags __attribute__((unused));
const enum xvs_verdict *_unused_verdict __attribute__((unused));
const enum xvs_ct_state *_unused_ct_state __attribute__((unused));
const struct xvs_if_addrs *_unused_if_addrs __attribute__((unused));
