/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: verdicts, per service and per backend. Per-CPU arrays
 * need no atomics and no allocation on the packet path. */
#ifndef XVS_STATS_H
#define XVS_STATS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

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

/* Count one packet for a service and its backend; in is the client-to-
 * backend direction, new marks the first packet of a connection. */
static __always_inline void stats_flow(__u32 svc_id, __u32 backend_id, bool in, bool new, __u32 bytes)
{
	struct xvs_stats *s = bpf_map_lookup_elem(&xvs_svc_stats, &svc_id);
	struct xvs_stats *b = bpf_map_lookup_elem(&xvs_backend_stats, &backend_id);

	if (s) {
		s->conns += new;
		if (in) {
			s->packets_in++;
			s->bytes_in += bytes;
		} else {
			s->packets_out++;
			s->bytes_out += bytes;
		}
	}
	if (b) {
		b->conns += new;
		if (in) {
			b->packets_in++;
			b->bytes_in += bytes;
		} else {
			b->packets_out++;
			b->bytes_out += bytes;
		}
	}
}

#endif
