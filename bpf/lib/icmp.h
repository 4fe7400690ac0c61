/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP and ICMPv6 errors about translated flows, in both directions, as
 * netfilter's NAT translates its RELATED packets.
 *
 * About a packet to the backend: a router or the backend's node answers
 * it with an error quoting it as it saw it, from the client (or the
 * masquerade address) to the backend. The client's socket knows only the
 * frontend, so the quote is translated back (source to the client,
 * destination to the frontend), the error goes to the client, and comes
 * from the frontend when the backend itself sent it. It is translated
 * where the flow's replies are reverse-NATed: at tc ingress of the device
 * it arrives on for the flows translated past netfilter (bypass mode), at
 * tc egress of the device it leaves by for the others (netfilter mode,
 * hostNetwork endpoints), where netfilter has already undone its own
 * masquerade of the quote.
 *
 * About a reply: a router on the client's side (a smaller MTU: frag-needed)
 * or the client answers a reply with an error to the frontend, quoting the
 * reply as it left (frontend to client). The backend's socket knows its
 * own address and the client (or the masquerade address), so the quote
 * gets those, the error goes to the backend, and comes from the masquerade
 * address when xvs masquerades the flow. It is translated at tc ingress,
 * where the flow's packets are; in netfilter mode netfilter then applies
 * its own masquerade to it.
 *
 * Only destination unreachable (fragmentation needed, packet too big),
 * time exceeded and parameter problem quote a packet. A quoted IPv4 header
 * may carry options, a quoted IPv6 header extension headers (hop-by-hop,
 * routing, destination options, the first fragment's header): the ports
 * follow them. */
#ifndef XVS_ICMP_H
#define XVS_ICMP_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
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

/* ICMPv6 errors: destination unreachable (1), packet too big (2), time
 * exceeded (3), parameter problem (4). */
#define ICMPV6_ERROR_MIN 1
#define ICMPV6_ERROR_MAX 4

/* The quoted packet's ports, after its IPv4 header and options. */
struct icmp_ports {
	__be16 sport;
	__be16 dport;
};

/* How an error is translated: its quote's new source and destination, the
 * outer header's new ones, and, for an error about a reply, the flow's
 * netfilter flags (how it goes on: tc_how). */
struct icmp_nat {
	__u8 qsaddr[16];
	__u8 qdaddr[16];
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 qsport;
	__be16 qdport;
	__u32 nf_flags;
};

/* Which of a flow's entries the quote's tuple, reversed (rk), names, in
 * either table, and how the error translates (into *n; osrc: the outer
 * header's source). Returns ICMP_ABOUT_REQUEST when rk is a reply entry
 * (the quote went to the backend) of a flow reverse-NATed at this hook,
 * ICMP_ABOUT_REPLY when it is a live flow's forward entry (the quote was a
 * reply to the client) and the hook is ingress, else 0. */
enum { ICMP_ABOUT_REQUEST = 1, ICMP_ABOUT_REPLY = 2 };

static __attribute__((noinline)) int icmp_nat(const struct xvs_ct_key *rk, bool egress, const __u8 *osrc,
					      struct icmp_nat *n)
{
	__u64 now = bpf_ktime_get_ns();
	struct xvs_ct_entry *e = ct_get(XVS_CT_TABLE_ESTABLISHED, rk);
	bool unreplied = false;

	if (!e) {
		e = ct_get(XVS_CT_TABLE_UNREPLIED, rk);
		unreplied = true;
	}
	if (!e)
		return 0;
	if (!ct_is_reply(e)) {
		/* About a reply: the quote was frontend -> client, rk is
		 * the flow's own key. */
		if (egress || now > e->expires)
			return 0;
		__builtin_memcpy(n->qsaddr, e->nat_addr, 16);
		n->qsport = e->nat_port;
		__builtin_memcpy(n->saddr, osrc, 16);
		if (ct_is_snat(e)) {
			__builtin_memcpy(n->qdaddr, e->snat_addr, 16);
			n->qdport = e->snat_port;
			__builtin_memcpy(n->saddr, e->snat_addr, 16);
		} else {
			__builtin_memcpy(n->qdaddr, rk->saddr, 16);
			n->qdport = rk->sport;
		}
		__builtin_memcpy(n->daddr, e->nat_addr, 16);
		n->nf_flags = e->flags & (XVS_CT_F_NETFILTER | XVS_CT_F_NF_MASQ);
		return ICMP_ABOUT_REPLY;
	}
	/* About a packet to the backend: rk is the flow's reply entry. */
	if (ct_reversed_at_egress(e) != egress || !ct_flow_of(rk, e, now, unreplied))
		return 0;
	__builtin_memcpy(n->qsaddr, e->snat_addr, 16);
	n->qsport = e->snat_port;
	__builtin_memcpy(n->qdaddr, e->nat_addr, 16);
	n->qdport = e->nat_port;
	/* From the frontend if the backend sent it (a router on the way
	 * keeps its own address); to the client. */
	__builtin_memcpy(n->saddr, addr_eq(osrc, rk->saddr) ? e->nat_addr : osrc, 16);
	__builtin_memcpy(n->daddr, e->snat_addr, 16);
	n->nf_flags = 0;
	return ICMP_ABOUT_REQUEST;
}

/* Put nq (size bytes, a multiple of 4) in place of q at off, a part of the
 * quote of the ICMP message at icmp_off, and carry the change into the
 * ICMP checksum (no pseudo-header part: the quote is payload). */
static __always_inline int icmp_put_quote(struct __sk_buff *skb, __u32 icmp_off, __u32 off, void *q, void *nq,
					  __u32 size)
{
	__s64 diff = bpf_csum_diff(q, size, nq, size, 0);

	if (diff < 0 || bpf_skb_store_bytes(skb, off, nq, size, 0) ||
	    bpf_l4_csum_replace(skb, icmp_off + 2, 0, diff, 0))
		return -1;
	return 0;
}

/* An IPv4 ICMP error (l3_off: where its IPv4 header starts); see
 * icmp_error. */
static __attribute__((noinline)) int icmp4_error(struct __sk_buff *skb, __u32 l3_off, bool egress,
						 __u32 *nf_flags)
{
	struct icmp_ports qp, nqp;
	struct iphdr q, nq;
	struct xvs_ct_key rk = {};
	struct icmp_nat n = {};
	struct iphdr outer;
	__u8 type, a[16] = {}, b[16] = {}, src16[16] = {};

	/* Whole (no fragment), and as long as its header says, with room
	 * for a quote. */
	if (bpf_skb_load_bytes(skb, l3_off, &outer, sizeof(outer)) || outer.protocol != IPPROTO_ICMP ||
	    outer.ihl != 5 || (outer.frag_off & bpf_htons(0x3fff)) ||
	    bpf_ntohs(outer.tot_len) > skb->len - l3_off ||
	    bpf_ntohs(outer.tot_len) < sizeof(outer) + 8 + sizeof(q) + sizeof(qp))
		return 0;
	__u32 icmp_off = l3_off + sizeof(outer);

	if (bpf_skb_load_bytes(skb, icmp_off, &type, 1))
		return 0;
	if (type != ICMP_DEST_UNREACH_T && type != ICMP_TIME_EXCEEDED_T && type != ICMP_PARAMETERPROB_T)
		return 0;
	/* An error goes to the quoted packet's source (netfilter calls
	 * any other an invalid one). The quoted header may have options:
	 * its ports follow them, and must be in the error too. */
	if (bpf_skb_load_bytes(skb, icmp_off + 8, &q, sizeof(q)) || q.version != 4 || q.ihl < 5 ||
	    (q.protocol != IPPROTO_TCP && q.protocol != IPPROTO_UDP) || q.saddr != outer.daddr)
		return 0;
	__u32 qhlen = (__u32)(q.ihl & 0xf) * 4, ports_off = icmp_off + 8 + qhlen;

	if (bpf_ntohs(outer.tot_len) < sizeof(outer) + 8 + qhlen + 8 ||
	    bpf_skb_load_bytes(skb, ports_off, &qp, sizeof(qp)))
		return 0;
	/* The quote's tuple reversed: a flow's reply entry or its own key. */
	__builtin_memcpy(a, &q.daddr, 4);
	__builtin_memcpy(b, &q.saddr, 4);
	__builtin_memcpy(src16, &outer.saddr, 4);
	ct_key(&rk, a, b, qp.dport, qp.sport, q.protocol, XVS_FAMILY_IPV4);
	int about = icmp_nat(&rk, egress, src16, &n);

	if (!about)
		return 0;

	/* The quoted header's checksum covers its options, which stay: it
	 * changes by the addresses' difference only (RFC 1624, on the
	 * header's words as they are in the packet). */
	nq = q;
	__builtin_memcpy(&nq.saddr, n.qsaddr, 4);
	__builtin_memcpy(&nq.daddr, n.qdaddr, 4);
	__s64 d = bpf_csum_diff(&q.saddr, 8, &nq.saddr, 8, (__u16)~q.check);

	if (d < 0)
		return -1;
	nq.check = csum_fold((__u32)d);
	nqp.sport = n.qsport;
	nqp.dport = n.qdport;

	if (icmp_put_quote(skb, icmp_off, icmp_off + 8, &q, &nq, sizeof(nq)) ||
	    icmp_put_quote(skb, icmp_off, ports_off, &qp, &nqp, sizeof(nqp)))
		return -1;

	__be32 src = addr_v4(n.saddr), dst = addr_v4(n.daddr);

	if (src != outer.saddr &&
	    (bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, saddr), &src, 4, 0) ||
	     bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), outer.saddr, src, 4)))
		return -1;
	if (dst != outer.daddr &&
	    (bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, daddr), &dst, 4, 0) ||
	     bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), outer.daddr, dst, 4)))
		return -1;
	*nf_flags = n.nf_flags;
	return about;
}

