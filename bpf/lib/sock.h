/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Traffic from the node itself: socket-level load balancing in cgroup
 * hooks (the programs are in xvs.c) (see bpf/README.md for why). connect() and sendmsg() to a frontend
 * are sent to a backend chosen exactly as for packets; recvmsg() and
 * getpeername() show the frontend again. The kernel's socket then talks to
 * the backend directly: no per-packet NAT, no conntrack entry. Only
 * processes in the agent's network namespace are served. */
#ifndef XVS_SOCK_H
#define XVS_SOCK_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow.h"
#include "lb.h"
#include "flags.h"
#include "maps.h"
#include "monitor.h"
#include "stats.h"
#include "types.h"

#define SOCK_ALLOW   1
#define SOCK_DENY    0
#define ECONNREFUSED 111
#define ETIMEDOUT    110

static __always_inline const struct xvs_config *sock_config(struct bpf_sock_addr *ctx)
{
	__u32 zero = 0;
	const struct xvs_config *cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);

	if (!cfg || cfg->netns_cookie == 0 || cfg->netns_cookie != bpf_get_netns_cookie(ctx))
		return NULL;
	return cfg;
}

static __always_inline void sock_key(struct xvs_sock_key *k, __u64 cookie, const __u8 addr[16], __be16 port,
				     __u8 proto)
{
	k->cookie = cookie;
	__builtin_memcpy(k->addr, addr, 16);
	k->port = port;
	k->proto = proto;
}

/* ctx fields must be read and written at constant offsets from ctx: the
 * barriers keep the compiler from folding the four words into pointer
 * arithmetic the verifier refuses. */
#define sock_barrier() asm volatile("" ::: "memory")

/* The socket address's IP as 16 bytes (IPv4 zero-padded). */
static __always_inline void sock_get_ip(const struct bpf_sock_addr *ctx, bool v6, __u8 out[16])
{
	__u32 w[4] = {};

	if (v6) {
		w[0] = ctx->user_ip6[0];
		sock_barrier();
		w[1] = ctx->user_ip6[1];
		sock_barrier();
		w[2] = ctx->user_ip6[2];
		sock_barrier();
		w[3] = ctx->user_ip6[3];
	} else {
		w[0] = ctx->user_ip4;
	}
	__builtin_memcpy(out, w, 16);
}

static __always_inline void sock_set(struct bpf_sock_addr *ctx, bool v6, const __u8 addr[16], __be16 port)
{
	__u32 w[4];

	__builtin_memcpy(w, addr, 16);
	if (v6) {
		ctx->user_ip6[0] = w[0];
		sock_barrier();
		ctx->user_ip6[1] = w[1];
		sock_barrier();
		ctx->user_ip6[2] = w[2];
		sock_barrier();
		ctx->user_ip6[3] = w[3];
	} else {
		ctx->user_ip4 = w[0];
	}
	ctx->user_port = port;
}

/* Fail the socket call as the packet path would treat its first packet;
 * `xvs monitor` sees it with the node's address as source and port 0 (the
 * socket has none yet). */
static __always_inline int sock_fail(const struct xvs_pkt *p, __u32 v, int err)
{
	struct flow_scratch *sc = flow_scratch_get();

	stats_verdict(v, 0);
	if (sc) {
		__builtin_memcpy(&sc->pkt, p, sizeof(sc->pkt));
		sc->res.now = 0;
		sc->res.len = 0;
		monitor_event(v, XVS_HOOK_SOCK);
	}
	bpf_set_retval(-err);
	return SOCK_DENY;
}

/* Does the socket balancer take a host socket of this protocol? Not while
 * xvs drains (netfilter's rules serve the node then). */
static __always_inline bool sock_serves(const struct xvs_config *cfg, __u8 proto)
{
	return !cfg_draining(cfg) && (proto == IPPROTO_TCP || proto == IPPROTO_UDP);
}

/* The packet the decision sees for a host socket addressing daddr:dport:
 * from the node's own address, without a source port (the socket may not
 * have one yet). */
static __always_inline void sock_pkt(struct xvs_pkt *p, const struct xvs_config *cfg, bool v6,
				     const __u8 daddr[16], __be16 dport, __u8 proto)
{
	__builtin_memset(p, 0, sizeof(*p));
	p->dport = dport;
	p->proto = proto;
	p->family = v6 ? XVS_FAMILY_IPV6 : XVS_FAMILY_IPV4;
	p->scan_slot = LB_SCAN_SOCKET;
	p->has_l4 = true;
	__builtin_memcpy(p->saddr, v6 ? cfg->snat_addr6 : cfg->snat_addr4, 16);
	__builtin_memcpy(p->daddr, daddr, 16);
}

