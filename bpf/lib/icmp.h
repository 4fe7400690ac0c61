/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors about translated flows (IPv4). A router or the backend's
 * node answers a packet of a flow with an error quoting that packet as it
 * saw it: from the client (or the masquerade address) to the backend. The
 * client's socket knows only the frontend, so, as netfilter's NAT does for
 * RELATED packets, the quote is translated back (source to the client,
 * destination to the frontend), the error goes to the client, and comes
 * from the frontend when the backend itself sent it. Done at the egress of
 * the device the error leaves by, for the flows that are reverse-NATed
 * there (netfilter mode, hostNetwork endpoints): netfilter has already
 * undone its own masquerade of the quote. */
#ifndef XVS_ICMP_H
#define XVS_ICMP_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "ct.h"
#include "flags.h"
#include "maps.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

#define ICMP_DEST_UNREACH_T  3
#define ICMP_TIME_EXCEEDED_T 11
#define ICMP_PARAMETERPROB_T 12

/* The quoted packet: an option-less IPv4 header and its first 8 bytes. */
struct icmp_quote {
	struct iphdr ip;
	__be16 sport;
	__be16 dport;
	__be32 rest;
};

static __always_inline __u16 ip_header_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The flow whose reply entry rk is, from either table, when it is one
 * reverse-NATed at egress. */
static __always_inline struct xvs_ct_entry *icmp_flow(const struct xvs_ct_key *rk, __u64 now,
						      struct xvs_ct_entry **rev)
{
	struct xvs_ct_entry *e = bpf_map_lookup_elem(&xvs_conntrack, rk);
	bool unreplied = false;

	if (!e) {
		e = bpf_map_lookup_elem(&xvs_ct_unreplied, rk);
		unreplied = true;
	}
	if (!e || !ct_is_reply(e) || !ct_reversed_at_egress(e))
		return NULL;
	*rev = e;
	return ct_flow_of(rk, e, now, unreplied);
}

/* Translate an ICMP error leaving by this device (l3_off: where its IPv4
 * header starts) if it is about a flow of ours. Returns 1 when it did, 0
 * when the packet is not such an error, -1 when the rewrite failed. */
static __attribute__((noinline)) int icmp_error_egress(struct __sk_buff *skb, __u32 l3_off)
{
	struct icmp_quote q, nq;
	struct xvs_ct_key rk = {};
	struct xvs_ct_entry *rev = NULL;
	struct iphdr outer;
	__u8 type, a[16] = {}, b[16] = {};

	if (bpf_skb_load_bytes(skb, l3_off, &outer, sizeof(outer)) || outer.protocol != IPPROTO_ICMP ||
	    outer.ihl != 5 || (outer.frag_off & bpf_htons(0x3fff)))
		return 0;
	__u32 icmp_off = l3_off + sizeof(outer);

	if (bpf_skb_load_bytes(skb, icmp_off, &type, 1))
		return 0;
	if (type != ICMP_DEST_UNREACH_T && type != ICMP_TIME_EXCEEDED_T && type != ICMP_PARAMETERPROB_T)
		return 0;
	if (bpf_skb_load_bytes(skb, icmp_off + 8, &q, sizeof(q)) || q.ip.ihl != 5 ||
	    (q.ip.protocol != IPPROTO_TCP && q.ip.protocol != IPPROTO_UDP))
		return 0;
	/* The quote went from the flow's source to the backend: the flow's
	 * reply entry is backend -> that source. */
	__builtin_memcpy(a, &q.ip.daddr, 4);
	__builtin_memcpy(b, &q.ip.saddr, 4);
	ct_key(&rk, a, b, q.dport, q.sport, q.ip.protocol, XVS_FAMILY_IPV4);
	if (!icmp_flow(&rk, bpf_ktime_get_ns(), &rev) || !rev)
		return 0;

	nq = q;
	__builtin_memcpy(&nq.ip.saddr, rev->snat_addr, 4);
	nq.sport = rev->snat_port;
	__builtin_memcpy(&nq.ip.daddr, rev->nat_addr, 4);
	nq.dport = rev->nat_port;
	nq.ip.check = 0;
	nq.ip.check = ip_header_csum(&nq.ip);

	__s64 diff = bpf_csum_diff((__be32 *)&q, sizeof(q), (__be32 *)&nq, sizeof(nq), 0);

	if (diff < 0 || bpf_skb_store_bytes(skb, icmp_off + 8, &nq, sizeof(nq), 0) ||
	    bpf_l4_csum_replace(skb, icmp_off + 2, 0, diff, 0))
		return -1;

	/* The outer header: to the client, and from the frontend if the
	 * backend sent it (a router on the way keeps its own address). */
	__be32 src = outer.saddr, dst = nq.ip.saddr;

	if (outer.saddr == q.ip.daddr)
		src = nq.ip.daddr;
	if (src != outer.saddr &&
	    (bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, saddr), &src, 4, 0) ||
	     bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), outer.saddr, src, 4)))
		return -1;
	if (dst != outer.daddr &&
	    (bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, daddr), &dst, 4, 0) ||
	     bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), outer.daddr, dst, 4)))
		return -1;
	stats_verdict(XVS_V_REPLY_ICMP, skb->len);
	return 1;
}

#endif
