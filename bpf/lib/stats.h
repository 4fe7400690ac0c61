/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: verdicts, per service and per backend. Per-CPU maps
 * need no atomics. The verdicts are an array; a service's or backend's
 * entry is created by the first flush that counts for its ID (stats_of),
 * and deleted by the agent when it frees or hands out the ID again. */
#ifndef XVS_STATS_H
#define XVS_STATS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "flags.h"
#include "maps.h"
#include "types.h"

/* What a new ID's counters start from (read-only data, not the stack). */
static const struct xvs_stats xvs_stats_zero;

/* The counters of a service or backend ID, created on first use. The
 * agent could create them with the IDs, but a per-CPU element costs the
 * kernel an allocation of several microseconds: a full sync of 100k
 * Services with a million backends spent 8 s creating counters, most for
 * IDs that carry no traffic. BPF_NOEXIST keeps an entry another CPU made
 * meanwhile. NULL only when the map is full, which the agent's ID space
 * (max_entries IDs) rules out. */
static __always_inline struct xvs_stats *stats_of(void *map, __u32 id)
{
	struct xvs_stats *s = bpf_map_lookup_elem(map, &id);

	if (s)
		return s;
	bpf_map_update_elem(map, &id, &xvs_stats_zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, &id);
}

static __always_inline void stats_verdict(__u32 verdict, __u32 bytes)
{
	struct xvs_stats *s = bpf_map_lookup_elem(&xvs_verdicts, &verdict);

	if (s) {
		s->packets_in++;
		s->bytes_in += bytes;
	}
}

/* Add a conntrack entry's pending packets and bytes to the per-CPU
 * counters of its service and backend: the forward entry counts "in", the
 * reply entry "out", and the first flush of a forward entry also counts the
 * connection. */
static __always_inline void stats_flush(struct xvs_ct_entry *e)
{
	/* stats_of takes the keys to its stack: e may be memory a global
	 * function was handed, which older kernels take as no map key. */
	struct xvs_stats *s = stats_of(&xvs_svc_stats, e->svc_id);
	struct xvs_stats *b = stats_of(&xvs_backend_stats, e->backend_id);
	bool in = !ct_is_reply(e);
	__u64 conns = in && !(e->flags & XVS_CT_F_COUNTED);

	if (s) {
		s->conns += conns;
		if (in) {
			s->packets_in += e->packets;
			s->bytes_in += e->bytes;
		} else {
			s->packets_out += e->packets;
			s->bytes_out += e->bytes;
		}
	}
	if (b) {
		b->conns += conns;
		if (in) {
			b->packets_in += e->packets;
			b->bytes_in += e->bytes;
		} else {
			b->packets_out += e->packets;
			b->bytes_out += e->bytes;
		}
	}
	if (conns)
		e->flags |= XVS_CT_F_COUNTED;
	e->packets = 0;
	e->bytes = 0;
}

#endif
