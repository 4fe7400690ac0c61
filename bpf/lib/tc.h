/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The tc programs' side of a decision: parsing an skb (pulling headers
 * into its linear part as the parser asks), rewriting it through the
 * checksum helpers (which keep an skb's checksum state, offloaded or not,
 * right: XDP's frames have none and are rewritten in place, lib/xdp.h), and
 * forwarding the translated packet to its egress interface. */
#ifndef XVS_TC_H
#define XVS_TC_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow.h"
#include "maps.h"
#include "monitor.h"
#include "nat.h"
#include "parse.h"
#include "reject.h"
#include "stats.h"
#include "types.h"

#define AF_INET	 2
#define AF_INET6 10

static __always_inline int verdict(int action, __u32 v, const struct __sk_buff *skb)
{
	stats_verdict(v, skb->len);
	if (monitored(v))
		monitor_event(v, XVS_HOOK_TC);
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

/* A MAC of zeros: the FIB's source MAC for a device without MACs. */
static __always_inline bool mac_is_zero(const __u8 mac[ETH_ALEN])
{
	__u16 w[3];

	__builtin_memcpy(w, mac, ETH_ALEN);
	return (w[0] | w[1] | w[2]) == 0;
}

/* Send a translated packet out of the interface its route (fib, and the
 * lookup's result ret) names, as forwarding would: the TTL (hop limit)
 * drops by one; with the neighbour resolved, the FIB's MACs go into the
 * Ethernet header and bpf_redirect sends it. Otherwise bpf_redirect_neigh
 * routes it again and sends it with the route attached: for an unresolved
 * neighbour, which it resolves, and for an egress device without MACs
 * (the FIB gives it no source MAC: IPIP, WireGuard, tun, GRE), whose
 * driver may need the route: an NBMA tunnel (Calico's tunl0, remote any)
 * takes its outer destination from the route's next hop and drops a
 * packet without one. */
static __always_inline int tc_send(struct __sk_buff *skb, const struct xvs_pkt *p, struct bpf_fib_lookup *fib,
				   long ret)
{
	bool v6 = p->family == XVS_FAMILY_IPV6;
	__u32 ttl_off = p->l3_off + (v6 ? offsetof(struct ipv6hdr, hop_limit) : offsetof(struct iphdr, ttl));
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
	bool direct = ret == BPF_FIB_LKUP_RET_SUCCESS && !mac_is_zero(fib->smac);

	if (!p->l3_off) {
		/* From a device without a link-layer header (l3_off 0): both
		 * redirect helpers want one, so it gets an Ethernet header (the
		 * FIB's MACs; bpf_redirect_neigh replaces a zero one, and a
		 * device without MACs drops it again). */
		struct ethhdr eth = {.h_proto = v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP)};

		if (direct) {
			__builtin_memcpy(eth.h_dest, fib->dmac, ETH_ALEN);
			__builtin_memcpy(eth.h_source, fib->smac, ETH_ALEN);
		}
		if (bpf_skb_change_head(skb, ETH_HLEN, 0) ||
		    bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0))
			return TC_ACT_SHOT;
		if (direct)
			return bpf_redirect(fib->ifindex, 0);
	} else if (direct) {
		if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), fib->dmac, ETH_ALEN, 0) ||
		    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), fib->smac, ETH_ALEN, 0))
			return TC_ACT_SHOT;
		return bpf_redirect(fib->ifindex, 0);
	}
	return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
}

/* Translate a packet (with TC_FWD_REWRITE in how; XDP may have done it)
 * and send it to where its new destination routes, or, with TC_FWD_STACK
 * (netfilter mode), hand it to the stack once the MTU is checked. Falls
 * back to the stack (TC_ACT_OK) for local destinations and anything the
 * FIB cannot answer.
 * The TTL (hop limit) drops by one, as forwarding does. The route is
 * looked up here, and again by bpf_redirect_neigh only where tc_send needs
 * it (an unresolved neighbour, a device without MACs). A packet too big for the egress MTU is answered
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

	if (p->family == XVS_FAMILY_IPV6) {
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

	return tc_send(skb, p, &fib, ret);

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

/* Parse the skb's packet (its network header at l3_off): one parser for
 * every hook (lib/parse.h), given more of the packet in the linear part
 * each time it asks, at most three times (IP header, extension headers,
 * L4 header). */
static __always_inline int tc_parse(struct __sk_buff *skb, __u32 l3_off, bool v6, struct xvs_pkt *p)
{
	int r = XVS_PARSE_MALFORMED;

	p->l3_off = l3_off;
	p->family = v6 ? XVS_FAMILY_IPV6 : XVS_FAMILY_IPV4;
	for (int i = 0; i < 4; i++) {
		r = parse_packet((void *)(long)skb->data, (void *)(long)skb->data_end, skb->len, p);
		if (r != XVS_PARSE_SHORT)
			return r;
		if (p->need > skb->len || bpf_skb_pull_data(skb, p->need))
			return XVS_PARSE_MALFORMED;
	}
	return XVS_PARSE_MALFORMED;
}

#endif
