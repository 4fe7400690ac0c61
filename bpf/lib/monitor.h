/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Drop and reject events for `xvs monitor`. Every verdict is counted
 * (lib/stats.h); the monitored ones (XVS_V_MONITORED) also write the packet
 * they were given for into the xvs_events ring, while a monitor is
 * listening. A per-CPU token bucket bounds the events (a flood of dropped
 * packets costs each a map lookup and a subtraction, not a ring write),
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

	if (!cfg || !cfg->enabled || !cfg->rate)
		return 0;
	struct xvs_monitor_bucket *st = bpf_map_lookup_elem(&xvs_monitor_state, &zero);

	if (!st)
		return 0;
	/* Token bucket in nanoseconds: an event costs 1e9/rate, the credit
	 * grows with time, up to burst events. */
	__u64 now = bpf_ktime_get_ns();
	__u64 cost = 1000000000ULL / cfg->rate;
	__u64 cap = cost * (cfg->burst ? cfg->burst : 1);
	__u64 credit = st->credit + (now - st->last);

	st->last = now;
	if (credit > cap)
		credit = cap;
	if (credit < cost) {
		st->credit = credit;
		st->suppressed++;
		return 0;
	}
	st->credit = credit - cost;

	struct flow_scratch *sc = flow_scratch_get();

	if (!sc)
		return 0;
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
