/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Conntrack: LRU hashes with two keys per flow and one state (see
 * struct xvs_ct_entry); unreplied flows in a table of their own until
 * their first reply (ct_promote). The forward entry holds the state machine and the
 * expiry; a reply entry is only a way back to it. Timeouts are netfilter's
 * as kube-proxy configures them (established 24 h, CLOSE_WAIT 1 h), and the
 * loader may rewrite them. */
#ifndef XVS_CT_H
#define XVS_CT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "flags.h"
#include "maps.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

#define NSEC_PER_SEC 1000000000ULL

#ifndef EEXIST
#define EEXIST 17
#endif

/* Load-time knobs (seconds), indexed like enum xvs_ct_state for TCP. */
volatile const __u32 cfg_ct_tcp_syn_sent_s = 120;
volatile const __u32 cfg_ct_tcp_syn_recv_s = 60;
volatile const __u32 cfg_ct_tcp_established_s = 86400;
volatile const __u32 cfg_ct_tcp_fin_wait_s = 120;
volatile const __u32 cfg_ct_tcp_close_wait_s = 3600;
volatile const __u32 cfg_ct_tcp_last_ack_s = 30;
volatile const __u32 cfg_ct_tcp_time_wait_s = 120;
volatile const __u32 cfg_ct_tcp_close_s = 10;
volatile const __u32 cfg_ct_udp_s = 30;
volatile const __u32 cfg_ct_udp_stream_s = 120;

/* A flow's packets are added to the service and backend counters in
 * batches of this many (see ct_account). */
#define CT_FLUSH_PACKETS 64

/* Only refresh a flow's expiry when it moves by more than this, so that a
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

/* The conntrack tables. The programs reach them through xvs_ct_tables
 * only (t is XVS_CT_TABLE_ESTABLISHED or XVS_CT_TABLE_UNREPLIED), so that
 * the agent can resize them under live traffic: it puts the old table in
 * slot t + XVS_CT_OLD, the new one in slot t, copies the old entries
 * over and empties the old slot again. Meanwhile the old table is part
 * of the new one: a key missing from the new table is looked for in the
 * old one and copied over (ct_get); a NOEXIST insert fails if the old
 * table has the key; an overwrite or a delete removes the key from the
 * old table as well, so that a stale entry never comes back from there.
 * Outside a resize the old slots are empty, and cost one array lookup. */
static __always_inline void *ct_table(__u32 slot)
{
	return bpf_map_lookup_elem(&xvs_ct_tables, &slot);
}

/* The entry at k in old table slot t + XVS_CT_OLD, copied into the table
 * in use (cur) unless that has one by now; NULL when the old table has
 * none (or there is no resize). Inlined: a call frame of its own would
 * take the deepest call chain past the 512 bytes of stack Linux 6.1
 * allows all frames together. */
static __always_inline struct xvs_ct_entry *ct_get_old(__u32 t, void *cur, const struct xvs_ct_key *k)
{
	void *old = ct_table(t + XVS_CT_OLD);
	struct xvs_ct_entry *e, *n;

	if (!old)
		return NULL;
	e = bpf_map_lookup_elem(old, k);
	if (!e)
		return NULL;
	/* The old entry stays: a program of the previous generation, still
	 * attached elsewhere during an upgrade, may use the old table. The
	 * copy fails when cur got the key meanwhile; that one holds. */
	bpf_map_update_elem(cur, k, e, BPF_NOEXIST);
	n = bpf_map_lookup_elem(cur, k);
	return n ? n : e;
}

static __always_inline struct xvs_ct_entry *ct_get(__u32 t, const struct xvs_ct_key *k)
{
	void *cur = ct_table(t);
	struct xvs_ct_entry *e;

	if (!cur)
		return NULL;
	e = bpf_map_lookup_elem(cur, k);
	if (e)
		return e;
	return ct_get_old(t, cur, k);
}

/* bpf_map_update_elem on table t (see ct_get); flags BPF_ANY or
 * BPF_NOEXIST. */
static __always_inline long ct_put(__u32 t, const struct xvs_ct_key *k, const struct xvs_ct_entry *v,
				   __u64 flags)
{
	void *cur = ct_table(t), *old = ct_table(t + XVS_CT_OLD);
	long err;

	if (!cur)
		return -1;
	if (old && flags == BPF_NOEXIST && bpf_map_lookup_elem(old, k))
		return -EEXIST;
	err = bpf_map_update_elem(cur, k, v, flags);
	if (!err && old)
		bpf_map_delete_elem(old, k);
	return err;
}

/* bpf_map_delete_elem on table t (see ct_get). */
static __always_inline void ct_del(__u32 t, const struct xvs_ct_key *k)
{
	void *cur = ct_table(t), *old = ct_table(t + XVS_CT_OLD);

	if (cur)
		bpf_map_delete_elem(cur, k);
	if (old)
		bpf_map_delete_elem(old, k);
}

