/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service lookup and backend selection in the slot model: slot 0 of a
 * (frontend, scope) holds the count and flags, slots 1..count the backend
 * IDs. The agent writes slot 0 last, so a reader that sees a count only ever
 * finds slots that are already written. */
#ifndef XVS_LB_H
#define XVS_LB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "parse.h"
#include "types.h"

static __always_inline void svc_key(struct xvs_svc_key *k, const __u8 addr[16], __be16 port, __u8 proto,
				    __u8 family, __u8 scope)
{
	__builtin_memcpy(k->addr, addr, 16);
	k->port = port;
	k->proto = proto;
	k->family = family;
	k->scope = scope;
	k->slot = 0;
}

/* The murmur3 finalizer: a cheap, well-mixed hash of a 32-bit word. */
static __always_inline __u32 mix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* A hash of an address of either family (IPv4 zero-pads to 16 bytes). */
static __always_inline __u32 addr_hash(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;

	return mix32(w[0] ^ mix32(w[1] ^ mix32(w[2] ^ w[3])));
}

/* Resolve the backend of slot n of the service at key; key is reused. */
static __always_inline struct xvs_backend *lb_slot_backend(struct xvs_svc_key *key, __u16 slot,
							   __u32 *backend_id)
{
	struct xvs_svc_value *sv;

	key->slot = slot;
	sv = bpf_map_lookup_elem(&xvs_services, key);
	key->slot = 0;
	if (!sv)
		return NULL;
	*backend_id = sv->backend_id;
	return bpf_map_lookup_elem(&xvs_backends, backend_id);
}

/* Entry idx of the frontend's scheduler table, or NULL when the table is
 * missing (not yet written): the caller then falls back to random. */
static __always_inline __u32 *lb_table_entry(const struct xvs_svc_key *key, const struct xvs_svc_value *svc,
					     __u32 idx)
{
	struct xvs_sched_key tk = {.svc_id = svc->svc_id, .scope = key->scope};
	void *table = bpf_map_lookup_elem(&xvs_sched_tables, &tk);

	if (!table)
		return NULL;
	return bpf_map_lookup_elem(table, &idx);
}

static __always_inline bool lb_least_conn(__u8 sched)
{
	return sched == XVS_SCHED_LC || sched == XVS_SCHED_WLC || sched == XVS_SCHED_SED ||
	       sched == XVS_SCHED_NQ;
}

/* Backend id's connections as IPVS counts them: opened minus closed by
 * the datapath, minus expired ones the agent reaped. */
static __always_inline void lb_conns(__u32 id, __u32 *active, __u32 *inactive)
{
	struct xvs_conn_counts *held = bpf_map_lookup_elem(&xvs_backend_held, &id);
	struct xvs_conn_counts *reaped = bpf_map_lookup_elem(&xvs_backend_reaped, &id);
	__s32 a = 0, i = 0;

	if (held) {
		a = (__s32)(held->active - (reaped ? reaped->active : 0));
		i = (__s32)(held->inactive - (reaped ? reaped->inactive : 0));
	}
	*active = a > 0 ? a : 0;
	*inactive = i > 0 ? i : 0;
}

/* State of a least-connection scan. It lives in a per-CPU map, not in the
 * caller's stack frame: the 6.1 verifier's bpf_loop inlining loses writes
 * made through the callback's context pointer from one iteration to the
 * next. One slot per calling context (packet path, socket hooks), since a
 * softirq may interrupt a socket hook on the same CPU. */
struct lb_scan {
	struct xvs_svc_key key;
	__u32 best_conns;
	__u32 best_weight;
	__u16 best_slot;
	__u8 sched;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_scan);
	__uint(max_entries, 2);
} xvs_lb_scan SEC(".maps");

enum { LB_SCAN_PACKET = 0, LB_SCAN_SOCKET = 1 };

/* One step of the least-connection scan (bpf_loop callback): slot i + 1;
 * ctx points at the scan's slot number in xvs_lb_scan.
 * The overheads are IPVS's (A active, I inactive connections, W weight):
 *   lc: A * 256 + I;  wlc: (A * 256 + I) / W;  sed: (A + 1) / W;
 *   nq: an idle backend (A = 0) at once, else sed.
 * Ratios compare by cross-multiplication; weight 0 (quiesced) never wins. */
