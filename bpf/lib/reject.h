/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* REJECT, as kube-proxy's filter rules do it for Services without usable
 * endpoints: a TCP RST for TCP, an ICMP port unreachable for UDP. The reply
 * is built in place from the offending packet and sent back out of the
 * interface it came in on, with the frontend as its source, so the client
 * sees "connection refused" at once instead of a timeout. */
#ifndef XVS_REJECT_H
#define XVS_REJECT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"

#define REJECT_TTL 64
/* The largest quote: an IPv4 header with options and 20 bytes of L4 (a
 * TCP header: an skb whose checksum is left to the device cannot be cut
 * shorter than its checksum field). */
#define ICMP_QUOTE_MAX (60 + 20)

/* RFC 792. Defined here because <linux/icmp.h> pulls in glibc's socket
 * headers, which a BPF target cannot include on every distribution. */
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3

struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 unused;
};

static __always_inline void ipv4_reply_hdr(struct iphdr *ip, const struct xvs_pkt *p, __u16 tot_len,
					   __u8 proto)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(tot_len);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = REJECT_TTL;
	ip->protocol = proto;
	ip->check = 0;
	ip->saddr = addr_v4(p->daddr);
	ip->daddr = addr_v4(p->saddr);
	ip->check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* Swap the Ethernet addresses (a device without them, l3_off 0, has none)
 * and send the packet back where it came from. */
static __always_inline int reject_bounce(struct __sk_buff *skb, const struct xvs_pkt *p)
{
	__u8 mac[2 * ETH_ALEN], swapped[2 * ETH_ALEN];

	if (!p->l3_off)
		return bpf_redirect(skb->ifindex, 0);
	if (bpf_skb_load_bytes(skb, 0, mac, sizeof(mac)))
		return -1;
	__builtin_memcpy(swapped, mac + ETH_ALEN, ETH_ALEN);
	__builtin_memcpy(swapped + ETH_ALEN, mac, ETH_ALEN);
	if (bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0))
		return -1;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reject_tcp(struct __sk_buff *skb, const struct xvs_pkt *p)
{
	struct tcphdr in, out = {};
	struct iphdr ip;

	if (p->tcp_flags & TCP_FLAG_RST)
		return -1; /* never answer a RST */
	if (bpf_skb_load_bytes(skb, p->l4_off, &in, sizeof(in)))
		return -1;

	/* RFC 9293 3.10.7.1: answer an ACK with seq = its ack, anything else
	 * with RST|ACK acknowledging all it occupied. */
	out.source = p->dport;
	out.dest = p->sport;
	out.doff = 5;
	out.rst = 1;
	if (in.ack) {
		out.seq = in.ack_seq;
	} else {
		__u32 seg_len = p->len - (p->l4_off - p->l3_off) - in.doff * 4;
		seg_len += in.syn + in.fin;
		out.ack = 1;
		out.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + seg_len);
	}

	if (bpf_skb_change_tail(skb, p->l3_off + sizeof(ip) + sizeof(out), 0))
		return -1;
	ipv4_reply_hdr(&ip, p, sizeof(ip) + sizeof(out), IPPROTO_TCP);

	struct {
		__be32 saddr, daddr;
		__u8 zero, proto;
		__be16 len;
	} pseudo = {ip.saddr, ip.daddr, 0, IPPROTO_TCP, bpf_htons(sizeof(out))};
	__u32 csum = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	out.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&out, sizeof(out), csum));

	if (bpf_skb_store_bytes(skb, p->l3_off, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip), &out, sizeof(out), 0))
		return -1;
	return reject_bounce(skb, p);
}

/* An ICMP error (type, code, and the header's second word: 0, or the
 * next-hop MTU of a frag-needed) quoting the offending packet's header and
 * 8 bytes of what follows, from the address it was sent to. */
static __always_inline int reject_icmp(struct __sk_buff *skb, const struct xvs_pkt *p, __u8 type, __u8 code,
				       __be32 word)
{
	__u8 quote[ICMP_QUOTE_MAX] = {};
	struct icmphdr icmp = {};
	struct iphdr ip;
	/* The header length is a multiple of 4 in 20..60: masking keeps the
	 * verifier (of older kernels too) sure of the quote's bounds. */
	__u32 hlen = (p->l4_off - p->l3_off) & 0x3c;
	__u32 qlen = hlen + (p->proto == IPPROTO_TCP ? 20 : 8);

	if (hlen < sizeof(ip))
		return -1;
	if (bpf_skb_load_bytes(skb, p->l3_off, quote, qlen))
		return -1;
	/* Keep the offending header and 8 bytes of it, then open room for
	 * our own IP and ICMP headers in front of it. */
	if (bpf_skb_change_tail(skb, p->l3_off + qlen, 0))
		return -1;
	if (bpf_skb_adjust_room(skb, sizeof(ip) + sizeof(icmp), BPF_ADJ_ROOM_MAC, 0))
		return -1;

	icmp.type = type;
	icmp.code = code;
	icmp.unused = word;
	__u32 csum = bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), 0);
	csum = bpf_csum_diff(NULL, 0, (__be32 *)quote, qlen & ~3U, csum);
	icmp.checksum = csum_fold(csum);
	ipv4_reply_hdr(&ip, p, sizeof(ip) + sizeof(icmp) + qlen, IPPROTO_ICMP);

	if (bpf_skb_store_bytes(skb, p->l3_off, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip), &icmp, sizeof(icmp), 0))
		return -1;
	return reject_bounce(skb, p);
}

/* IPv6 (RFC 4443: ICMPv6 destination unreachable, port unreachable). */
#define ICMP6_DST_UNREACH  1
#define ICMP6_PORT_UNREACH 4
#define IPPROTO_ICMPV6_	   58

