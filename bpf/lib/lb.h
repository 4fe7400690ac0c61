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

static __always_inline void svc_key_v4(struct xvs_svc_key *k, __be32 addr, __be16 port, __u8 proto,
				       __u8 scope)
{
	__builtin_memcpy(k->addr, &addr, sizeof(addr));
	k->port = port;
	k->proto = proto;
	k->family = XVS_FAMILY_IPV4;
	k->scope = scope;
	k->slot = 0;
}

/* Pick a slot in 1..count. Schedulers other than random arrive with the
 * scheduler work; every choice still goes through here. */
static __always_inline __u16 lb_pick_slot(const struct xvs_svc_value *svc)
{
	return (__u16)(bpf_get_prandom_u32() % svc->count) + 1;
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

#endif
