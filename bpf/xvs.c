//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The xvs datapath's programs: Service load balancing at tc ingress, with
 * an XDP fast path on the node's external interfaces and socket hooks for
 * the node's own connections. Every program parses with lib/parse.h and
 * decides with lib/flow.h; the helpers are in lib/, one concern a header.
 *
 * tc ingress runs on every interface that carries traffic into the node
 * (external interfaces, pod veths, links to other nodes). A packet is, in
 * order:
 *   1. part of a tracked flow: DNAT (forward) or reverse NAT (reply), with
 *      the masquerade of that flow if it has one;
 *   2. addressed to a frontend: a new flow (lib/flow.h), or a REJECT/DROP
 *      when the Service has nothing to offer or the source is not allowed;
 *   3. addressed to a live ClusterIP on another port (REJECT) or to an
 *      unallocated service address (DROP);
 *   4. anything else: passed untouched.
 * A rewritten packet is forwarded straight to its egress interface
 * (bpf_fib_lookup, then bpf_redirect with the neighbour's MAC, or
 * bpf_redirect_neigh with the next hop when the neighbour is not resolved
 * yet), so no netfilter rule is involved and a masqueraded packet, whose
 * source is now a node address, never meets the stack's martian-source
 * check. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lib/flow.h"
#include "lib/icmp.h"
#include "lib/monitor.h"
#include "lib/parse.h"
#include "lib/reject.h"
#include "lib/sock.h"
#include "lib/stats.h"
#include "lib/tc.h"
#include "lib/types.h"
#include "lib/xdp.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Send an ICMP error translated at tc ingress (lib/icmp.h) on the way the
 * flow's packets in its direction go (tc_forward, without a rewrite): to
 * the client as the replies (its new source is the frontend, the node's
 * own address for a NodePort, which the stack would drop as a martian if
 * it were handed the packet), or to the backend as the requests (through
 * netfilter in netfilter mode: nf_flags). v is its verdict. */
static __always_inline int icmp_forward(struct __sk_buff *skb, __u32 l3_off, bool v6, struct xvs_pkt *p,
					struct flow_res *res, __u32 v, __u32 nf_flags)
{
	__builtin_memset(&res->rw, 0, sizeof(res->rw));
	p->l3_off = l3_off;
	if (v6) {
		p->family = XVS_FAMILY_IPV6;
		p->proto = IPPROTO_ICMPV6;
		if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct ipv6hdr, saddr), res->rw.saddr, 16) ||
		    bpf_skb_load_bytes(skb, l3_off + offsetof(struct ipv6hdr, daddr), res->rw.daddr, 16))
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	} else {
		p->family = XVS_FAMILY_IPV4;
		p->proto = IPPROTO_ICMP;
		if (bpf_skb_load_bytes(skb, l3_off + offsetof(struct iphdr, saddr), res->rw.saddr, 4) ||
		    bpf_skb_load_bytes(skb, l3_off + offsetof(struct iphdr, daddr), res->rw.daddr, 4))
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	}
	res->verdict = v;
	int ret = tc_forward(skb, p, &res->rw, &res->verdict, tc_how(skb, nf_flags, 0));

	return verdict(ret, res->verdict, skb);
}

/* l3: the device has no link-layer header (tun, IPIP, WireGuard): the
 * network header is the packet's start. */
