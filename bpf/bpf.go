// Package bpf holds the xvs BPF programs and their bpf2go bindings. The C
// sources are the contract; the generated xvs_bpfel.go/.o are committed and
// `make generate` regenerates them (CI fails when that changes anything).
package bpf

//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -go-package bpf -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -type xvs_svc_key -type xvs_svc_value -type xvs_backend -type xvs_ct_key -type xvs_ct_entry -type xvs_stats -type xvs_verdict -type xvs_svc_flags -type xvs_kind -type xvs_sched -type xvs_ct_flags -type xvs_backend_flags -type xvs_scope -type xvs_sched_key -type xvs_affinity_key -type xvs_affinity_value -type xvs_member_key -type xvs_config_flags -type xvs_lpm_key -type xvs_vip_key -type xvs_sock_key -type xvs_sock_value -type xvs_conn_counts -type xvs_ct_state -type xvs_ct_slot -type xvs_if_addrs -type xvs_config -type xvs_port_range -type xvs_port_ranges -type xvs_frag6_key -type flow_scratch -type xvs_event -type xvs_hook -type xvs_monitor_settings -type xvs_monitor_bucket Xvs xvs.c
