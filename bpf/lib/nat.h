/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Address and port rewriting with incremental checksum updates (RFC 1624
 * through the kernel's csum helpers). The L4 checksum covers the pseudo
 * header, so an address change touches it too; a UDP checksum of zero means
 * "none" and must stay zero (BPF_F_MARK_MANGLED_0). */
#ifndef XVS_NAT_H
#define XVS_NAT_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"

#define IPV4_CSUM_OFF  offsetof(struct iphdr, check)
#define IPV4_SADDR_OFF offsetof(struct iphdr, saddr)
#define IPV4_DADDR_OFF offsetof(struct iphdr, daddr)
#define IPV6_SADDR_OFF offsetof(struct ipv6hdr, saddr)
#define IPV6_DADDR_OFF offsetof(struct ipv6hdr, daddr)

static __always_inline __u32 l4_csum_off(const struct xvs_pkt *p)
{
	return p->l4_off +
	       (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) : offsetof(struct udphdr, check));
}

static __always_inline __u64 l4_csum_flags(const struct xvs_pkt *p)
{
	return p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Rewrite one side (source when src is true, else destination) of an IPv4
 * packet to addr:port. Ports are only rewritten when the L4 header is in
 * this packet; a later fragment only carries the address. Returns 0 or a
 * negative error from the helpers. */
static __always_inline int nat_rewrite_port(struct __sk_buff *skb, const struct xvs_pkt *p, bool src,
					    __be16 port)
{
	__be16 old_port = src ? p->sport : p->dport;
	__u32 port_off = p->l4_off + (src ? offsetof(struct tcphdr, source) : offsetof(struct tcphdr, dest));
	int ret;

	if (!p->has_l4 || old_port == port)
		return 0;
	if (p->proto == IPPROTO_SCTP)
		return -1; /* would need the CRC32c recomputed: never asked (see flow.h) */
	ret = bpf_l4_csum_replace(skb, l4_csum_off(p), old_port, port, l4_csum_flags(p) | sizeof(port));
	if (ret)
		return ret;
	return bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0);
}

/* IPv6: no header checksum; the L4 checksum covers both addresses through
 * the pseudo header, updated with the difference of the 128-bit values. */
static __always_inline int nat_rewrite_v6(struct __sk_buff *skb, const struct xvs_pkt *p, bool src,
					  const __u8 addr[16], __be16 port)
{
	const __u8 *old = src ? p->saddr : p->daddr;
	int ret;

	if (!addr_eq(old, addr)) {
		/* SCTP's checksum does not cover the addresses; a later
		 * fragment carries no L4 header. */
		if (p->has_l4 && p->proto != IPPROTO_SCTP) {
			__s64 diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)addr, 16, 0);

			if (diff < 0)
				return (int)diff;
			ret = bpf_l4_csum_replace(skb, l4_csum_off(p), 0, diff,
						  l4_csum_flags(p) | BPF_F_PSEUDO_HDR);
			if (ret)
				return ret;
		}
		ret = bpf_skb_store_bytes(skb, p->l3_off + (src ? IPV6_SADDR_OFF : IPV6_DADDR_OFF), addr, 16,
					  0);
		if (ret)
			return ret;
	}
	return nat_rewrite_port(skb, p, src, port);
}

static __always_inline int nat_rewrite_v4(struct __sk_buff *skb, const struct xvs_pkt *p, bool src,
					  const __u8 addr16[16], __be16 port)
{
	__be32 addr = addr_v4(addr16);
	__be32 old_addr = addr_v4(src ? p->saddr : p->daddr);
	__u32 addr_off = p->l3_off + (src ? IPV4_SADDR_OFF : IPV4_DADDR_OFF);
	int ret;

	/* SCTP's checksum does not cover the addresses. */
	if (p->has_l4 && p->proto != IPPROTO_SCTP && old_addr != addr) {
		ret = bpf_l4_csum_replace(skb, l4_csum_off(p), old_addr, addr,
					  l4_csum_flags(p) | BPF_F_PSEUDO_HDR | sizeof(addr));
		if (ret)
			return ret;
	}
	ret = nat_rewrite_port(skb, p, src, port);
	if (ret)
		return ret;
	if (old_addr != addr) {
		ret = bpf_l3_csum_replace(skb, p->l3_off + IPV4_CSUM_OFF, old_addr, addr, sizeof(addr));
		if (ret)
			return ret;
		ret = bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0);
		if (ret)
			return ret;
	}
	return 0;
}

#endif
