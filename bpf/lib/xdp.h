/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The XDP fast path, for the node's external interfaces: NodePort,
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

/* Parse an IPv4 TCP/UDP packet in an XDP buffer. Fragments, IPv6 and
 * anything unusual return false: tc deals with them. */
static __always_inline bool xdp_parse(struct xdp_md *ctx, struct xvs_pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return false;
	if (ip->version != 4 || ip->ihl != 5 || (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return false;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return false;
	p->ifindex = ctx->ingress_ifindex;
	p->l3_off = ETH_HLEN;
	p->l4_off = ETH_HLEN + sizeof(*ip);
	p->len = bpf_ntohs(ip->tot_len);
	p->family = XVS_FAMILY_IPV4;
	__builtin_memcpy(p->saddr, &ip->saddr, 4);
	__builtin_memcpy(p->daddr, &ip->daddr, 4);
	p->proto = ip->protocol;
	p->has_l4 = true;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = (void *)(ip + 1);

		if ((void *)(th + 1) > data_end)
			return false;
		p->sport = th->source;
		p->dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
	} else {
		struct udphdr *uh = (void *)(ip + 1);

		if ((void *)(uh + 1) > data_end)
			return false;
		p->sport = uh->source;
		p->dport = uh->dest;
	}
	return true;
}

/* Rewrite addresses and ports in place, checksums updated incrementally
 * (the L4 checksum covers the addresses through the pseudo header; a UDP
 * checksum of zero means none and stays zero). */
static __always_inline bool xdp_rewrite(struct xdp_md *ctx, const struct xvs_pkt *p,
					const struct xvs_rewrite *rw)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__u16 *l4check;
	__be16 *ports;

	if ((void *)(ip + 1) > data_end)
		return false;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = (void *)(ip + 1);

		if ((void *)(th + 1) > data_end)
			return false;
		l4check = &th->check;
		ports = &th->source;
	} else {
		struct udphdr *uh = (void *)(ip + 1);

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

SEC("xdp")
int xvs_xdp(struct xdp_md *ctx)
{
	struct flow_scratch *sc = flow_scratch();
	__u32 len = ctx->data_end - ctx->data;

	if (!sc || !xdp_parse(ctx, &sc->pkt))
		return XDP_PASS;
	sc->res.len = len;
	/* Room for the mark first: without it, tc must do everything. */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct xvs_xdp_meta)))
		return XDP_PASS;

	void *data = (void *)(long)ctx->data;
	struct xvs_xdp_meta *meta = (void *)(long)ctx->data_meta;

	if ((void *)(meta + 1) > data)
		return XDP_PASS;
	meta->magic = 0;

	switch (flow_process(ctx, &sc->pkt, &sc->res)) {
	case XVS_ACT_NAT:
		if (xdp_too_big(ctx, &sc->pkt, &sc->res.rw))
			return XDP_PASS;
		if (!xdp_rewrite(ctx, &sc->pkt, &sc->res.rw)) {
			stats_verdict(XVS_V_DROP_REWRITE, len);
			return XDP_DROP;
		}
		meta = (void *)(long)ctx->data_meta;
		if ((void *)(meta + 1) > (void *)(long)ctx->data)
			return XDP_DROP;
		meta->magic = XVS_XDP_MAGIC;
		meta->nf_flags = sc->res.nf_flags;
		stats_verdict(sc->res.verdict, len);
		return XDP_PASS;
	case XVS_ACT_DROP:
		stats_verdict(sc->res.verdict, len);
		return XDP_DROP;
	}
	/* PASS and REJECT: tc decides again (and counts). */
	return XDP_PASS;
}

/* The floor for benchmarks: the cheapest possible XDP program. */
SEC("xdp")
int xvs_xdp_empty(struct xdp_md *ctx)
{
	return XDP_PASS;
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
