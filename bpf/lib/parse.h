/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: from the bytes of a packet to the tuple the load
 * balancer works on. One parser for every hook: it reads headers between
 * data and data_end (direct packet access, the same for an skb and an XDP
 * buffer) and, when they go on past data_end, says how many bytes it needs
 * (XVS_PARSE_SHORT); the tc programs pull that much into the skb's linear
 * part and parse again, XDP leaves such a packet to tc. Anything we cannot
 * parse is left untouched (XVS_V_PASS_MALFORMED): the kernel stack is a
 * better judge of a broken packet than we are. */
#ifndef XVS_PARSE_H
#define XVS_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "types.h"

#define IP_MF	  0x2000
#define IP_OFFSET 0x1fff

enum {
	XVS_PARSE_OK = 0,
	XVS_PARSE_IGNORE,    /* not a protocol we balance */
	XVS_PARSE_MALFORMED, /* truncated or inconsistent headers */
	XVS_PARSE_FRAGMENT,  /* non-first fragment of an unknown flow */
	XVS_PARSE_SHORT,     /* headers past data_end: xvs_pkt.need bytes wanted */
};

/* The tuple. Addresses are 16 bytes as in every map: IPv4 uses the first
 * four and leaves the rest zero, so keys are built the same way for both
 * families. len is the IP packet's length (header included). */
struct xvs_pkt {
	/* The interface the packet arrived on (tc egress: leaves by). */
	__u32 ifindex;
	__u32 l3_off;
	__u32 l4_off;
	__u32 len;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 family;
	/* Which xvs_lb_scan slot a least-connection scan of this packet
	 * uses (the packet path's or the socket hooks'). */
	__u8 scan_slot;
	/* The L4 header is in this packet (false for non-first fragments). */
	bool has_l4;
	/* The packet is a fragment (first or later) of an IP datagram. */
	bool fragment;
	/* With XVS_PARSE_SHORT: how many bytes from the packet's start the
	 * parser needs to read directly. */
	__u16 need;
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* csum_fold folds a 32-bit one's-complement sum (bpf_csum_diff's) to the
 * 16-bit checksum field's value. */
static __always_inline __u16 csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

static __always_inline __be32 addr_v4(const __u8 addr[16])
{
	__be32 a;

	__builtin_memcpy(&a, addr, sizeof(a));
	return a;
}

/* Addresses are only 4-byte aligned (in xvs_pkt and map values): compare
 * them a 32-bit word at a time. */
static __always_inline bool addr_is_zero(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;

	return (w[0] | w[1] | w[2] | w[3]) == 0;
}

static __always_inline bool addr_eq(const __u8 a[16], const __u8 b[16])
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

/* SCTP's common header: ports as in UDP, then verification tag and a
 * CRC32c checksum that, unlike TCP's and UDP's, does not cover the IP
 * addresses. */
#define SCTP_HDR_LEN 12

/* How far into a packet the L4 header may start: a constant bound lets
 * the verifier follow packet offsets computed from header lengths. */
#define PARSE_MAX_L4_OFF 128

static __always_inline int l4_hdr_len(__u8 proto)
{
	if (proto == IPPROTO_TCP)
		return sizeof(struct tcphdr);
	return proto == IPPROTO_SCTP ? SCTP_HDR_LEN : sizeof(struct udphdr);
}

static __always_inline bool l4_balanced(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

static __always_inline int parse_short(struct xvs_pkt *p, __u32 need)
{
	p->need = need;
	return XVS_PARSE_SHORT;
}

/* Read the ports (and TCP flags) of the L4 header at p->l4_off. A TCP
 * header longer than its segment, or a UDP length below 8 or past the
 * datagram, is malformed: netfilter's conntrack calls such packets INVALID
 * (tcp_error, udp_error) and kube-proxy drops them; they are passed to the
 * stack untranslated, which drops them too. A first fragment must hold
 * the whole TCP header (RFC 1858); its UDP length covers the datagram, of
 * which it carries a part, so only its lower bound is judged. */
static __always_inline int parse_l4(void *data, void *data_end, struct xvs_pkt *p)
{
	__u32 off = p->l4_off;
	__u32 l4_len = p->l3_off + p->len - off;

	if (off > PARSE_MAX_L4_OFF)
		return XVS_PARSE_MALFORMED;
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = data + off;

		if ((void *)(th + 1) > data_end)
			return parse_short(p, off + sizeof(*th));
		if (th->doff < 5 || (__u32)th->doff * 4 > l4_len)
			return XVS_PARSE_MALFORMED;
		p->sport = th->source;
		p->dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
	} else {
		/* UDP, and SCTP's ports in the same place. */
		struct udphdr *uh = data + off;

		if ((void *)(uh + 1) > data_end)
			return parse_short(p, off + sizeof(*uh));
		if (p->proto == IPPROTO_UDP &&
		    (bpf_ntohs(uh->len) < sizeof(*uh) || (!p->fragment && bpf_ntohs(uh->len) > l4_len)))
			return XVS_PARSE_MALFORMED;
		p->sport = uh->source;
		p->dport = uh->dest;
	}
	p->has_l4 = true;
	return XVS_PARSE_OK;
}

