/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map definitions. Every map is pinned by name under the loader's pin path
 * (/sys/fs/bpf/xvs/), so state outlives the agent and a new program picks it
 * up. Sizes here are defaults: the loader resizes them from its config. */
#ifndef XVS_MAPS_H
#define XVS_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct xvs_svc_key);
	__type(value, struct xvs_svc_value);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct xvs_backend);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_ct_key);
	__type(value, struct xvs_ct_entry);
	__uint(max_entries, 524288);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_conntrack SEC(".maps");

/* Flows no reply has been seen for yet (a SYN, a first datagram): both
 * their entries live here until the first reply moves them to
 * xvs_conntrack (ct_promote). A table of their own, so that a flood of
 * unreplied flows evicts its own kind and never an established flow. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_ct_key);
	__type(value, struct xvs_ct_entry);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_ct_unreplied SEC(".maps");

/* The tables the programs use, in the slots of enum xvs_ct_slot: the two
 * above (the loader puts them there) and, while the agent resizes them,
 * the old ones (see ct_get). The programs never name the tables
 * themselves, so that a resize swaps them under live traffic. Inner maps
 * of any size fit: a hash map's size is no part of its inner template. */
struct xvs_ct_table {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_ct_key);
	__type(value, struct xvs_ct_entry);
	__uint(max_entries, 1);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, XVS_CT_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct xvs_ct_table);
} xvs_ct_tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_frag_key);
	__type(value, struct xvs_frag_ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_fragments SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_frag6_key);
	__type(value, struct xvs_frag_ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_fragments6 SEC(".maps");

/* Scheduler tables (wrr sequences, Maglev tables) of u32 backend IDs, one
 * inner array per (frontend, scope). The agent builds a new inner map and
 * swaps it in with one update, so a packet never sees a half-built table. */
struct xvs_sched_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, struct xvs_sched_key);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct xvs_sched_table);
} xvs_sched_tables SEC(".maps");

/* Round-robin cursors, indexed by service ID * 2 + scope; shared by all
 * CPUs (atomic increments) so the order is global, as in IPVS. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 131072);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_rr_cursors SEC(".maps");

/* Least-connection schedulers: each backend's active and inactive
 * connections, by backend ID. The datapath counts a flow active when it
 * opens, moves it to inactive when it closes, and takes it back when a new
 * flow replaces its entry; entries that expire are counted by the agent in
 * xvs_backend_reaped (its only writer), and a backend has the difference. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_conn_counts);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_backend_held SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_conn_counts);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_backend_reaped SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_affinity_key);
	__type(value, struct xvs_affinity_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct xvs_member_key);
	__type(value, __u32);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_node_config SEC(".maps");

/* Masquerade address per egress interface (ifindex), written by the agent
 * from the node's addresses. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct xvs_if_addrs);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_if_snat SEC(".maps");

/* clusterCIDR: the local-traffic detector (id = family). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct xvs_lpm_key);
	__type(value, __u32);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_pod_cidrs SEC(".maps");

/* Service CIDRs: unallocated addresses in them are dropped (id = family). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct xvs_lpm_key);
	__type(value, __u32);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_service_cidrs SEC(".maps");

/* loadBalancerSourceRanges per LB frontend (id = service ID). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct xvs_lpm_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_source_ranges SEC(".maps");

/* Every ClusterIP, with its number of Service ports. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct xvs_vip_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_cluster_ips SEC(".maps");

/* Socket LB: (socket, frontend) -> backend, and (socket, backend) ->
 * frontend for recvmsg and getpeername. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_sock_key);
	__type(value, struct xvs_sock_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_sock_fwd SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct xvs_sock_key);
	__type(value, struct xvs_sock_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_sock_rev SEC(".maps");

/* Per service (frontend) ID and per backend ID. The first flush of an ID's
 * traffic creates its entry (stats_of) and the agent deletes it with the
 * ID, so the memory follows the IDs that carry traffic: a preallocated
 * per-CPU array of every possible ID cost 12.5 MiB per CPU at the default
 * sizes (1.6 GiB on a 128-CPU node). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);
	__type(value, struct xvs_stats);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_svc_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);
	__type(value, struct xvs_stats);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_backend_stats SEC(".maps");

/* Indexed by enum xvs_verdict: packets and bytes per verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_stats);
	__uint(max_entries, XVS_V_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_verdicts SEC(".maps");

/* Drop and reject events for `xvs monitor` (lib/monitor.h). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_monitor_settings);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_monitor_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct xvs_monitor_bucket);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xvs_monitor_state SEC(".maps");

#endif
