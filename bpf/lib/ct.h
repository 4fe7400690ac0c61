/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Conntrack: an LRU hash with one entry per direction of a flow. Entries
 * carry their own expiry (the LRU only bounds memory), with timeouts in the
 * spirit of netfilter's: the established TCP timeout is the 24 h kube-proxy
 * configures for nf_conntrack_tcp_timeout_established. */
#ifndef XVS_CT_H
#define XVS_CT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

#define NSEC_PER_SEC 1000000000ULL

/* Load-time knobs (seconds); the loader may rewrite them. */
volatile const __u32 cfg_ct_tcp_syn_s = 60;
volatile const __u32 cfg_ct_tcp_established_s = 86400;
volatile const __u32 cfg_ct_tcp_closing_s = 10;
volatile const __u32 cfg_ct_udp_s = 30;
volatile const __u32 cfg_ct_udp_stream_s = 120;

/* A flow's packets are added to the service and backend counters in
 * batches of this many (see ct_account). */
#define CT_FLUSH_PACKETS 64

/* Only refresh an entry's expiry when it moves by more than this, so that a
 * busy flow does not write its cache line on every packet. */
#define CT_REFRESH_SLACK_NS NSEC_PER_SEC

/* Key of the flow with these endpoints (16-byte addresses, either family). */
static __always_inline void ct_key(struct xvs_ct_key *k, const __u8 saddr[16], const __u8 daddr[16],
				   __be16 sport, __be16 dport, __u8 proto, __u8 family)
{
	__builtin_memcpy(k->saddr, saddr, 16);
	__builtin_memcpy(k->daddr, daddr, 16);
	k->sport = sport;
	k->dport = dport;
	k->proto = proto;
	k->family = family;
}

static __always_inline __u64 ct_lifetime_ns(__u8 proto, __u16 flags)
{
	__u32 s;

	if (flags & XVS_CT_F_CLOSING)
		s = cfg_ct_tcp_closing_s;
	else if (proto == IPPROTO_TCP)
		s = (flags & XVS_CT_F_SEEN_REPLY) ? cfg_ct_tcp_established_s : cfg_ct_tcp_syn_s;
	else
		s = (flags & XVS_CT_F_SEEN_REPLY) ? cfg_ct_udp_stream_s : cfg_ct_udp_s;
	return (__u64)s * NSEC_PER_SEC;
}

/* Give back what a least-connection scheduler counts for the flow: its
 * active connection, or its inactive one. */
static __always_inline void ct_release(const struct xvs_ct_entry *e)
{
	__u32 id = e->backend_id;
	struct xvs_conn_counts *c = bpf_map_lookup_elem(&xvs_backend_held, &id);

	if (!c)
		return;
	if (e->flags & XVS_CT_F_HELD)
		__sync_fetch_and_add(&c->active, -1);
	else if (e->flags & XVS_CT_F_INACTIVE)
		__sync_fetch_and_add(&c->inactive, -1);
}

/* A closing flow's active connection becomes an inactive one. */
static __always_inline void ct_deactivate(const struct xvs_ct_entry *e)
{
	__u32 id = e->backend_id;
	struct xvs_conn_counts *c = bpf_map_lookup_elem(&xvs_backend_held, &id);

	if (!c)
		return;
	__sync_fetch_and_add(&c->active, -1);
	__sync_fetch_and_add(&c->inactive, 1);
}

/* Account for one packet of a tracked flow: TCP FIN or RST moves the entry
 * to its closing timeout, a reply marks the flow as seen both ways. */
static __always_inline void ct_touch(struct xvs_ct_entry *e, const struct xvs_pkt *p, __u64 now)
{
	__u16 flags = e->flags;

	if (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		flags |= XVS_CT_F_CLOSING;
	if (flags & XVS_CT_F_REPLY)
		flags |= XVS_CT_F_SEEN_REPLY;
	if ((flags & (XVS_CT_F_CLOSING | XVS_CT_F_HELD)) == (XVS_CT_F_CLOSING | XVS_CT_F_HELD)) {
		ct_deactivate(e);
		flags = (flags & ~XVS_CT_F_HELD) | XVS_CT_F_INACTIVE;
	}
	if (flags != e->flags)
		e->flags = flags;

	__u64 expires = now + ct_lifetime_ns(p->proto, flags);
	if (flags & XVS_CT_F_CLOSING) {
		/* Closing only ever shortens the entry's life. */
		if (expires < e->expires)
			e->expires = expires;
	} else if (expires > e->expires + CT_REFRESH_SLACK_NS) {
		e->expires = expires;
	}
}

/* Count one packet on its conntrack entry. The per-CPU service and backend
 * counters get the batch when it is full, when force is set (the first
 * reply of a flow), and on every packet of a closing flow, so that short
 * flows are counted in full while they close. An entry that expires
 * silently loses at most one unflushed batch; `xvs list` adds the pending
 * counts of live entries. */
static __always_inline void ct_account(struct xvs_ct_entry *e, __u32 bytes, bool force)
{
	e->packets++;
	e->bytes += bytes;
	if (force || e->packets >= CT_FLUSH_PACKETS || (e->flags & XVS_CT_F_CLOSING))
		stats_flush(e);
}

/* A flow's forward entry is usable unless it expired, or it is a closed TCP
 * flow that a new SYN reopens (the client reused its port). */
static __always_inline bool ct_usable(const struct xvs_ct_entry *e, const struct xvs_pkt *p, __u64 now)
{
	if (now > e->expires)
		return false;
	if (p->proto == IPPROTO_TCP && (e->flags & XVS_CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	return true;
}

#endif