/* The ports of an IPv4 fragmented datagram (by source, destination,
 * identification and protocol): recorded from its first fragment
 * (record), or looked up into p for a later one. Returns nonzero when a
 * later fragment's datagram is unknown. */
static __always_inline int frag4_ports(struct xvs_pkt *p, __be16 id, bool record)
{
	struct xvs_frag_key fk = {
		.saddr = addr_v4(p->saddr),
		.daddr = addr_v4(p->daddr),
		.id = id,
		.proto = p->proto,
	};
	struct xvs_frag_ports *fp;

	if (record) {
		struct xvs_frag_ports v = {.sport = p->sport, .dport = p->dport};

		bpf_map_update_elem(&xvs_fragments, &fk, &v, BPF_ANY);
		return 0;
	}
	fp = bpf_map_lookup_elem(&xvs_fragments, &fk);
	if (!fp)
		return -1;
	p->sport = fp->sport;
	p->dport = fp->dport;
	return 0;
}

/* An IPv4 packet whose header starts at l3_off. */
static __always_inline int parse_ipv4(void *data, void *data_end, __u32 l3_off, __u32 wire_len,
				      struct xvs_pkt *p)
{
	struct iphdr *ip = data + l3_off;

	if ((void *)(ip + 1) > data_end)
		return parse_short(p, l3_off + sizeof(*ip));
	if (ip->version != 4 || ip->ihl < 5)
		return XVS_PARSE_MALFORMED;
	if (!l4_balanced(ip->protocol))
		return XVS_PARSE_IGNORE;

	__u32 ihl = ip->ihl * 4;
	__u16 tot_len = bpf_ntohs(ip->tot_len);

	if (tot_len < ihl || l3_off + tot_len > wire_len)
		return XVS_PARSE_MALFORMED;
	p->l4_off = l3_off + ihl;
	p->len = tot_len;
	__builtin_memcpy(p->saddr, &ip->saddr, 4);
	__builtin_memcpy(p->daddr, &ip->daddr, 4);
	p->proto = ip->protocol;

	__u16 frag = bpf_ntohs(ip->frag_off);
	__be16 id = ip->id;

	p->fragment = frag & (IP_MF | IP_OFFSET);
	if (frag & IP_OFFSET) {
		/* A later fragment: no ports here; take them from the first. */
		if (frag4_ports(p, id, false))
			return XVS_PARSE_FRAGMENT;
		return XVS_PARSE_OK;
	}
	if (tot_len < ihl + l4_hdr_len(p->proto))
		return XVS_PARSE_MALFORMED;

	int r = parse_l4(data, data_end, p);

	if (r == XVS_PARSE_OK && (frag & IP_MF))
		frag4_ports(p, id, true); /* first of several: remember */
	return r;
}

/* IPv6 extension headers the parser walks (RFC 8200 4.1). */
#define IPV6_EXT_HOPOPTS  0
#define IPV6_EXT_ROUTING  43
#define IPV6_EXT_FRAGMENT 44
#define IPV6_EXT_DSTOPTS  60
#define IPV6_EXT_MAX	  4
#define IPV6_FRAG_OFFSET  0xfff8
#define IPV6_FRAG_MF	  0x0001

/* The fragment header, and the first two bytes every other extension
 * header starts with (next header, length in 8 bytes beyond the first). */
struct ipv6_ext_hdr {
	__u8 nexthdr;
	__u8 len;
	__be16 frag_off;
	__be32 id;
};

