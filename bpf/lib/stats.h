/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: verdicts, per service and per backend. Per-CPU maps
 * need no atomics, and the packet path never allocates: the verdicts are an
 * array, and the agent creates every service's and backend's entry (a
 * lookup that finds none counts nothing). */
#ifndef XVS_STATS_H
#define XVS_STATS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "flags.h"
#include "maps.h"
#include "types.h"

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
	/* The keys from the stack: e may be memory a global function was
	 * handed, which older kernels take as no map key. */
	__u32 id = e->svc_id;
	struct xvs_stats *s = bpf_map_lookup_elem(&xvs_svc_stats, &id);

	id = e->backend_id;
	struct xvs_stats *b = bpf_map_lookup_elem(&xvs_backend_stats, &id);
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
