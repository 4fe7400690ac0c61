/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: from an skb to the tuple the load balancer works on.
 * Anything we cannot parse is left untouched (XVS_V_PASS_MALFORMED): the
 * kernel stack is a better judge of a broken packet than we are. */
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
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

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

/* Read the ports (and TCP flags) of the L4 header at p->l4_off. */
static __always_inline int parse_l4(struct __sk_buff *skb, struct xvs_pkt *p)
{
	__u32 off = p->l4_off;
	__u8 proto = p->proto;

	/* A constant bound on the offset lets the verifier follow it. */
	if (off > 128)
		return -1;
	if (bpf_skb_pull_data(skb, off + l4_hdr_len(proto)))
		return -1;

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *l4 = data + off;

	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > data_end)
			return -1;
		if (th->doff < 5)
			return -1;
		p->sport = th->source;
		p->dport = th->dest;
		p->tcp_flags = ((__u8 *)th)[13];
	} else {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > data_end)
			return -1;
		p->sport = uh->source;
		p->dport = uh->dest;
	}
	p->has_l4 = true;
	return 0;
}

/* Parse an IPv4 packet whose network header starts at l3_off. Returns one of
 * the XVS_PARSE_* codes and fills p. */
static __attribute__((noinline)) int parse_ipv4(struct __sk_buff *skb, __u32 l3_off, struct xvs_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + l3_off;

	if ((void *)(ip + 1) > data_end) {
		/* Headers may sit in a non-linear part: pull and retry once. */
		if (bpf_skb_pull_data(skb, l3_off + sizeof(*ip)))
			return XVS_PARSE_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip = data + l3_off;
		if ((void *)(ip + 1) > data_end)
			return XVS_PARSE_MALFORMED;
	}
	if (ip->version != 4 || ip->ihl < 5)
		return XVS_PARSE_MALFORMED;
	if (!l4_balanced(ip->protocol))
		return XVS_PARSE_IGNORE;

	__u32 ihl = ip->ihl * 4;
	__u16 tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < ihl || l3_off + tot_len > skb->len)
		return XVS_PARSE_MALFORMED;

	p->l3_off = l3_off;
	p->l4_off = l3_off + ihl;
	p->len = tot_len;
	p->family = XVS_FAMILY_IPV4;
	/* Read before any pull: pulling invalidates packet pointers. */
	__be32 saddr = ip->saddr, daddr = ip->daddr;
	__builtin_memcpy(p->saddr, &saddr, sizeof(saddr));
	__builtin_memcpy(p->daddr, &daddr, sizeof(daddr));
	p->proto = ip->protocol;
	p->tcp_flags = 0;
	__be16 ip_id = ip->id;

	__u16 frag = bpf_ntohs(ip->frag_off);
	if (frag & IP_OFFSET) {
		/* A later fragment: no ports here; take them from the first. */
		struct xvs_frag_key fk = {
			.saddr = saddr,
			.daddr = daddr,
			.id = ip_id,
			.proto = p->proto,
		};
		struct xvs_frag_ports *fp = bpf_map_lookup_elem(&xvs_fragments, &fk);
		if (!fp)
			return XVS_PARSE_FRAGMENT;
		p->sport = fp->sport;
		p->dport = fp->dport;
		p->has_l4 = false;
		return XVS_PARSE_OK;
	}

	if (tot_len < ihl + l4_hdr_len(p->proto))
		return XVS_PARSE_MALFORMED;
	if (parse_l4(skb, p))
		return XVS_PARSE_MALFORMED;
	if (frag & IP_MF) {
		/* First fragment of several: remember its ports. */
		struct xvs_frag_key fk = {
			.saddr = saddr,
			.daddr = daddr,
			.id = ip_id,
			.proto = p->proto,
		};
		struct xvs_frag_ports fp = {.sport = p->sport, .dport = p->dport};
		bpf_map_update_elem(&xvs_fragments, &fk, &fp, BPF_ANY);
	}
	return XVS_PARSE_OK;
}