struct ipv6_pseudo {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__u8 zero[3];
	__u8 nexthdr;
};

static __always_inline void ipv6_reply_hdr(struct ipv6hdr *ip6, struct ipv6_pseudo *ph,
					   const struct xvs_pkt *p, __u16 payload, __u8 nexthdr)
{
	__builtin_memset(ip6, 0, sizeof(*ip6));
	ip6->version = 6;
	ip6->payload_len = bpf_htons(payload);
	ip6->nexthdr = nexthdr;
	ip6->hop_limit = REJECT_TTL;
	__builtin_memcpy(&ip6->saddr, p->daddr, 16);
	__builtin_memcpy(&ip6->daddr, p->saddr, 16);
	__builtin_memset(ph, 0, sizeof(*ph));
	__builtin_memcpy(ph->saddr, p->daddr, 16);
	__builtin_memcpy(ph->daddr, p->saddr, 16);
	ph->len = bpf_htonl(payload);
	ph->nexthdr = nexthdr;
}

static __always_inline int reject_tcp6(struct __sk_buff *skb, const struct xvs_pkt *p)
{
	struct tcphdr in, out = {};
	struct ipv6hdr ip6;
	struct ipv6_pseudo ph;

	if (p->tcp_flags & TCP_FLAG_RST)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4_off, &in, sizeof(in)))
		return -1;
	out.source = p->dport;
	out.dest = p->sport;
	out.doff = 5;
	out.rst = 1;
	if (in.ack) {
		out.seq = in.ack_seq;
	} else {
		__u32 seg_len = p->len - (p->l4_off - p->l3_off) - in.doff * 4;
		seg_len += in.syn + in.fin;
		out.ack = 1;
		out.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + seg_len);
	}
	if (bpf_skb_change_tail(skb, p->l3_off + sizeof(ip6) + sizeof(out), 0))
		return -1;
	ipv6_reply_hdr(&ip6, &ph, p, sizeof(out), IPPROTO_TCP);
	__u32 csum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	out.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&out, sizeof(out), csum));
	if (bpf_skb_store_bytes(skb, p->l3_off, &ip6, sizeof(ip6), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip6), &out, sizeof(out), 0))
		return -1;
	return reject_bounce(skb, p);
}

static __always_inline int reject_icmp6(struct __sk_buff *skb, const struct xvs_pkt *p, __u8 type, __u8 code,
					__be32 word)
{
	/* The quote: the offending IPv6 header and 8 bytes of UDP, or 20 of
	 * TCP (see ICMP_QUOTE_MAX). */
	__u8 quote[sizeof(struct ipv6hdr) + 20];
	struct icmphdr icmp = {};
	struct ipv6hdr ip6;
	struct ipv6_pseudo ph;
	__u32 qlen = p->proto == IPPROTO_TCP ? sizeof(quote) : sizeof(struct ipv6hdr) + 8;

	if (bpf_skb_load_bytes(skb, p->l3_off, quote, qlen))
		return -1;
	if (bpf_skb_change_tail(skb, p->l3_off + qlen, 0))
		return -1;
	if (bpf_skb_adjust_room(skb, sizeof(ip6) + sizeof(icmp), BPF_ADJ_ROOM_MAC, 0))
		return -1;
	icmp.type = type;
	icmp.code = code;
	icmp.unused = word;
	ipv6_reply_hdr(&ip6, &ph, p, sizeof(icmp) + qlen, IPPROTO_ICMPV6_);
	__u32 csum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	csum = bpf_csum_diff(NULL, 0, (__be32 *)&icmp, sizeof(icmp), csum);
	csum = bpf_csum_diff(NULL, 0, (__be32 *)quote, qlen, csum);
	icmp.checksum = csum_fold(csum);
	if (bpf_skb_store_bytes(skb, p->l3_off, &ip6, sizeof(ip6), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip6), &icmp, sizeof(icmp), 0))
		return -1;
	return reject_bounce(skb, p);
}

/* Build and send the reject reply. Returns a TC action, or -1 when no reply
 * could be built (the caller drops the packet). */
static __attribute__((noinline)) int reject_packet(struct __sk_buff *skb, const struct xvs_pkt *p)
{
	if (!p->has_l4)
		return -1;
	if (p->family == XVS_FAMILY_IPV6)
		return p->proto == IPPROTO_TCP
			       ? reject_tcp6(skb, p)
			       : reject_icmp6(skb, p, ICMP6_DST_UNREACH, ICMP6_PORT_UNREACH, 0);
	if (p->proto == IPPROTO_TCP)
		return reject_tcp(skb, p);
	return reject_icmp(skb, p, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0);
}

#define ICMP_FRAG_NEEDED 4
#define ICMP6_PKT_TOOBIG 2
#define IPV6_MIN_MTU	 1280

/* The packet, as its client sent it (before translation), does not fit
 * the egress MTU: answer as a router would, with an ICMP frag-needed
 * (ICMPv6 packet too big) quoting the client's own header, from the
 * frontend it addressed, so that its socket learns the path MTU. */
static __attribute__((noinline)) int reject_too_big(struct __sk_buff *skb, const struct xvs_pkt *p, __u32 mtu)
{
	if (p->family == XVS_FAMILY_IPV6)
		return reject_icmp6(skb, p, ICMP6_PKT_TOOBIG, 0,
				    bpf_htonl(mtu < IPV6_MIN_MTU ? IPV6_MIN_MTU : mtu));
	return reject_icmp(skb, p, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, bpf_htonl(mtu & 0xffff));
}

#endif