/* The ports of an IPv6 fragmented datagram, as frag4_ports. */
static __always_inline int frag6_ports(struct xvs_pkt *p, __be32 id, bool record)
{
	struct xvs_frag6_key fk = {.id = id, .proto = p->proto};
	struct xvs_frag_ports *fp;

	__builtin_memcpy(fk.saddr, p->saddr, 16);
	__builtin_memcpy(fk.daddr, p->daddr, 16);
	if (record) {
		struct xvs_frag_ports v = {.sport = p->sport, .dport = p->dport};

		bpf_map_update_elem(&xvs_fragments6, &fk, &v, BPF_ANY);
		return 0;
	}
	fp = bpf_map_lookup_elem(&xvs_fragments6, &fk);
	if (!fp)
		return -1;
	p->sport = fp->sport;
	p->dport = fp->dport;
	return 0;
}

/* An IPv6 packet whose header starts at l3_off, through up to
 * IPV6_EXT_MAX extension headers (hop-by-hop, routing, destination
 * options, fragment) to TCP, UDP or SCTP. A later fragment takes its ports
 * from the first, as for IPv4. */
static __always_inline int parse_ipv6(void *data, void *data_end, __u32 l3_off, __u32 wire_len,
				      struct xvs_pkt *p)
{
	struct ipv6hdr *ip6 = data + l3_off;

	if ((void *)(ip6 + 1) > data_end)
		return parse_short(p, l3_off + sizeof(*ip6));
	if (ip6->version != 6)
		return XVS_PARSE_MALFORMED;

	__u32 plen = bpf_ntohs(ip6->payload_len);
	__u32 end = l3_off + sizeof(*ip6) + plen;
	__u8 nexthdr = ip6->nexthdr;

	if (end > wire_len)
		return XVS_PARSE_MALFORMED;
	p->len = sizeof(*ip6) + plen;
	__builtin_memcpy(p->saddr, &ip6->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6->daddr, 16);

	__u32 off = l3_off + sizeof(*ip6);
	__be16 frag_off = 0;
	__be32 frag_id = 0;

	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		if (l4_balanced(nexthdr))
			break;
		if (nexthdr != IPV6_EXT_HOPOPTS && nexthdr != IPV6_EXT_ROUTING &&
		    nexthdr != IPV6_EXT_DSTOPTS && nexthdr != IPV6_EXT_FRAGMENT)
			return XVS_PARSE_IGNORE;
		if (off > PARSE_MAX_L4_OFF)
			return XVS_PARSE_MALFORMED;

		struct ipv6_ext_hdr *h = data + off;

		if ((void *)(h + 1) > data_end)
			return parse_short(p, off + sizeof(*h));
		if (nexthdr == IPV6_EXT_FRAGMENT) {
			if (p->fragment)
				return XVS_PARSE_MALFORMED;
			p->fragment = true;
			frag_off = h->frag_off;
			frag_id = h->id;
			off += sizeof(*h);
		} else {
			off += ((__u32)h->len + 1) * 8;
		}
		nexthdr = h->nexthdr;
	}
	if (!l4_balanced(nexthdr))
		return XVS_PARSE_IGNORE;
	if (off > end)
		return XVS_PARSE_MALFORMED;
	p->proto = nexthdr;
	p->l4_off = off;

	if (p->fragment && (bpf_ntohs(frag_off) & IPV6_FRAG_OFFSET)) {
		/* A later fragment: no ports here; take them from the first. */
		if (frag6_ports(p, frag_id, false))
			return XVS_PARSE_FRAGMENT;
		return XVS_PARSE_OK;
	}
	if (off + l4_hdr_len(nexthdr) > end)
		return XVS_PARSE_MALFORMED;

	int r = parse_l4(data, data_end, p);

	if (r == XVS_PARSE_OK && p->fragment && (bpf_ntohs(frag_off) & IPV6_FRAG_MF))
		frag6_ports(p, frag_id, true); /* first of several: remember */
	return r;
}

/* Parse the packet in [data, data_end) whose network header, of family
 * p->family, starts at p->l3_off (0 or ETH_HLEN); wire_len is the length
 * of the whole packet, of which an skb's linear part may hold less.
 * Returns one of the XVS_PARSE_* codes and fills p. A subprogram: every
 * hook verifies one copy, however often it calls it. */
static __noinline int parse_packet(void *data, void *data_end, __u32 wire_len, struct xvs_pkt *p)
{
	__u32 l3_off = p->l3_off;

	if (l3_off > ETH_HLEN)
		return XVS_PARSE_MALFORMED;
	p->tcp_flags = 0;
	p->has_l4 = false;
	p->fragment = false;
	if (p->family == XVS_FAMILY_IPV6)
		return parse_ipv6(data, data_end, l3_off, wire_len, p);
	return parse_ipv4(data, data_end, l3_off, wire_len, p);
}

#endif
