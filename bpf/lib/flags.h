/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Named tests of the flag words in map values: what a bit means is said
 * once, here, and the decision code reads as the semantics it implements
 * (the agent sets the bits; types.h says when). */
#ifndef XVS_FLAGS_H
#define XVS_FLAGS_H

#include <stdbool.h>

#include "types.h"

/* Services (a frontend's slot 0, xvs_svc_value.flags). */

/* The Service has endpoints somewhere, even when none is usable here. */
static __always_inline bool svc_has_endpoints(const struct xvs_svc_value *s)
{
	return s->flags & XVS_SVC_F_HAS_ENDPOINTS;
}

/* An external frontend of an externalTrafficPolicy: Local Service. */
static __always_inline bool svc_is_local(const struct xvs_svc_value *s)
{
	return s->flags & XVS_SVC_F_LOCAL;
}

static __always_inline bool svc_has_affinity(const struct xvs_svc_value *s)
{
	return s->flags & XVS_SVC_F_AFFINITY;
}

/* loadBalancerSourceRanges restrict who may connect. */
static __always_inline bool svc_has_source_ranges(const struct xvs_svc_value *s)
{
	return s->flags & XVS_SVC_F_SOURCE_RANGES;
}

/* In-cluster clients use the cluster-wide endpoints (a second slot under
 * XVS_SCOPE_SHORT_CIRCUIT) instead of the Local ones. */
static __always_inline bool svc_short_circuits(const struct xvs_svc_value *s)
{
	return s->flags & XVS_SVC_F_SHORT_CIRCUIT;
}

/* Backends (xvs_backend.flags). */

/* The endpoint is this node's own address (hostNetwork). */
static __always_inline bool backend_on_host(const struct xvs_backend *b)
{
	return b->flags & XVS_BACKEND_F_HOST;
}

/* Conntrack entries (xvs_ct_entry.flags). */

/* The entry is a flow's reply direction (backend to client). */
static __always_inline bool ct_is_reply(const struct xvs_ct_entry *e)
{
	return e->flags & XVS_CT_F_REPLY;
}

/* The flow is masqueraded (or remapped after a clash): a new source. */
static __always_inline bool ct_is_snat(const struct xvs_ct_entry *e)
{
	return e->flags & XVS_CT_F_SNAT;
}

/* The flow's replies are reverse-NATed at tc egress: its backend is this
 * node's own address, or netfilter forwards it. */
static __always_inline bool ct_reversed_at_egress(const struct xvs_ct_entry *e)
{
	return e->flags & (XVS_CT_F_HOST | XVS_CT_F_NETFILTER);
}

/* The flow goes through the node's netfilter hooks once translated. */
static __always_inline bool ct_via_netfilter(const struct xvs_ct_entry *e)
{
	return e->flags & XVS_CT_F_NETFILTER;
}

/* The node (xvs_config.flags). */

static __always_inline bool cfg_masquerade_all(const struct xvs_config *c)
{
	return c->flags & XVS_CFG_MASQ_ALL;
}

/* A local-traffic detector says which sources are pods. */
static __always_inline bool cfg_detects_local(const struct xvs_config *c)
{
	return c->flags & XVS_CFG_DETECT_LOCAL;
}

static __always_inline bool cfg_netfilter(const struct xvs_config *c)
{
	return c->flags & XVS_CFG_NETFILTER;
}

/* New flows are not xvs's any more (XVS_CFG_DRAIN). */
static __always_inline bool cfg_draining(const struct xvs_config *c)
{
	return c->flags & XVS_CFG_DRAIN;
}

/* Something is reverse-NATed at egress: hostNetwork endpoints, or
 * netfilter mode. */
static __always_inline bool cfg_needs_egress(const struct xvs_config *c)
{
	return c->flags & (XVS_CFG_HOST_BACKENDS | XVS_CFG_NETFILTER);
}

#endif