/* IPv6 extension headers the parser walks (RFC 8200 4.1). */
#define IPV6_EXT_HOPOPTS  0
#define IPV6_EXT_ROUTING  43
#define IPV6_EXT_FRAGMENT 44
#define IPV6_EXT_DSTOPTS  60
#define IPV6_EXT_MAX	  4
#define IPV6_FRAG_OFFSET  0xfff8
#define IPV6_FRAG_MF	  0x0001

struct ipv6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};

/* The ports of an IPv6 fragmented datagram (by source, destination,
 * identification and protocol): recorded from its first fragment (record),
 * or looked up into p for a later one. Returns nonzero when a later
 * fragment's datagram is unknown. A subprogram: its key stays off the
 * parser's stack. */
static __attribute__((noinline)) int frag6_ports(struct xvs_pkt *p, __be32 id, bool record)
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

/* Parse an IPv6 packet whose header starts at l3_off, through up to
 * IPV6_EXT_MAX extension headers (hop-by-hop, routing, destination
 * options, fragment) to TCP, UDP or SCTP. A later fragment takes its ports
 * from the first, as for IPv4. */
static __always_inline int parse_ipv6(struct __sk_buff *skb, __u32 l3_off, struct xvs_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + l3_off;

	if ((void *)(ip6 + 1) > data_end) {
		if (bpf_skb_pull_data(skb, l3_off + sizeof(*ip6)))
			return XVS_PARSE_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip6 = data + l3_off;
		if ((void *)(ip6 + 1) > data_end)
			return XVS_PARSE_MALFORMED;
	}
	if (ip6->version != 6)
		return XVS_PARSE_MALFORMED;

	__u32 plen = bpf_ntohs(ip6->payload_len);
	__u8 nexthdr = ip6->nexthdr;

	if (l3_off + sizeof(*ip6) + plen > skb->len)
		return XVS_PARSE_MALFORMED;
	p->l3_off = l3_off;
	p->len = sizeof(*ip6) + plen;
	p->family = XVS_FAMILY_IPV6;
	p->tcp_flags = 0;
	__builtin_memcpy(p->saddr, &ip6->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6->daddr, 16);

	__u32 off = l3_off + sizeof(*ip6);
	struct ipv6_frag_hdr fh;
	bool frag = false;

	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		if (l4_balanced(nexthdr))
			break;
		if (nexthdr == IPV6_EXT_FRAGMENT) {
			if (frag || bpf_skb_load_bytes(skb, off, &fh, sizeof(fh)))
				return XVS_PARSE_MALFORMED;
			frag = true;
			nexthdr = fh.nexthdr;
			off += sizeof(fh);
			continue;
		}
		if (nexthdr != IPV6_EXT_HOPOPTS && nexthdr != IPV6_EXT_ROUTING && nexthdr != IPV6_EXT_DSTOPTS)
			return XVS_PARSE_IGNORE;
		__u8 ext[2];

		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)))
			return XVS_PARSE_MALFORMED;
		nexthdr = ext[0];
		off += ((__u32)ext[1] + 1) * 8;
	}
	if (!l4_balanced(nexthdr))
		return XVS_PARSE_IGNORE;
	if (off > l3_off + sizeof(*ip6) + plen)
		return XVS_PARSE_MALFORMED;
	p->proto = nexthdr;
	p->l4_off = off;

	if (frag && (bpf_ntohs(fh.frag_off) & IPV6_FRAG_OFFSET)) {
		/* A later fragment: no ports here; take them from the first. */
		if (frag6_ports(p, fh.id, false))
			return XVS_PARSE_FRAGMENT;
		p->has_l4 = false;
		return XVS_PARSE_OK;
	}
	if (off + l4_hdr_len(nexthdr) > l3_off + sizeof(*ip6) + plen)
		return XVS_PARSE_MALFORMED;
	if (parse_l4(skb, p))
		return XVS_PARSE_MALFORMED;
	if (frag && (bpf_ntohs(fh.frag_off) & IPV6_FRAG_MF))
		frag6_ports(p, fh.id, true); /* first of several: remember */
	return XVS_PARSE_OK;
}

#endif