static __always_inline int handle_ip(struct __sk_buff *skb, bool l3)
{
	bool v6 = skb->protocol == bpf_htons(ETH_P_IPV6);
	__u32 l3_off = l3 ? 0 : ETH_HLEN;
	struct flow_scratch *sc = flow_scratch();
	__u32 xdp_nf = 0;
	bool xdp = xdp_done(skb, &xdp_nf);
	int ret;

	if (!sc)
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	struct xvs_pkt *p = &sc->pkt;
	struct flow_res *res = &sc->res;

	res->len = skb->len;
	switch (tc_parse(skb, l3_off, v6, p)) {
	case XVS_PARSE_OK:
		break;
	case XVS_PARSE_IGNORE:
		/* Perhaps an ICMP error about one of the flows reverse-NATed
		 * here (lib/icmp.h). */
		switch (icmp_error(skb, l3_off, v6, false, &res->nf_flags)) {
		case ICMP_ABOUT_REQUEST:
			return icmp_forward(skb, l3_off, v6, p, res, XVS_V_REPLY_ICMP, 0);
		case ICMP_ABOUT_REPLY:
			return icmp_forward(skb, l3_off, v6, p, res, XVS_V_FWD_ICMP, res->nf_flags);
		case -1:
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
		}
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	case XVS_PARSE_FRAGMENT:
		return verdict(TC_ACT_OK, XVS_V_PASS_FRAGMENT, skb);
	default:
		return verdict(TC_ACT_OK, XVS_V_PASS_MALFORMED, skb);
	}
	if (xdp) {
		/* The XDP program already translated it: only forwarding is
		 * left (see lib/xdp.h). */
		__builtin_memcpy(res->rw.saddr, p->saddr, 16);
		__builtin_memcpy(res->rw.daddr, p->daddr, 16);
		res->rw.sport = p->sport;
		res->rw.dport = p->dport;
		res->verdict = XVS_V_FWD_XDP;
		ret = tc_forward(skb, p, &res->rw, &res->verdict, tc_how(skb, xdp_nf, 0));
		return verdict(ret, res->verdict, skb);
	}

	p->ifindex = skb->ingress_ifindex;
	switch (flow_process(skb, false, p, res)) {
	case XVS_ACT_NAT:
		ret = tc_forward(skb, p, &res->rw, &res->verdict, tc_how(skb, res->nf_flags, TC_FWD_REWRITE));
		return verdict(ret, res->verdict, skb);
	case XVS_ACT_DROP:
		return verdict(TC_ACT_SHOT, res->verdict, skb);
	case XVS_ACT_REJECT:
		ret = reject_packet(skb, p);
		if (ret < 0)
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REJECT_FAILED, skb);
		return verdict(ret, res->verdict, skb);
	}
	return verdict(TC_ACT_OK, res->verdict, skb);
}

/* vlan_tagged: the packet carries an 802.1Q/802.1ad tag for a VLAN (not a
 * priority tag, VLAN 0). tc sees a VLAN's packets on the lower device with
 * the tag in the skb's metadata, before the stack hands them to the VLAN's
 * own device (eth0.100), whose program sees them again without it. They
 * are that device's business: a packet translated and redirected here
 * would keep the tag, and the pod or client it reached would drop it as
 * another VLAN's; and one on a VLAN this node has no device for must not
 * be forwarded at all. */
static __always_inline bool vlan_tagged(const struct __sk_buff *skb)
{
	return skb->vlan_present && (skb->vlan_tci & 0x0fff);
}

SEC("tc")
int xvs_tc_ingress(struct __sk_buff *skb)
{
	if (vlan_tagged(skb))
		return verdict(TC_ACT_OK, XVS_V_PASS_VLAN, skb);
	if (skb->protocol == bpf_htons(ETH_P_IP) || skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_ip(skb, false);
	return verdict(TC_ACT_OK, XVS_V_PASS, skb);
}

/* The same for devices without a link-layer header (the loader picks it by
 * the device's type). */
SEC("tc")
int xvs_tc_ingress_l3(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP) || skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_ip(skb, true);
	return verdict(TC_ACT_OK, XVS_V_PASS, skb);
}

/* tc egress: replies of hostNetwork endpoints on this node, and in
 * netfilter mode of every flow (see flow_egress). They were routed (and
 * filtered) by the stack already and go on out of this device; only their
 * source changes back to the frontend. A node in bypass mode without such
 * endpoints pays one map lookup per packet. */
static __always_inline int handle_egress(struct __sk_buff *skb, bool v6, bool l3)
{
	__u32 l3_off = l3 ? 0 : ETH_HLEN;
	__u32 zero = 0;
	const struct xvs_config *cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);

	if (!cfg || !cfg_needs_egress(cfg))
		return TC_ACT_OK;
	struct flow_scratch *sc = flow_scratch();

	if (!sc)
		return TC_ACT_OK;
	struct xvs_pkt *p = &sc->pkt;
	struct flow_res *res = &sc->res;

	res->len = skb->len;
	switch (tc_parse(skb, l3_off, v6, p)) {
	case XVS_PARSE_OK:
		break;
	case XVS_PARSE_IGNORE:
		/* Perhaps an ICMP error about one of the flows reverse-NATed
		 * here (lib/icmp.h). */
		switch (icmp_error(skb, l3_off, v6, true, &res->nf_flags)) {
		case ICMP_ABOUT_REQUEST:
			return verdict(TC_ACT_OK, XVS_V_REPLY_ICMP, skb);
		case -1:
			return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
		}
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
	p->ifindex = skb->ifindex;
	if (flow_egress(p, res) != XVS_ACT_NAT)
		return TC_ACT_OK;
	if (tc_rewrite(skb, p, &res->rw))
		return verdict(TC_ACT_SHOT, XVS_V_DROP_REWRITE, skb);
	return verdict(TC_ACT_OK, res->verdict, skb);
}