static __always_inline __u64 ct_timeout_ns(__u8 proto, __u8 state, __u16 flags)
{
	__u32 s;

	switch (proto == IPPROTO_TCP ? state : XVS_CT_NONE) {
	case XVS_CT_SYN_SENT:
		s = cfg_ct_tcp_syn_sent_s;
		break;
	case XVS_CT_SYN_RECV:
		s = cfg_ct_tcp_syn_recv_s;
		break;
	case XVS_CT_ESTABLISHED:
		s = cfg_ct_tcp_established_s;
		break;
	case XVS_CT_FIN_WAIT:
		s = cfg_ct_tcp_fin_wait_s;
		break;
	case XVS_CT_CLOSE_WAIT:
		s = cfg_ct_tcp_close_wait_s;
		break;
	case XVS_CT_LAST_ACK:
		s = cfg_ct_tcp_last_ack_s;
		break;
	case XVS_CT_TIME_WAIT:
		s = cfg_ct_tcp_time_wait_s;
		break;
	case XVS_CT_CLOSE:
		s = cfg_ct_tcp_close_s;
		break;
	default:
		s = (flags & XVS_CT_F_SEEN_REPLY) ? cfg_ct_udp_stream_s : cfg_ct_udp_s;
	}
	return (__u64)s * NSEC_PER_SEC;
}

/* Has the connection begun to close (FIN or RST seen)? */
static __always_inline bool ct_closing(__u8 state)
{
	return state >= XVS_CT_FIN_WAIT;
}

/* May a new SYN of the same tuple replace the flow (the client reused its
 * port)? As netfilter: once both sides have closed, or after a RST. */
static __always_inline bool ct_reopenable(__u8 state)
{
	return state >= XVS_CT_LAST_ACK;
}

/* The TCP state machine, netfilter's in outline. reply: the packet comes
 * from the backend. FIN bits per direction live in *flags. */
static __always_inline __u8 ct_tcp_next(__u8 state, __u16 *flags, __u8 tcp, bool reply)
{
	__u16 fin_self = reply ? XVS_CT_F_FIN_REPLY : XVS_CT_F_FIN_ORIG;
	__u16 fin_peer = reply ? XVS_CT_F_FIN_ORIG : XVS_CT_F_FIN_REPLY;

	if (tcp & TCP_FLAG_RST)
		return XVS_CT_CLOSE;
	if (tcp & TCP_FLAG_SYN) {
		if (reply && (tcp & TCP_FLAG_ACK) && state == XVS_CT_SYN_SENT)
			return XVS_CT_SYN_RECV;
		return state; /* a retransmitted SYN or SYN-ACK */
	}
	if (state == XVS_CT_CLOSE)
		return state;
	if (tcp & TCP_FLAG_FIN) {
		if (*flags & fin_self)
			return state; /* retransmitted */
		*flags |= fin_self;
		if (!(*flags & fin_peer))
			return XVS_CT_FIN_WAIT;
		if (reply)
			*flags |= XVS_CT_F_LAST_FIN_REPLY;
		return XVS_CT_LAST_ACK;
	}
	if (!(tcp & TCP_FLAG_ACK))
		return state;
	switch (state) {
	case XVS_CT_SYN_RECV:
		return reply ? state : XVS_CT_ESTABLISHED;
	case XVS_CT_FIN_WAIT:
		/* The peer acknowledges the FIN and may go on sending: the
		 * connection is half-closed. */
		return (*flags & fin_peer) ? XVS_CT_CLOSE_WAIT : state;
	case XVS_CT_LAST_ACK:
		/* Both FINs seen; an ACK from the side that closed first
		 * acknowledges the last one. */
		return !!(*flags & XVS_CT_F_LAST_FIN_REPLY) != reply ? XVS_CT_TIME_WAIT : state;
	}
	return state;
}

/* Give back what a least-connection scheduler counts for the flow (its
 * active connection, or its inactive one) when the flow is replaced or
 * its masquerade port recycled. The flow stops claiming the count before
 * the count is given back: the agent's reaper, which deletes expired
 * entries and gives back what the value it deleted claims, then sees
 * either the claim (and gives it back instead) or none, not a claim
 * already given back. */
