/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Masquerade for a new flow (flow_new): the way the flow leaves the node
 * (flow_route, flow_nat_path), and the source port it takes (flow_snat_port),
 * one no live flow and no socket of the node holds, as netfilter's
 * MASQUERADE --random-fully picks one. */
#ifndef XVS_SNAT_H
#define XVS_SNAT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ct.h"
#include "flags.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

/* How many masquerade ports a new flow tries before giving up. */
#define SNAT_TRIES 32

enum {
	FLOW_ROUTE_NONE = 0, /* no route the program can use: the stack decides */
	FLOW_ROUTE_FWD,	     /* forwarded, out of *ifindex */
	FLOW_ROUTE_LOCAL,    /* an address of this node: delivered locally */
};

/* Where a packet from p's source to dst:dport goes, as the kernel's
 * forwarding would route it. */
static __noinline int flow_route(void *ctx, const struct xvs_pkt *p, const __u8 *dst, __be16 dport,
				 __u32 *ifindex)
{
	struct bpf_fib_lookup fib = {
		.l4_protocol = p->proto,
		.sport = p->sport,
		.dport = dport,
		.ifindex = p->ifindex,
	};

	if (p->family == XVS_FAMILY_IPV6) {
		fib.family = 10; /* AF_INET6 */
		__builtin_memcpy(fib.ipv6_src, p->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, dst, 16);
	} else {
		fib.family = 2; /* AF_INET */
		fib.ipv4_src = addr_v4(p->saddr);
		fib.ipv4_dst = addr_v4(dst);
	}
	switch (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0)) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		*ifindex = fib.ifindex;
		return FLOW_ROUTE_FWD;
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		return FLOW_ROUTE_LOCAL;
	}
	return FLOW_ROUTE_NONE;
}

/* Is there a socket of the node that a reply from peer:peer_port to
 * local:port would belong to? netfilter sees the node's own connections in
 * its conntrack table; xvs asks the socket tables instead, before it takes
 * a masquerade port. */
static __noinline bool flow_port_in_use(void *ctx, const struct xvs_ct_key *rk)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len;

	/* rk is the reply entry's key: backend -> local address:port. */
	if (rk->family == XVS_FAMILY_IPV6) {
		__builtin_memcpy(t.ipv6.saddr, rk->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, rk->daddr, 16);
		t.ipv6.sport = rk->sport;
		t.ipv6.dport = rk->dport;
		len = sizeof(t.ipv6);
	} else {
		t.ipv4.saddr = addr_v4(rk->saddr);
		t.ipv4.daddr = addr_v4(rk->daddr);
		t.ipv4.sport = rk->sport;
		t.ipv4.dport = rk->dport;
		len = sizeof(t.ipv4);
	}
	if (rk->proto == IPPROTO_TCP)
		sk = (struct bpf_sock *)bpf_skc_lookup_tcp(ctx, &t, len, BPF_F_CURRENT_NETNS, 0);
	else if (rk->proto == IPPROTO_UDP)
		sk = bpf_sk_lookup_udp(ctx, &t, len, BPF_F_CURRENT_NETNS, 0);
	else
		return false;
	if (!sk)
		return false;
	bpf_sk_release(sk);
	return true;
}

/* The i-th port of a range (i below its span). */
static __always_inline __u16 snat_port_at(const struct xvs_port_range *r, __u32 i)
{
	__u32 port = r->min + i;

	if (r->skip_len && port >= r->skip_min)
		port += r->skip_len;
	return (__u16)port;
}

/* A search for a masquerade port (see flow_snat_port), one try per
 * bpf_loop iteration: the verifier walks the callback once, not once per
 * try. */
struct snat_search {
	void *ctx;
	const struct xvs_port_range *range;
	const __u8 *src;
	const __u8 *be_addr;
	struct xvs_ct_entry *rev;
	__u64 now;
	__u32 start;
	__u32 search; /* SNAT_SEARCH_*; 0: prefer only */
	__be16 be_port;
	__be16 prefer;
	__be16 found;
	__u8 proto;
	__u8 family;
};

/* snat_search.search: search the range at all (else only prefer), and may
 * take a closed flow's port (the packet is a TCP SYN). Flags in one field:
 * the search lives on the stack of the deepest call chain. */
#define SNAT_SEARCH	1
#define SNAT_SEARCH_SYN 2

/* Does a live flow hold the masquerade port of reply key rk, whose
 * xvs_conntrack entry is rev? A new connection's SYN (syn nonzero) may take
 * the port of a flow that is only waiting out its close (TIME_WAIT, or CLOSE
 * after a RST), as netfilter's NAT lets it (nf_nat_used_tuple_harder):
 * otherwise each closed connection holds its port for the 120 s of
 * TIME_WAIT, and a few hundred new connections per second to one backend
 * use up the range. The old flow is retired: its pending counts flushed,
 * its least-connection count given back, its forward entry expired (the
 * caller replaces its reply entry). A late segment of it is then a packet
 * of no flow, as it is for netfilter.
 *
 * A global function: verified once on its own, and the search goes on
 * from one state whatever happened inside (its arguments may be NULL to
 * it). */
__noinline int snat_port_held(const struct xvs_ct_key *rk, struct xvs_ct_entry *rev, __u64 now, __u32 syn)
{
	struct xvs_ct_entry *fe;

	if (!rk || !rev)
		return 0;
	fe = ct_flow_lookup(rk, rev, now, false); /* inline: the stack is at its deepest here */
	if (!fe)
		return 0;
	if (!syn || (fe->state != XVS_CT_TIME_WAIT && fe->state != XVS_CT_CLOSE))
		return 1;
	stats_flush(fe);
	stats_flush(rev);
	ct_release(fe);
	fe->expires = 0;
	return 0;
}