SEC("tc")
int xvs_tc_egress(struct __sk_buff *skb)
{
	/* Translated, if at all, by the VLAN device's program on its way here. */
	if (vlan_tagged(skb))
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return handle_egress(skb, false, false);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_egress(skb, true, false);
	return TC_ACT_OK;
}

SEC("tc")
int xvs_tc_egress_l3(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return handle_egress(skb, false, true);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return handle_egress(skb, true, true);
	return TC_ACT_OK;
}

/* The floor for benchmarks: the cheapest possible tc program. */
SEC("tc")
int xvs_tc_empty(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

/* XDP, on the node's external interfaces (lib/xdp.h): the same decision,
 * before an skb exists. */
SEC("xdp")
int xvs_xdp(struct xdp_md *ctx)
{
	struct flow_scratch *sc = flow_scratch();

	if (!sc)
		return XDP_PASS;

	struct xvs_pkt *p = &sc->pkt;

	if (!xdp_parse(ctx, p))
		return XDP_PASS;
	/* The frame's length, kept in the scratch space (a pointer
	 * difference held across the calls below would be spilled, which
	 * the verifier refuses). */
	sc->res.len = ctx->data_end - ctx->data;
	/* Room for the mark first: without it, tc must do everything. */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct xvs_xdp_meta)))
		return XDP_PASS;

	void *data = (void *)(long)ctx->data;
	struct xvs_xdp_meta *meta = (void *)(long)ctx->data_meta;

	if ((void *)(meta + 1) > data)
		return XDP_PASS;
	meta->magic = 0;

	switch (flow_process(ctx, true, p, &sc->res)) {
	case XVS_ACT_NAT:
		if (xdp_too_big(ctx, p, &sc->res.rw))
			return XDP_PASS;
		if (!xdp_rewrite(ctx, p, &sc->res.rw)) {
			stats_verdict(XVS_V_DROP_REWRITE, sc->res.len);
			monitor_event(XVS_V_DROP_REWRITE, XVS_HOOK_XDP);
			return XDP_DROP;
		}
		meta = (void *)(long)ctx->data_meta;
		if ((void *)(meta + 1) > (void *)(long)ctx->data)
			return XDP_DROP;
		meta->magic = XVS_XDP_MAGIC;
		meta->nf_flags = sc->res.nf_flags;
		stats_verdict(sc->res.verdict, sc->res.len);
		return XDP_PASS;
	case XVS_ACT_DROP:
		stats_verdict(sc->res.verdict, sc->res.len);
		if (monitored(sc->res.verdict))
			monitor_event(sc->res.verdict, XVS_HOOK_XDP);
		return XDP_DROP;
	}
	/* PASS and REJECT: tc decides again (and counts). */
	return XDP_PASS;
}

/* The floor for benchmarks: the cheapest possible XDP program. */
SEC("xdp")
int xvs_xdp_empty(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* Host sockets (lib/sock.h): the same admission and choice at connect()
 * and sendmsg(), the frontend shown again at recvmsg() and getpeername(). */
SEC("cgroup/connect4")
int xvs_sock_connect4(struct bpf_sock_addr *ctx)
{
	return sock_balance(ctx, false, false);
}

SEC("cgroup/sendmsg4")
int xvs_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_balance(ctx, true, false);
}

SEC("cgroup/recvmsg4")
int xvs_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return sock_reverse(ctx, false);
}

SEC("cgroup/getpeername4")
int xvs_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return sock_reverse(ctx, false);
}

SEC("cgroup/connect6")
int xvs_sock_connect6(struct bpf_sock_addr *ctx)
{
	return sock_balance(ctx, false, true);
}

SEC("cgroup/sendmsg6")
int xvs_sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock_balance(ctx, true, true);
}

SEC("cgroup/recvmsg6")
int xvs_sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return sock_reverse(ctx, true);
}

SEC("cgroup/getpeername6")
int xvs_sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return sock_reverse(ctx, true);
}

