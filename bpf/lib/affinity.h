/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Session affinity (sessionAffinity: ClientIP): a client's new connections
 * go to the backend its previous one went to, while that backend is still
 * in the frontend's endpoint set and the last connection is younger than
 * the timeout. One entry per (ServicePort, client), shared by the
 * ClusterIP, NodePort, ExternalIP and LoadBalancer addresses of the port. */
#ifndef XVS_AFFINITY_H
#define XVS_AFFINITY_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ct.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

static __always_inline void affinity_key(struct xvs_affinity_key *k, const struct xvs_svc_value *svc,
					 const struct xvs_pkt *p)
{
	k->group_id = svc->group_id;
	k->family = p->family;
	__builtin_memcpy(k->addr, p->saddr, 16);
}

/* The sticky backend of the client, or NULL: none yet, expired, or no
 * longer one of this frontend's endpoints (which releases the client to a
 * fresh choice). */
static __always_inline struct xvs_backend *affinity_lookup(const struct xvs_svc_key *key,
							   const struct xvs_svc_value *svc,
							   const struct xvs_pkt *p, __u64 now,
							   __u32 *backend_id)
{
	struct xvs_affinity_key ak = {};
	struct xvs_affinity_value *av;

	affinity_key(&ak, svc, p);
	av = bpf_map_lookup_elem(&xvs_affinity, &ak);
	if (!av || now - av->last_used > (__u64)svc->affinity_timeout * NSEC_PER_SEC)
		return NULL;

	struct xvs_member_key mk = {.svc_id = svc->svc_id, .backend_id = av->backend_id, .scope = key->scope};

	if (!bpf_map_lookup_elem(&xvs_members, &mk))
		return NULL;
	*backend_id = av->backend_id;
	return bpf_map_lookup_elem(&xvs_backends, backend_id);
}

/* Record (or refresh) the client's backend: every new connection restarts
 * the timeout, as kube-proxy's "recent" match and IPVS persistence do. */
static __always_inline void affinity_update(const struct xvs_svc_value *svc, const struct xvs_pkt *p,
					    __u32 backend_id, __u64 now)
{
	struct xvs_affinity_key ak = {};
	struct xvs_affinity_value av = {.last_used = now, .backend_id = backend_id};

	affinity_key(&ak, svc, p);
	bpf_map_update_elem(&xvs_affinity, &ak, &av, BPF_ANY);
}

#endif
