/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The XDP fast path's helpers (the program is in xvs.c), for the node's
 * external interfaces: NodePort,
 * ExternalIP and LoadBalancer traffic (and any other frontend) is decided
 * and translated before an skb exists. Drops (source ranges, Local policy
 * without local endpoints, invalid packets) end here. Translated packets go
 * up with a mark in the XDP metadata, and tc ingress, seeing it, only
 * forwards them (a masqueraded packet must bypass the stack's input
 * routing). What XDP cannot do, it passes untouched to tc, which decides
 * again: fragments, REJECT replies, packets too big for the egress MTU,
 * packets when metadata is unsupported. */
#ifndef XVS_XDP_H
#define XVS_XDP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

#define XVS_XDP_MAGIC 0x58565344 /* "XVSD" */

struct xvs_xdp_meta {
	__u32 magic;
	/* The flow's netfilter flags (flow_res.nf_flags), for tc. */
	__u32 nf_flags;
};

/* RFC 1624 incremental update of a 16-bit one's complement checksum. */
static __always_inline __u16 csum16_replace(__u16 check, __u16 from, __u16 to)
{
	__u32 sum = (__u16)~check + (__u16)~from + (__u32)to;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

static __always_inline __u16 csum32_replace(__u16 check, __be32 from, __be32 to)
{
	check = csum16_replace(check, (__u16)(from >> 16), (__u16)(to >> 16));
	return csum16_replace(check, (__u16)from, (__u16)to);
}

/* Can XDP translate p itself? An IPv4 TCP or UDP packet that is not a
 * fragment: anything else goes to tc (which has the rewriting for IPv6,
 * SCTP and fragments). */
static __always_inline bool xdp_translatable(const struct xvs_pkt *p)
{
	return p->family == XVS_FAMILY_IPV4 && p->has_l4 && !p->fragment &&
	       (p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP);
}

/* Parse the frame with the one parser (lib/parse.h): true for a packet
 * XDP translates itself. IPv6 is tc's (XDP rewrites IPv4 only) and is not
 * even parsed here. A subprogram, so that the program's own frame stays
 * small beside the decision's deepest chain. */
static __noinline bool xdp_parse(struct xdp_md *ctx, struct xvs_pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return false;
	p->l3_off = ETH_HLEN;
	p->family = XVS_FAMILY_IPV4;
	p->ifindex = ctx->ingress_ifindex;
	return parse_packet(data, data_end, data_end - data, p) == XVS_PARSE_OK && xdp_translatable(p);
}

/* Rewrite addresses and ports in place, checksums updated incrementally
 * (the L4 checksum covers the addresses through the pseudo header; a UDP
 * checksum of zero means none and stays zero). A subprogram: its
 * temporaries stay off the program's frame, which the decision's deepest
 * call chain adds to. */
static __noinline bool xdp_rewrite(struct xdp_md *ctx, const struct xvs_pkt *p, const struct xvs_rewrite *rw)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__u32 l4_off = p->l4_off;
	__u16 *l4check;
	__be16 *ports;

	if ((void *)(ip + 1) > data_end || l4_off > PARSE_MAX_L4_OFF)
		return false;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = data + l4_off;

		if ((void *)(th + 1) > data_end)
			return false;
		l4check = &th->check;
		ports = &th->source;
	} else {
		struct udphdr *uh = data + l4_off;

		if ((void *)(uh + 1) > data_end)
			return false;
		l4check = &uh->check;
		ports = &uh->source;
	}
	__u16 check = *l4check;
	bool udp_none = p->proto == IPPROTO_UDP && check == 0;
	__be32 saddr = addr_v4(rw->saddr), daddr = addr_v4(rw->daddr);

	check = csum32_replace(check, ip->saddr, saddr);
	check = csum32_replace(check, ip->daddr, daddr);
	check = csum16_replace(check, ports[0], rw->sport);
	check = csum16_replace(check, ports[1], rw->dport);
	if (!udp_none)
		*l4check = (p->proto == IPPROTO_UDP && check == 0) ? 0xffff : check;
	ports[0] = rw->sport;
	ports[1] = rw->dport;

	__u16 ipcheck = ip->check;

	ipcheck = csum32_replace(ipcheck, ip->saddr, saddr);
	ip->check = csum32_replace(ipcheck, ip->daddr, daddr);
	ip->saddr = saddr;
	ip->daddr = daddr;
	return true;
}

/* Would the translated packet exceed the MTU of the device it routes to?
 * XDP sees single frames (no GSO), so the packet's IP length is what
 * crosses the link. Such a packet goes to tc untranslated: tc decides
 * again (the flow exists now) and answers frag-needed quoting the header
 * the client sent, which a packet XDP had rewritten no longer has. */
static __noinline bool xdp_too_big(struct xdp_md *ctx, const struct xvs_pkt *p, const struct xvs_rewrite *rw)
{
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.l4_protocol = p->proto,
		.sport = rw->sport,
		.dport = rw->dport,
		.tot_len = p->len,
		.ifindex = p->ifindex,
		.ipv4_src = addr_v4(rw->saddr),
		.ipv4_dst = addr_v4(rw->daddr),
	};

	return bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_FRAG_NEEDED;
}

/* In tc: did the XDP program translate this packet? The mark is consumed,
 * so that it cannot travel further with the skb. */
static __always_inline bool xdp_done(struct __sk_buff *skb, __u32 *nf_flags)
{
	void *data = (void *)(long)skb->data;
	struct xvs_xdp_meta *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > data || meta->magic != XVS_XDP_MAGIC)
		return false;
	meta->magic = 0;
	*nf_flags = meta->nf_flags;
	return true;
}

#endif