static long lb_scan_step(__u32 i, void *ctx)
{
	struct lb_scan *s = bpf_map_lookup_elem(&xvs_lb_scan, ctx);
	struct xvs_svc_value *sv;
	struct xvs_backend *be;
	__u32 id, c, w;

	if (!s)
		return 1;
	s->key.slot = i + 1;
	sv = bpf_map_lookup_elem(&xvs_services, &s->key);
	if (!sv)
		return 0;
	id = sv->backend_id;
	be = bpf_map_lookup_elem(&xvs_backends, &id);
	if (!be || be->weight == 0)
		return 0;
	__u32 active, inactive;

	lb_conns(id, &active, &inactive);
	w = be->weight;
	if (s->sched == XVS_SCHED_NQ && active == 0) {
		s->best_slot = i + 1;
		return 1;
	}
	if (s->sched == XVS_SCHED_SED || s->sched == XVS_SCHED_NQ)
		c = active + 1;
	else
		c = active * 256 + inactive;
	if (s->best_slot == 0)
		goto take;
	if (s->sched == XVS_SCHED_LC) {
		if (c < s->best_conns)
			goto take;
		return 0;
	}
	if ((__u64)c * s->best_weight < (__u64)s->best_conns * w)
		goto take;
	return 0;
take:
	s->best_slot = i + 1;
	s->best_conns = c;
	s->best_weight = w;
	return 0;
}

/* Choose a slot in 1..count for a new flow with the Service's scheduler
 * (IPVS's names and semantics). Table-driven schedulers read the entry's
 * backend ID directly and return slot 0 with *table_id set. */
static __always_inline __u16 lb_pick(const struct xvs_svc_key *key, const struct xvs_svc_value *svc,
				     const struct xvs_pkt *p, __u32 *table_id)
{
	__u32 *e;

	switch (svc->sched) {
	case XVS_SCHED_RR: {
		__u32 ck = svc->svc_id * 2 + key->scope;
		__u32 *cur = bpf_map_lookup_elem(&xvs_rr_cursors, &ck);

		if (!cur)
			break;
		return (__u16)(__sync_fetch_and_add(cur, 1) % svc->count) + 1;
	}
	case XVS_SCHED_WRR: {
		__u32 ck = svc->svc_id * 2 + key->scope;
		__u32 *cur = bpf_map_lookup_elem(&xvs_rr_cursors, &ck);

		if (!cur || svc->table_size == 0)
			break;
		e = lb_table_entry(key, svc, __sync_fetch_and_add(cur, 1) % svc->table_size);
		if (!e)
			break;
		*table_id = *e;
		return 0;
	}
	case XVS_SCHED_MH:
		if (svc->table_size == 0)
			break;
		e = lb_table_entry(key, svc, addr_hash(p->saddr) % svc->table_size);
		if (!e)
			break;
		*table_id = *e;
		return 0;
	case XVS_SCHED_SH:
		return (__u16)(addr_hash(p->saddr) % svc->count) + 1;
	case XVS_SCHED_DH:
		return (__u16)(addr_hash(p->daddr) % svc->count) + 1;
	case XVS_SCHED_LC:
	case XVS_SCHED_WLC:
	case XVS_SCHED_SED:
	case XVS_SCHED_NQ: {
		__u32 slot = p->scan_slot;
		struct lb_scan *s = bpf_map_lookup_elem(&xvs_lb_scan, &slot);

		if (!s)
			break;
		__builtin_memset(s, 0, sizeof(*s));
		s->key = *key;
		s->sched = svc->sched;
		bpf_loop(svc->count, lb_scan_step, &slot, 0);
		if (s->best_slot)
			return s->best_slot;
		break;
	}
	}
	return (__u16)(bpf_get_prandom_u32() % svc->count) + 1;
}

/* Choose the backend of a new flow; NULL when the map is inconsistent. */
static __always_inline struct xvs_backend *lb_select(struct xvs_svc_key *key, const struct xvs_svc_value *svc,
						     const struct xvs_pkt *p, __u32 *backend_id)
{
	__u32 table_id = 0;
	__u16 slot = lb_pick(key, svc, p, &table_id);

	if (slot)
		return lb_slot_backend(key, slot, backend_id);
	*backend_id = table_id;
	return bpf_map_lookup_elem(&xvs_backends, backend_id);
}

#endif