/* Put addr at off (an IPv6 address of the outer header) in place of old,
 * and carry the change into the ICMPv6 checksum at csum_off, whose
 * pseudo-header holds it. */
static __always_inline int icmp6_set_addr(struct __sk_buff *skb, __u32 off, __u32 csum_off, const __u8 *old,
					  const __u8 *addr)
{
	if (addr_eq(old, addr))
		return 0;
	__s64 d = bpf_csum_diff((__be32 *)old, 16, (__be32 *)addr, 16, 0);

	if (d < 0 || bpf_skb_store_bytes(skb, off, addr, 16, 0) ||
	    bpf_l4_csum_replace(skb, csum_off, 0, d, BPF_F_PSEUDO_HDR))
		return -1;
	return 0;
}

/* Where the ports of the IPv6 packet quoted at off start, past the
 * extension headers the parser walks (parse_ipv6), and in *nexthdr its
 * protocol; 0 when the quote has no ports of a flow: not TCP or UDP, too
 * many or unknown extension headers, or a later fragment. */
static __always_inline __u32 icmp6_quote_ports(struct __sk_buff *skb, __u32 off, __u8 *nexthdr)
{
	struct ipv6_ext_hdr h;

	off += sizeof(struct ipv6hdr);
	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		if (*nexthdr == IPPROTO_TCP || *nexthdr == IPPROTO_UDP)
			return off;
		if (*nexthdr != IPV6_EXT_HOPOPTS && *nexthdr != IPV6_EXT_ROUTING &&
		    *nexthdr != IPV6_EXT_DSTOPTS && *nexthdr != IPV6_EXT_FRAGMENT)
			return 0;
		if (bpf_skb_load_bytes(skb, off, &h, sizeof(h)))
			return 0;
		if (*nexthdr == IPV6_EXT_FRAGMENT) {
			if (bpf_ntohs(h.frag_off) & IPV6_FRAG_OFFSET)
				return 0;
			off += sizeof(h);
		} else {
			off += ((__u32)h.len + 1) * 8;
		}
		*nexthdr = h.nexthdr;
	}
	return *nexthdr == IPPROTO_TCP || *nexthdr == IPPROTO_UDP ? off : 0;
}

