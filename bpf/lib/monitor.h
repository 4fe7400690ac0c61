/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Drop and reject events for `xvs monitor`. Every verdict is counted
 * (lib/stats.h); the monitored ones (XVS_V_MONITORED) also write the packet
 * they were given for into the xvs_events ring, while a monitor is
 * listening. A per-CPU rate limit bounds the events (a flood of dropped
 * packets costs each two map lookups and a compare, not a ring write),
 * and what it turns away, and what a full ring has no room for, is counted
 * for the monitor to report. */
#ifndef XVS_MONITOR_H
#define XVS_MONITOR_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "flow.h"
#include "maps.h"
#include "types.h"

static __always_inline bool monitored(__u32 verdict)
{
	return verdict < 32 && ((1u << verdict) & XVS_V_MONITORED);
}

/* One event for the packet in this CPU's scratch space, which got verdict
 * at hook: a global function, verified once, called from every program
 * that drops. */
__noinline int monitor_event(__u32 verdict, __u32 hook)
{
	__u32 zero = 0;
	const struct xvs_monitor_settings *cfg = bpf_map_lookup_elem(&xvs_monitor_config, &zero);

	if (!cfg || !cfg->enabled)
		return 0;
	struct xvs_monitor_bucket *st = bpf_map_lookup_elem(&xvs_monitor_state, &zero);
	struct flow_scratch *sc = flow_scratch_get();

	if (!st || !sc)
		return 0;
	/* The rate limit (GCRA, a token bucket in one number): next is when
	 * the next event is due at the rate; an event may come up to ahead
	 * ns early (the burst). A suppressed event costs a compare and an
	 * increment. The packet's own timestamp when the decision took one
	 * (every monitored verdict comes after flow_track): no clock read. */
	__u64 now = sc->res.now;

	if (!now)
		now = bpf_ktime_get_ns();
	__u64 next = st->next;

	if (next > now + cfg->ahead) {
		st->suppressed++;
		return 0;
	}
	st->next = (next > now ? next : now) + cfg->cost;

	struct xvs_event *ev = bpf_ringbuf_reserve(&xvs_events, sizeof(*ev), 0);

	if (!ev) {
		st->lost++;
		return 0;
	}
	const struct xvs_pkt *p = &sc->pkt;

	ev->ts = now;
	__builtin_memcpy(ev->saddr, p->saddr, 16);
	__builtin_memcpy(ev->daddr, p->daddr, 16);
	ev->sport = p->sport;
	ev->dport = p->dport;
	ev->ifindex = p->ifindex;
	ev->verdict = verdict;
	ev->len = sc->res.len;
	ev->proto = p->proto;
	ev->family = p->family;
	ev->hook = hook;
	ev->tcp_flags = p->tcp_flags;
	bpf_ringbuf_submit(ev, 0);
	return 1;
}

#endif
