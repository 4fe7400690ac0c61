// Package stages holds the benchmark's stage programs (stages.c): the
// conntrack-hit path of xvs_tc_ingress cut after each of its stages, built
// from the datapath's own bpf/lib functions, for bin/bench stages.
package stages

//go:generate sh -c "cd ../../.. && go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -go-package stages -output-dir hack/bench/stages -output-stem stages -cflags \"-O2 -mcpu=v3 -g -Wall -Werror -Wno-unused-function -I/usr/include/x86_64-linux-gnu\" -no-global-types Stages hack/bench/stages/stages.c"