static __always_inline void ct_release(struct xvs_ct_entry *e)
{
	__u16 flags = e->flags;
	__u32 id = e->backend_id;
	struct xvs_conn_counts *c;

	if (!(flags & (XVS_CT_F_HELD | XVS_CT_F_INACTIVE)))
		return;
	e->flags = flags & ~(XVS_CT_F_HELD | XVS_CT_F_INACTIVE);
	c = bpf_map_lookup_elem(&xvs_backend_held, &id);
	if (!c)
		return;
	if (flags & XVS_CT_F_HELD)
		__sync_fetch_and_add(&c->active, -1);
	else
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

/* One packet of a tracked flow, in either direction, on the flow's
 * (forward) entry: the state machine moves, and the expiry follows the
 * state, so the flow lives as long as either side talks. */
static __always_inline void ct_touch(struct xvs_ct_entry *e, const struct xvs_pkt *p, bool reply, __u64 now)
{
	__u16 flags = e->flags;
	__u8 state = e->state;

	if (reply)
		flags |= XVS_CT_F_SEEN_REPLY;
	if (p->proto == IPPROTO_TCP && p->has_l4)
		state = ct_tcp_next(state, &flags, p->tcp_flags, reply);
	if (ct_closing(state) && (flags & XVS_CT_F_HELD)) {
		ct_deactivate(e);
		flags = (flags & ~XVS_CT_F_HELD) | XVS_CT_F_INACTIVE;
	}

	__u64 expires = now + ct_timeout_ns(p->proto, state, flags);

	if (state != e->state || flags != e->flags) {
		/* A transition sets the new state's timeout, shorter or not. */
		e->state = state;
		e->flags = flags;
		e->expires = expires;
	} else if (expires > e->expires + CT_REFRESH_SLACK_NS) {
		e->expires = expires;
	}
}

/* Count one packet on its conntrack entry (the direction's own). The
 * per-CPU service and backend counters get the batch when it is full, when
 * force is set (the first reply of a flow, a closing flow), so that short
 * flows are counted in full while they close. `xvs list` adds the pending
 * counts of live entries. */
static __always_inline void ct_account(struct xvs_ct_entry *e, __u32 bytes, bool force)
{
	e->packets++;
	e->bytes += bytes;
	if (force || e->packets >= CT_FLUSH_PACKETS)
		stats_flush(e);
}

/* A flow's forward entry is usable unless it expired, or it is a closed TCP
 * flow that a new SYN reopens (the client reused its port). */
static __always_inline bool ct_usable(const struct xvs_ct_entry *e, const struct xvs_pkt *p, __u64 now)
{
	if (now > e->expires)
		return false;
	if (p->proto == IPPROTO_TCP && ct_reopenable(e->state) &&
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return false;
	return true;
}

/* The live flow a reply entry at rk (backend -> client or masquerade
 * address) belongs to, or NULL when the entry is stale: its flow expired,
 * was replaced by another flow of the same client tuple, or went away.
 * unreplied: the entry is in xvs_ct_unreplied (and so is its flow). */
static __always_inline struct xvs_ct_entry *
ct_flow_lookup(const struct xvs_ct_key *rk, const struct xvs_ct_entry *rev, __u64 now, bool unreplied)
{
	struct xvs_ct_key fk = {};
	struct xvs_ct_entry *fe;

	ct_key(&fk, rev->snat_addr, rev->nat_addr, rev->snat_port, rev->nat_port, rk->proto, rk->family);
	fe = ct_get(unreplied ? XVS_CT_TABLE_UNREPLIED : XVS_CT_TABLE_ESTABLISHED, &fk);
	if (!fe || ct_is_reply(fe) || now > fe->expires)
		return NULL;
	if (!addr_eq(fe->nat_addr, rk->saddr) || fe->nat_port != rk->sport)
		return NULL;
	if (ct_is_snat(fe)) {
		if (!addr_eq(fe->snat_addr, rk->daddr) || fe->snat_port != rk->dport)
			return NULL;
	} else if (!addr_eq(rev->snat_addr, rk->daddr) || rev->snat_port != rk->dport) {
		return NULL;
	}
	return fe;
}

/* ct_flow_lookup as a call of its own, verified apart from its callers'
 * states. */
static __attribute__((noinline)) struct xvs_ct_entry *
ct_flow_of(const struct xvs_ct_key *rk, const struct xvs_ct_entry *rev, __u64 now, bool unreplied)
{
	return ct_flow_lookup(rk, rev, now, unreplied);
}

/* The first reply of a flow: its two entries (rev at rk, and its forward
 * entry) move from xvs_ct_unreplied to xvs_conntrack, written there before
 * they are deleted here so that no packet finds neither. */
static __attribute__((noinline)) void ct_promote(const struct xvs_ct_key *rk, const struct xvs_ct_entry *rev)
{
	struct xvs_ct_key fk = {};
	struct xvs_ct_entry *fe;

	ct_key(&fk, rev->snat_addr, rev->nat_addr, rev->snat_port, rev->nat_port, rk->proto, rk->family);
	fe = ct_get(XVS_CT_TABLE_UNREPLIED, &fk);
	if (!fe)
		return;
	if (ct_put(XVS_CT_TABLE_ESTABLISHED, &fk, fe, BPF_ANY) ||
	    ct_put(XVS_CT_TABLE_ESTABLISHED, rk, rev, BPF_ANY))
		return;
	ct_del(XVS_CT_TABLE_UNREPLIED, rk);
	ct_del(XVS_CT_TABLE_UNREPLIED, &fk);
}

#endif