/* The socket balancer's decision for a new host socket addressing p's
 * destination: XVS_ACT_PASS (not a frontend: the packet path sees what
 * follows), XVS_ACT_NEW with the backend (*be, *backend_id) and the
 * frontend's entry (*svcp) set, or XVS_ACT_DROP or XVS_ACT_REJECT with
 * *verdict the reason. The node itself is an in-cluster client. The one
 * decision of the hooks (sock_balance) and of `xvs explain --from-host`
 * (xvs_explain_sock, which can run where cgroup programs cannot be
 * test-run). */
static __always_inline int sock_decide(const struct xvs_pkt *p, struct xvs_svc_key *key,
				       struct xvs_svc_value **svcp, struct xvs_backend **be,
				       __u32 *backend_id, __u32 *verdict)
{
	struct xvs_svc_value *svc = flow_frontend(p, key);
	int act;

	if (!svc)
		return XVS_ACT_PASS;
	act = flow_admit(p, key, &svc, true, verdict);
	if (act != XVS_ACT_NEW)
		return act;
	*svcp = svc;
	*be = flow_choose(p, key, svc, bpf_ktime_get_ns(), backend_id);
	if (!*be) {
		*verdict = XVS_V_DROP_NO_BACKEND;
		return XVS_ACT_DROP;
	}
	return XVS_ACT_NEW;
}

/* Choose the backend for a host socket addressing ctx's destination and
 * rewrite the destination; returns the hook's verdict. */
static __noinline int sock_balance(struct bpf_sock_addr *ctx, bool remember, bool v6)
{
	const struct xvs_config *cfg = sock_config(ctx);
	__u8 proto = ctx->protocol;

	if (!cfg || !sock_serves(cfg, proto))
		return SOCK_ALLOW;

	struct xvs_pkt p;
	__u8 daddr[16];

	sock_get_ip(ctx, v6, daddr);
	sock_pkt(&p, cfg, v6, daddr, (__be16)ctx->user_port, proto);
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct xvs_sock_key k = {};
	struct xvs_sock_value *have;

	/* A socket keeps its backend per frontend (unconnected UDP sends one
	 * datagram at a time, as one flow). */
	sock_key(&k, cookie, p.daddr, p.dport, proto);
	have = bpf_map_lookup_elem(&xvs_sock_fwd, &k);
	if (have) {
		sock_set(ctx, v6, have->addr, have->port);
		return SOCK_ALLOW;
	}

	struct xvs_svc_key key = {};
	struct xvs_svc_value *svc = NULL;
	struct xvs_backend *be = NULL;
	__u32 backend_id = 0, v = 0;

	/* A connection the packet path would drop times out; one it would
	 * reject is refused. */
	switch (sock_decide(&p, &key, &svc, &be, &backend_id, &v)) {
	case XVS_ACT_NEW:
		break;
	case XVS_ACT_PASS:
		return SOCK_ALLOW; /* not a frontend; tc sees what follows */
	case XVS_ACT_REJECT:
		return sock_fail(&p, XVS_V_SOCK_REFUSED, ECONNREFUSED);
	default:
		return sock_fail(&p, XVS_V_SOCK_DROPPED, ETIMEDOUT);
	}
	if (!svc || !be)
		return SOCK_ALLOW; /* for the verifier: set with XVS_ACT_NEW */

	struct xvs_sock_value fwd = {.port = be->port}, rev = {.port = p.dport};

	__builtin_memcpy(fwd.addr, be->addr, sizeof(fwd.addr));
	__builtin_memcpy(rev.addr, p.daddr, 16);
	if (remember)
		bpf_map_update_elem(&xvs_sock_fwd, &k, &fwd, BPF_ANY);
	sock_key(&k, cookie, be->addr, be->port, proto);
	bpf_map_update_elem(&xvs_sock_rev, &k, &rev, BPF_ANY);

	struct xvs_stats *s = stats_of(&xvs_svc_stats, svc->svc_id);
	struct xvs_stats *b = stats_of(&xvs_backend_stats, backend_id);

	if (s)
		s->conns++;
	if (b)
		b->conns++;
	stats_verdict(XVS_V_SOCK_CONNECT, 0);
	sock_set(ctx, v6, be->addr, be->port);
	return SOCK_ALLOW;
}

/* Show the frontend instead of the backend (recvmsg, getpeername). */
static __always_inline int sock_reverse(struct bpf_sock_addr *ctx, bool v6)
{
	const struct xvs_config *cfg = sock_config(ctx);
	struct xvs_sock_key k = {};
	struct xvs_sock_value *v;
	__u8 ip[16];

	if (!cfg)
		return SOCK_ALLOW;
	sock_get_ip(ctx, v6, ip);
	sock_key(&k, bpf_get_socket_cookie(ctx), ip, (__be16)ctx->user_port, ctx->protocol);
	v = bpf_map_lookup_elem(&xvs_sock_rev, &k);
	if (v)
		sock_set(ctx, v6, v->addr, v->port);
	return SOCK_ALLOW;
}

#endif