/* An ICMPv6 error (l3_off: where its IPv6 header starts); see
 * icmp_error. The quoted header may be followed by extension headers:
 * its ports follow them, and must be in the error too. */
static __attribute__((noinline)) int icmp6_error(struct __sk_buff *skb, __u32 l3_off, bool egress,
						 __u32 *nf_flags)
{
	struct icmp_ports qp, nqp;
	struct ipv6hdr q, nq;
	struct xvs_ct_key rk = {};
	struct icmp_nat n = {};
	struct ipv6hdr outer;
	__u8 type;

	if (bpf_skb_load_bytes(skb, l3_off, &outer, sizeof(outer)) || outer.nexthdr != IPPROTO_ICMPV6 ||
	    sizeof(outer) + bpf_ntohs(outer.payload_len) > skb->len - l3_off ||
	    bpf_ntohs(outer.payload_len) < 8 + sizeof(q) + 8)
		return 0;
	__u32 icmp_off = l3_off + sizeof(outer);

	if (bpf_skb_load_bytes(skb, icmp_off, &type, 1) || type < ICMPV6_ERROR_MIN || type > ICMPV6_ERROR_MAX)
		return 0;
	if (bpf_skb_load_bytes(skb, icmp_off + 8, &q, sizeof(q)) || q.version != 6 ||
	    !addr_eq((const __u8 *)&q.saddr, (const __u8 *)&outer.daddr))
		return 0;
	__u8 proto = q.nexthdr;
	__u32 ports_off = icmp6_quote_ports(skb, icmp_off + 8, &proto);

	/* The quote holds at least 8 bytes of its L4 header, as of IPv4. */
	if (!ports_off || ports_off + 8 > icmp_off + bpf_ntohs(outer.payload_len) ||
	    bpf_skb_load_bytes(skb, ports_off, &qp, sizeof(qp)))
		return 0;
	ct_key(&rk, (const __u8 *)&q.daddr, (const __u8 *)&q.saddr, qp.dport, qp.sport, proto,
	       XVS_FAMILY_IPV6);
	int about = icmp_nat(&rk, egress, (const __u8 *)&outer.saddr, &n);

	if (!about)
		return 0;

	nq = q;
	__builtin_memcpy(&nq.saddr, n.qsaddr, 16);
	__builtin_memcpy(&nq.daddr, n.qdaddr, 16);
	nqp.sport = n.qsport;
	nqp.dport = n.qdport;

	if (icmp_put_quote(skb, icmp_off, icmp_off + 8, &q, &nq, sizeof(nq)) ||
	    icmp_put_quote(skb, icmp_off, ports_off, &qp, &nqp, sizeof(nqp)))
		return -1;

	/* The outer header's addresses are in the ICMPv6 checksum's
	 * pseudo-header. */
	__u32 csum_off = icmp_off + 2;

	if (icmp6_set_addr(skb, l3_off + offsetof(struct ipv6hdr, saddr), csum_off,
			   (const __u8 *)&outer.saddr, n.saddr) ||
	    icmp6_set_addr(skb, l3_off + offsetof(struct ipv6hdr, daddr), csum_off,
			   (const __u8 *)&outer.daddr, n.daddr))
		return -1;
	*nf_flags = n.nf_flags;
	return about;
}

/* Translate an ICMP or ICMPv6 error at this hook (egress: tc egress, else
 * tc ingress) if it is about a flow of ours (see icmp_nat): returns
 * ICMP_ABOUT_REQUEST or ICMP_ABOUT_REPLY when it did (*nf_flags: how an
 * error about a reply goes on), 0 when the packet is not such an error,
 * -1 when the rewrite failed (the packet is then damaged: drop it). */
static __always_inline int icmp_error(struct __sk_buff *skb, __u32 l3_off, bool v6, bool egress,
				      __u32 *nf_flags)
{
	if (v6)
		return icmp6_error(skb, l3_off, egress, nf_flags);
	return icmp4_error(skb, l3_off, egress, nf_flags);
}

#endif