static long snat_try(__u32 i, void *data)
{
	struct snat_search *s = data;
	struct xvs_ct_key rk = {};
	struct xvs_ct_entry *old, *young;
	__be16 port;

	if (i == 0) {
		if (!s->prefer)
			return 0;
		port = s->prefer;
	} else {
		__u32 span = s->range->span;

		if (!(s->search & SNAT_SEARCH) || !span)
			return 1;
		port = bpf_htons(snat_port_at(s->range, (s->start + i) % span));
	}
	ct_key(&rk, s->be_addr, s->src, s->be_port, port, s->proto, s->family);
	old = ct_get(XVS_CT_TABLE_ESTABLISHED, &rk);
	if (old && snat_port_held(&rk, old, s->now, s->search & SNAT_SEARCH_SYN))
		return 0;
	young = ct_get(XVS_CT_TABLE_UNREPLIED, &rk);
	if (young && ct_flow_of(&rk, young, s->now, true))
		return 0;
	if (flow_port_in_use(s->ctx, &rk))
		return 0;
	/* A new flow's reply entry goes with it into the unreplied table. */
	if (ct_put(XVS_CT_TABLE_UNREPLIED, &rk, s->rev, young ? BPF_ANY : BPF_NOEXIST))
		return 0;
	if (old)
		ct_del(XVS_CT_TABLE_ESTABLISHED, &rk); /* a dead flow's */
	s->found = port;
	return 1;
}

/* Take a source port of src towards the backend for a masqueraded (or
 * port-clashing: XVS_CT_F_CLASH in rev) flow: insert its reply entry rev
 * under a port no live flow and no local socket holds, from the masquerade
 * range or the clash range. prefer (when nonzero) is tried first: the port
 * the previous flow of this client tuple had, so that a reused client port
 * recycles its mapping as netfilter's does. Returns the port, or 0 when
 * none is free. */
static __always_inline __be16 flow_snat_port(void *ctx, const struct xvs_config *cfg, const __u8 *src,
					     const __u8 *be_addr, __be16 be_port, const struct xvs_pkt *p,
					     struct xvs_ct_entry *rev, __be16 prefer, __u64 now)
{
	__u8 proto = p->proto, family = p->family;
	__u32 syn = proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN
			    ? SNAT_SEARCH_SYN
			    : 0;

	struct snat_search s = {
		.ctx = ctx,
		/* The range by index, not by a branch: both ways stay one
		 * state for the verifier. */
		.range = &cfg->ports[(rev->flags / XVS_CT_F_CLASH) & 1],
		.src = src,
		.be_addr = be_addr,
		.rev = rev,
		.now = now,
		.start = bpf_get_prandom_u32(),
		.search = SNAT_SEARCH | syn,
		.be_port = be_port,
		.prefer = prefer,
		.proto = proto,
		.family = family,
	};

	if (proto == IPPROTO_SCTP) {
		/* A new SCTP port would need the CRC32c recomputed: keep the
		 * client's own port, and give up if it is taken. */
		s.prefer = rev->snat_port;
		s.search = 0;
	}
	bpf_loop(SNAT_TRIES + 1, snat_try, &s, 0);
	return s.found;
}

/* How a new flow to backend be leaves the node, given whether kube-proxy
 * would masquerade it (snat): the flow's XVS_CT_F_* path flags go into
 * *flags, the masquerade source into *node; returns whether xvs itself
 * masquerades it. A backend on this node's own address is delivered
 * locally, where netfilter never masquerades (POSTROUTING is not on that
 * path), and its replies are reverse-NATed at egress; in netfilter mode
 * the stack routes, filters and masquerades the translated packet (a route
 * to an address of this node is local delivery, as above); otherwise xvs
 * masquerades by the egress interface's address, as MASQUERADE does. */
static __always_inline bool flow_nat_path(void *ctx, const struct xvs_pkt *p, const struct xvs_config *cfg,
					  const struct xvs_backend *be, bool snat, __u16 *flags,
					  const __u8 **node)
{
	__u32 ifindex = 0;
	struct xvs_if_addrs *ifa;

	if (backend_on_host(be)) {
		*flags |= XVS_CT_F_HOST;
		return false;
	}
	if (cfg_netfilter(cfg)) {
		*flags |= XVS_CT_F_NETFILTER;
		if (snat)
			*flags |= flow_route(ctx, p, be->addr, be->port, &ifindex) == FLOW_ROUTE_LOCAL
					  ? XVS_CT_F_HOST
					  : XVS_CT_F_NF_MASQ;
		return false;
	}
	if (!snat)
		return false;
	switch (flow_route(ctx, p, be->addr, be->port, &ifindex)) {
	case FLOW_ROUTE_LOCAL:
		*flags |= XVS_CT_F_HOST;
		return false;
	case FLOW_ROUTE_FWD:
		ifa = bpf_map_lookup_elem(&xvs_if_snat, &ifindex);
		if (ifa) {
			const __u8 *a = p->family == XVS_FAMILY_IPV4 ? ifa->addr4 : ifa->addr6;

			if (!addr_is_zero(a))
				*node = a;
		}
		break;
	}
	return true;
}

#endif