/* `xvs explain --from-host`: the socket hooks' decision (sock_decide) for
 * the destination of a crafted packet, since cgroup socket programs cannot
 * be test-run. Only the explainer (maps.Explainer) loads it, over copies of
 * the maps; the agent never does (loader's toolPrograms). The outcome is
 * left where the explainer reads the packet path's: the verdict counted (a
 * hook's: sock_connect, sock_refused or sock_dropped; pass when the hooks
 * leave the socket alone), and in the scratch space the frontend's key,
 * the backend (rw.daddr, rw.dport; entry.backend_id) and the admission's
 * reason (res.verdict). */
SEC("tc")
int xvs_explain_sock(struct __sk_buff *skb)
{
	__u32 zero = 0;
	const struct xvs_config *cfg = bpf_map_lookup_elem(&xvs_node_config, &zero);
	struct flow_scratch *sc = flow_scratch();
	bool v6 = skb->protocol == bpf_htons(ETH_P_IPV6);

	if (!cfg || !sc || tc_parse(skb, ETH_HLEN, v6, &sc->pkt) != XVS_PARSE_OK)
		return verdict(TC_ACT_OK, XVS_V_PASS_MALFORMED, skb);
	if (!sock_serves(cfg, sc->pkt.proto))
		return verdict(TC_ACT_OK, cfg_draining(cfg) ? XVS_V_PASS_DRAINING : XVS_V_PASS, skb);

	struct xvs_pkt *p = &sc->pkt;
	struct flow_res *res = &sc->res;
	struct xvs_svc_value *svc = NULL;
	struct xvs_backend *be = NULL;
	__be16 dport = p->dport;
	__u8 proto = p->proto, daddr[16];

	__builtin_memcpy(daddr, p->daddr, 16);
	sock_pkt(p, cfg, v6, daddr, dport, proto);
	switch (sock_decide(p, &res->key, &svc, &be, &sc->entry.backend_id, &res->verdict)) {
	case XVS_ACT_NEW:
		break;
	case XVS_ACT_PASS:
		return verdict(TC_ACT_OK, XVS_V_PASS, skb);
	case XVS_ACT_REJECT:
		stats_verdict(XVS_V_SOCK_REFUSED, 0);
		return TC_ACT_SHOT;
	default:
		stats_verdict(XVS_V_SOCK_DROPPED, 0);
		return TC_ACT_SHOT;
	}
	if (!be)
		return TC_ACT_SHOT; /* for the verifier: set with XVS_ACT_NEW */
	__builtin_memcpy(res->rw.saddr, p->saddr, 16);
	__builtin_memcpy(res->rw.daddr, be->addr, 16);
	res->rw.dport = be->port;
	stats_verdict(XVS_V_SOCK_CONNECT, 0);
	return TC_ACT_OK;
}

/* Enums that only travel through u8/u16 fields never reach BTF on their
 * own; these unused pointers put them there so bpf2go emits them for Go. */
const enum xvs_kind *_unused_kind __attribute__((unused));
const enum xvs_sched *_unused_sched __attribute__((unused));
const enum xvs_backend_flags *_unused_backend_flags __attribute__((unused));
const enum xvs_scope *_unused_scope __attribute__((unused));
const enum xvs_svc_flags *_unused_svc_flags __attribute__((unused));
const enum xvs_config_flags *_unused_config_flags __attribute__((unused));
const enum xvs_port_ranges *_unused_port_ranges __attribute__((unused));
const struct xvs_sched_key *_unused_sched_key __attribute__((unused));
const struct xvs_affinity_key *_unused_affinity_key __attribute__((unused));
const struct xvs_affinity_value *_unused_affinity_value __attribute__((unused));
const struct xvs_member_key *_unused_member_key __attribute__((unused));
const struct xvs_lpm_key *_unused_lpm_key __attribute__((unused));
const struct xvs_vip_key *_unused_vip_key __attribute__((unused));
const struct xvs_sock_key *_unused_sock_key __attribute__((unused));
const struct xvs_sock_value *_unused_sock_value __attribute__((unused));
const enum xvs_ct_flags *_unused_ct_flags __attribute__((unused));
const enum xvs_verdict *_unused_verdict __attribute__((unused));
const enum xvs_ct_state *_unused_ct_state __attribute__((unused));
const enum xvs_ct_slot *_unused_ct_slot __attribute__((unused));
const struct xvs_if_addrs *_unused_if_addrs __attribute__((unused));
const struct xvs_event *_unused_event __attribute__((unused));
const enum xvs_hook *_unused_hook __attribute__((unused));
