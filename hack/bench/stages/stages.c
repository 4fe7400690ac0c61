//go:build ignore
/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Where a conntrack hit's time goes (bin/bench stages): tc programs that
 * each run one more stage of xvs_tc_ingress's path for a packet of a
 * tracked flow, built from the datapath's own functions (bpf/lib) and
 * loaded over the maps a real load pinned, so that each stage does what
 * the datapath does and the differences between neighbours are the stages'
 * costs. Benchmark code only: nothing here is in the product. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "../../../bpf/lib/flow.h"
#include "../../../bpf/lib/parse.h"
#include "../../../bpf/lib/tc.h"
#include "../../../bpf/lib/types.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* 1: the per-CPU scratch space, zeroed (every program starts so). */
SEC("tc")
int stage_scratch(struct __sk_buff *skb)
{
	return flow_scratch() ? TC_ACT_OK : TC_ACT_SHOT;
}

/* The stages up to the parsed packet (1-2); NULL if it does not parse. */
static __always_inline struct flow_scratch *parsed(struct __sk_buff *skb)
{
	struct flow_scratch *sc = flow_scratch();

	if (!sc)
		return NULL;
	sc->res.len = skb->len;
	if (tc_parse(skb, ETH_HLEN, skb->protocol == bpf_htons(ETH_P_IPV6), &sc->pkt) != XVS_PARSE_OK)
		return NULL;
	sc->pkt.ifindex = skb->ingress_ifindex;
	return sc;
}

/* 2: + the parser (lib/parse.h through tc_parse). */
SEC("tc")
int stage_parse(struct __sk_buff *skb)
{
	return parsed(skb) ? TC_ACT_OK : TC_ACT_SHOT;
}

/* Stages 1-2 and the flow's conntrack key in *ck; false if the packet
 * does not parse. */
static __always_inline bool keyed(struct __sk_buff *skb, struct xvs_ct_key *ck)
{
	struct flow_scratch *sc = parsed(skb);

	if (!sc)
		return false;
	struct xvs_pkt *p = &sc->pkt;

	ct_key(ck, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family);
	return true;
}

/* 3: + the conntrack lookup alone: the flow's key, the table slot, the
 * entry (lib/ct.h). */
SEC("tc")
int stage_lookup(struct __sk_buff *skb)
{
	struct xvs_ct_key ck = {};

	return keyed(skb, &ck) && ct_get(XVS_CT_TABLE_ESTABLISHED, &ck) ? TC_ACT_OK : TC_ACT_SHOT;
}

/* 4: + the whole conntrack decision (flow_process on a hit: the clock,
 * the entry's state, expiry and batched counters, the rewrite it asks
 * for). */
static __always_inline struct flow_scratch *decided(struct __sk_buff *skb)
{
	struct flow_scratch *sc = parsed(skb);

	if (!sc || flow_process(skb, false, &sc->pkt, &sc->res) != XVS_ACT_NAT)
		return NULL;
	return sc;
}

SEC("tc")
int stage_decide(struct __sk_buff *skb)
{
	return decided(skb) ? TC_ACT_OK : TC_ACT_SHOT;
}

/* 5: + the packet's rewrite (addresses, ports, checksums through the
 * helpers). */
SEC("tc")
int stage_rewrite(struct __sk_buff *skb)
{
	struct flow_scratch *sc = decided(skb);

	if (!sc)
		return TC_ACT_SHOT;
	return tc_rewrite(skb, &sc->pkt, &sc->res.rw) ? TC_ACT_SHOT : TC_ACT_OK;
}

/* 6: + forwarding (tc_forward: the FIB lookup, the MTU check, the TTL and
 * MACs, the redirect), which also rewrites: xvs_tc_ingress without its
 * verdict counter and drop monitor. */
SEC("tc")
int stage_forward(struct __sk_buff *skb)
{
	struct flow_scratch *sc = decided(skb);

	if (!sc)
		return TC_ACT_SHOT;
	return tc_forward(skb, &sc->pkt, &sc->res.rw, &sc->res.verdict,
			  tc_how(skb, sc->res.nf_flags, TC_FWD_REWRITE));
}

/* Helpers alone, on the same packet, for the report's reading. */

/* The FIB lookup tc_forward makes, for the flow's backend. */
SEC("tc")
int helper_fib(struct __sk_buff *skb)
{
	struct bpf_fib_lookup fib = {
		.family = AF_INET,
		.l4_protocol = IPPROTO_TCP,
		.ifindex = skb->ingress_ifindex,
	};
	__u32 off = ETH_HLEN + offsetof(struct iphdr, saddr);

	if (bpf_skb_load_bytes(skb, off, &fib.ipv4_src, 4))
		return TC_ACT_SHOT;
	/* Service 0's first backend (10.0.0.1): every backend of the bench
	 * takes the same route (10.0.0.0/8). */
	fib.ipv4_dst = bpf_htonl(0x0a000001);
	return bpf_fib_lookup(skb, &fib, sizeof(fib), 0) == BPF_FIB_LKUP_RET_SUCCESS ? TC_ACT_OK
										     : TC_ACT_SHOT;
}

/* The conntrack lookup of stage_lookup with the established table named
 * directly instead of reached through its xvs_ct_tables slot: the
 * difference is what the slot costs. The parser included. */
SEC("tc")
int helper_ct_direct(struct __sk_buff *skb)
{
	struct xvs_ct_key ck = {};

	return keyed(skb, &ck) && bpf_map_lookup_elem(&xvs_conntrack, &ck) ? TC_ACT_OK : TC_ACT_SHOT;
}

/* The clock every tracked packet reads. */
SEC("tc")
int helper_clock(struct __sk_buff *skb)
{
	return bpf_ktime_get_ns() ? TC_ACT_OK : TC_ACT_SHOT;
}
