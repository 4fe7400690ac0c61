# xvs: eXpress Virtual Server. `make help` lists the targets.
GO      ?= go
BIN     ?= bin/xvs
export PATH := $(PATH):/usr/local/go/bin

.PHONY: bench-bulk bench-resize bench-stages dashboard fuzz fuzz-packets image image-packages e2e e2e-conformance conformance-bypass help deps generate generate-check build build-node lint apiserver kube-proxy test test-unit vmtest vmtest-corpus verifier-stats demo bench bench-peers clean conformance conformance-report conformance-vm conformance-vm-ebpf conformance-vm-ipvs

help:
	@echo "make demo    build and run the self-contained demo (root)"
	@echo "make test    every check and test, as CI runs them (root)"
	@echo "make bench   per-packet benchmark; rewrites docs/BENCHMARKS.md, then make bench-peers (root)"
	@echo "make bench-stages   where a conntrack hit's time goes, stage by stage; rewrites docs/BENCHMARKS-stages.md (root)"
	@echo "make bench-peers   xvs beside the real kube-proxy (nftables, iptables); rewrites docs/BENCHMARKS-peers.md (root; XVS_PEERS_WINDOW=30s)"
	@echo "make bench-bulk    bulk TCP Gbit/s beside the real kube-proxy at one Service; rewrites docs/BENCHMARKS-bulk.md (root)"
	@echo "make kube-proxy   build the real kube-proxy v1.37 once (cached under /var/cache/xvs)"
	@echo "make vmtest KERNEL=6.1|6.12   privileged suites in a qemu VM on a Debian kernel (root)"
	@echo "make verifier-stats [KERNEL=6.1 VM=1]   what the verifier spends on each program (root)"
	@echo "make conformance CORPUS=dir MODE=ebpf|ipvs   run conformance scenarios (root); make conformance-report"
	@echo "make conformance-bypass                        the traffic scenarios again with --netfilter-mode=bypass"
	@echo "make apiserver   build the tests' kube-apiserver once (cached under /var/cache/xvs)"
	@echo "make image   the xvs OCI image as a docker-save tarball, bin/xvs-image.tar (no Docker engine)"
	@echo "make fuzz    the fuzz targets, FUZZTIME each (default 1m)"
	@echo "make fuzz-packets   PACKETS (default 10^6) random and mutated packets through the tc and XDP programs, each outcome checked (root)"
	@echo "make dashboard   the Grafana dashboard (deploy/monitoring) over a live run, into docs/dashboard.png; checks its alerts fire (root)"
	@echo "make e2e     one-node Kubernetes cluster in namespaces, xvs as its proxy, upstream e2e Services specs (root; docs/E2E.md)"
	@echo "make build | build-node | generate | generate-check | lint | deps | clean"

deps:
	./hack/install-deps.sh

# bpf2go is pinned in go.mod's tool block; the generated objects are
# committed, and generate-check fails when regenerating changes them.
generate:
	$(GO) generate ./bpf/
	$(GO) -C hack/bench generate ./stages

generate-check: generate
	@git diff --exit-code -- bpf/ hack/bench/stages/ || { echo "bpf/, hack/bench/stages/: generated files are stale: run 'make generate' and commit"; exit 1; }

# Version stamps (version/version.go): xvs --version, the startup log line
# and the xvs_build_info metric.
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
VERSION_PKG := github.com/xvs-lb/xvs/version
# component-base's version (kubernetes_build_info, as kube-proxy exports it)
# says xvs's too. It must read vX.Y.Z...: component-base's metrics registry
# parses it at start (and panics on anything else), so a describe without a
# tag (a bare commit) becomes v0.0.0-<commit>.
K8S_VERSION_PKG := k8s.io/component-base/version
K8S_GIT_VERSION := $(shell echo '$(VERSION)' | grep -qE '^v[0-9]+\.[0-9]+\.[0-9]+' && echo '$(VERSION)' || echo 'v0.0.0-$(VERSION)')
LDFLAGS    := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).gitCommit=$(GIT_COMMIT) -X $(VERSION_PKG).buildDate=$(BUILD_DATE) \
	-X $(K8S_VERSION_PKG).gitVersion=$(K8S_GIT_VERSION) -X $(K8S_VERSION_PKG).gitCommit=$(GIT_COMMIT) -X $(K8S_VERSION_PKG).buildDate=$(BUILD_DATE)

# bin/xvs is the developer build: the product's subcommands and the
# harness's (demo, lab, conformance; -tags lab). bin/node/xvs is the
# DaemonSet's binary, the Dockerfile's: agent, list and cleanup only,
# linking neither lab nor conformance.
NODE_BIN ?= bin/node/xvs
# Each build runs its binary once: a link-time stamp a package parses at
# init (component-base's version) must not make it panic at start.
build:
	CGO_ENABLED=0 $(GO) build -tags lab -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/xvs
	./$(BIN) --version >/dev/null

build-node:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(NODE_BIN) ./cmd/xvs
	./$(NODE_BIN) --version >/dev/null
	@if ./$(NODE_BIN) agent --debug-fail-bpf-load --help >/dev/null 2>&1; then \
		echo "$(NODE_BIN) has the fault-injection switches (config.EnableDebugSwitches outside -tags lab)"; exit 1; fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags lab ./cmd/xvs
	$(GO) -C hack/bench vet ./...
	$(GO) -C hack/monitoring vet ./...
	clang-format-14 --dry-run --Werror bpf/*.c bpf/lib/*.h hack/bench/stages/*.c

# Privileged tests (TestPriv*) need root: they fail, never skip, without it.
# TestPrivIPVS* need kernel IPVS, and TestPrivIPIP* the ipip module, which
# this host may lack: they run in the VMs, with the other privileged suites
# on each kernel (docs/vm.md).
# The conformance corpus runs in ebpf mode on the host; its SCTP scenario
# needs the sctp module, which this host's kernel lacks (conformance-vm
# runs it, with ipvs mode, in the VM).
# go test's own limit is 10 minutes per package; cmd/xvs's privileged
# suites (real agents, API servers, traffic) take about that on a 2-core
# machine beside the other packages, so it is raised; hack/bench's (the
# peer comparison's tiny run with its bulk streams, the stage and resize
# tests) took 452 s in a fresh-clone run, too close to it.
test: deps generate-check lint apiserver kube-proxy
	@mkdir -p bin
	$(GO) -C hack/bench test -count=1 -timeout 20m ./... > bin/bench-tests.log 2>&1 & bench=$$!; \
	$(GO) -C hack/monitoring test -count=1 ./... > bin/monitoring-tests.log 2>&1 & mon=$$!; \
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME) FUZZFLAGS=-parallel=1 > bin/fuzz.log 2>&1 & fuzz=$$!; \
	$(GO) test -count=1 -timeout 30m -skip '^TestPriv(IPVS|IPIP|WireGuard|VLAN|Bond|Geneve)' ./...; rc=$$?; \
	wait $$bench; brc=$$?; echo "go test ./... (hack/bench, its own module):"; cat bin/bench-tests.log; \
	wait $$mon; mrc=$$?; echo "go test ./... (hack/monitoring, its own module):"; cat bin/monitoring-tests.log; \
	wait $$fuzz; frc=$$?; echo "make fuzz FUZZTIME=$(TEST_FUZZTIME):"; grep -v '^fuzz: elapsed' bin/fuzz.log; \
	[ $$rc -eq 0 ] && [ $$brc -eq 0 ] && [ $$mrc -eq 0 ] && [ $$frc -eq 0 ]
	$(MAKE) conformance MODE=ebpf CONFORMANCE_FLAGS="$(HOST_CONFORMANCE_SKIP)"
	$(MAKE) conformance-bypass
	./hack/vm/vm.sh deps
	./hack/vm/vm.sh image 6.1 >/dev/null
	./hack/vm/vm.sh image 6.12 >/dev/null
	@echo "vm lanes: 6.1 (ebpf) here, 6.12 (ipvs) beside it into bin/vmtest-6.12.log"
	$(call vm_corpus,6.12,ipvs,$(VM_SUITES_6_12),) > bin/vmtest-6.12.log 2>&1 & lane=$$!; \
	start=$$(date +%s); \
	$(call vm_corpus,6.1,ebpf,$(VM_SUITES_6_1),$(VM_SKIP_6_1)); rc=$$?; \
	echo "6.1 lane: rc=$$rc after $$(( $$(date +%s) - start ))s; waiting for the 6.12 lane"; \
	wait $$lane; rc12=$$?; \
	echo "=== the 6.12 lane (rc=$$rc12, both lanes done after $$(( $$(date +%s) - start ))s):"; cat bin/vmtest-6.12.log; \
	[ $$rc -eq 0 ] && [ $$rc12 -eq 0 ]

# What the kernel's verifier spends on each program (bpf/README.md).
verifier-stats:
ifeq ($(VM),)
	$(GO) run ./hack/verifstats $(VERIFSTATS_FLAGS)
else
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -o bin/verifstats ./hack/verifstats
	./hack/vm/vm.sh run $(KERNEL) -- './bin/verifstats $(VERIFSTATS_FLAGS)'
endif

KERNEL ?= 6.12
vmtest:
	./hack/vm/vm.sh test $(KERNEL)

# vmtest, then the whole corpus in MODE, in one boot of the VM (make test:
# 6.1 with ebpf, 6.12 with ipvs); results in bin/conformance-MODE-vmKERNEL.json.
# VM_SUITES (vm.sh's) chooses the suites.
vmtest-corpus: build
	$(call vm_corpus,$(KERNEL),$(MODE),$(VM_SUITES),$(VM_SKIP))

# vm_corpus KERNEL,MODE,SUITES,SKIP: vm.sh test's command for one lane (an
# empty SUITES or SKIP keeps vm.sh's default).
vm_corpus = $(if $(3),VM_SUITES='$(3)') $(if $(4),VM_SKIP='$(4)') ./hack/vm/vm.sh test $(1) -- './$(BIN) conformance run $(CORPUS) --mode $(2) --json bin/conformance-$(2)-vm$(1).json'

# What make test runs on 6.1 (legacy tc, the oldest verifier, the oldest
# networking xvs supports): the privileged tests whose outcome a kernel
# can change, the datapath's traffic in both netfilter modes over every
# kind of device and fabric. Left to the host (6.18): what only the
# agent's Go code and the CLIs decide (listings, rates, flushes, metrics,
# the pin-path lock, adoption of kube-proxy's connections) and the
# half-close streams, which wait out conntrack timers the same on every
# kernel; left to 6.12: everything IPVS. Together they took 11 of the
# 6.1 stage's 48 minutes (2026-12-06). vm.sh's default VM_SKIP (the
# tests that need the host's API server or the corpus) is kept.
VM_SUITES_6_1 = ./reconcile ./cmd/xvs
VM_SKIP_6_1 = ^TestPriv(Kube|Conformance|IPVS|MigrationFromIPTables|RealTrafficHalfClose|ListRate|ListConnections|ConntrackFlush|ServiceMetrics|OneAgentPerPinPath)

# What make test runs on 6.12: everything IPVS (the fallback mode's only
# kernel with IPVS in CI), every program's load and the pinned-map
# migrations (the verifier and map types of that kernel), and the map
# store's suite. The ebpf mode's traffic suites run on 6.1 (legacy tc, the
# oldest verifier) and on the host (6.18, TCX like 6.12) instead: on 6.12
# they took 7 of make test's 60 minutes and duplicated the host's run.
# The XDP program's tests run here too: a host kernel may refuse the
# program (loader.ErrXDPUnsupported), and they skip there.
VM_SUITES_6_12 = ./reconcile ./loader ./ipvs ./cmd/xvs=^TestPrivIPVS ./bpf=^TestPriv(XDPSameDecision|MonitorEvents)$$

# The real kube-apiserver + etcd of the integration tests (test/apiserver,
# its own Go module), built once into a cache outside the repository
# (lab/kubeapi): a cold build takes ~10 min, longer than go test's timeout.
apiserver:
	$(GO) run ./lab/kubeapi/cmd/apiserver-build

test-unit:
	$(GO) test -count=1 -run 'Test[^P]' ./...
	$(GO) -C hack/bench test -count=1 -run 'Test[^P]' ./...
	$(GO) -C hack/monitoring test -count=1 -run 'Test[^P]' ./...

# The fuzz targets, each for FUZZTIME (go test runs their seeds with the
# other tests): the Tracker against Translate over random event orders, the
# file source's decoder, the configuration decoder.
FUZZTIME ?= 1m
# make test fuzzes each target this long, beyond the seeds, so that new
# code meets some random input in CI too: one worker, beside go test.
TEST_FUZZTIME ?= 15s
# The packet fuzzer (bpf/fuzz_packet_test.go): PACKETS random and mutated
# packets through the tc and XDP programs, every outcome checked; go test
# runs 20,000 of them; docs/PACKET-FUZZ.md has the runs of 10^6.
PACKETS ?= 1000000
fuzz-packets:
	XVS_PACKET_FUZZ=$(PACKETS) $(GO) test -count=1 -run '^TestPrivPacketFuzz$$' -v ./bpf

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzTrackerMatchesTranslate$$' -fuzztime $(FUZZTIME) $(FUZZFLAGS) ./controller
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeManifests$$' -fuzztime $(FUZZTIME) $(FUZZFLAGS) ./controller
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) $(FUZZFLAGS) ./config

# The Grafana dashboard of deploy/monitoring over a live run (an agent, real
# traffic, a Service that loses its endpoints), rendered from Prometheus's
# own queries into docs/dashboard.png; the same run checks that the alerts
# fire (hack/monitoring). Root.
dashboard:
	$(GO) -C hack/monitoring test -count=1 -run '^TestPrivDashboardLive$$' -v . -args -dashboard-png $(CURDIR)/docs/dashboard.png

# Any directory of conformance scenarios (conformance/FORMAT.md) against one
# datapath mode, with real traffic in namespaces (root). Results go to
# bin/conformance-$(MODE).json; conformance-report renders docs/CONFORMANCE.md
# from every bin/conformance-*.json present (one column per mode).
CORPUS ?= conformance/corpus
MODE   ?= ebpf
CONFORMANCE_FLAGS ?=
HOST_CONFORMANCE_SKIP = $(if $(wildcard /sys/module/sctp),,--skip '^sctp-')
conformance: build
	./$(BIN) conformance run $(CORPUS) --mode $(MODE) --json bin/conformance-$(MODE).json $(CONFORMANCE_FLAGS)

# The scenarios of real traffic shapes and of the paths through the node
# again in ebpf mode with --netfilter-mode=bypass, where the program, not
# the kernel's forwarding, carries translated packets on (and must answer
# and translate ICMP errors itself: in pass mode the kernel's forwarding
# covers some of that). Results in bin/conformance-ebpf-bypass.json.
BYPASS_SCENARIOS ?= ^(bulk|pmtu|icmp|halfclose|proto-udp|udp-|nodeport-|etp-local-external|externalip-basic|lb-source-ranges-basic|masquerade|clusterip-hairpin|ipv6-)
conformance-bypass: build
	./$(BIN) conformance run $(CORPUS) --mode ebpf --netfilter-mode bypass --run '$(BYPASS_SCENARIOS)' --json bin/conformance-ebpf-bypass.json $(CONFORMANCE_FLAGS)

# Both modes inside the qemu VM (ipvs mode needs kernel IPVS, which the host
# may lack). Software emulation: about 8 min per mode for our corpus.
conformance-vm: build
	./hack/vm/vm.sh run $(KERNEL) -- './$(BIN) conformance run $(CORPUS) --mode ebpf --json bin/conformance-ebpf-vm$(KERNEL).json; e=$$?; \
		./$(BIN) conformance run $(CORPUS) --mode ipvs --json bin/conformance-ipvs-vm$(KERNEL).json && exit $$e'

# The whole corpus in ebpf mode inside the VM (6.1: legacy tc, and an
# sctp module, so the SCTP scenario runs too); about 7 min.
conformance-vm-ebpf: build
	./hack/vm/vm.sh run $(KERNEL) --timeout 2400 -- './$(BIN) conformance run $(CORPUS) --mode ebpf --json bin/conformance-ebpf-vm$(KERNEL).json'

# The whole corpus in ipvs mode inside the VM (6.12: kernel IPVS, nftables,
# the sctp module); about 7 min.
conformance-vm-ipvs: build
	./hack/vm/vm.sh run $(KERNEL) --timeout 1500 -- './$(BIN) conformance run $(CORPUS) --mode ipvs --json bin/conformance-ipvs-vm$(KERNEL).json'

conformance-report: build
	./$(BIN) conformance report -semantics docs/semantics.md -o docs/CONFORMANCE.md $(wildcard bin/conformance-*.json)

demo: deps build
	./$(BIN) demo

bench: deps apiserver kube-proxy
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench -out docs/BENCHMARKS.md
	./bin/bench monitor -out docs/BENCHMARKS-monitor.md
	./bin/bench resize -out docs/BENCHMARKS-resize.md
	./bin/bench stages -out docs/BENCHMARKS-stages.md
	$(MAKE) bench-peers

# The conntrack resize alone (docs/BENCHMARKS-resize.md): the copy of 1M
# entries into a table twice as large, under a loaded datapath.
bench-resize: deps
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench resize -out docs/BENCHMARKS-resize.md

# Where a conntrack hit's time goes (docs/BENCHMARKS-stages.md): the tc
# program cut after each stage (hack/bench/stages), cold and warm.
bench-stages: deps
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench stages -out docs/BENCHMARKS-stages.md

# The real kube-proxy (test/kubeproxy: upstream cmd/kube-proxy of the
# k8s.io/kubernetes module, its own Go module), built once into
# /var/cache/xvs/kube-proxy (about 3 min cold); hack/bench's peer comparison
# runs it.
kube-proxy:
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench -build-kube-proxy

# Bulk TCP alone beside the real kube-proxy (docs/BENCHMARKS-bulk.md): the
# peer comparison at one Service with short connection windows; its bulk
# runs (1 and 8 streams, each direction; a ClusterIP unmasqueraded, a
# NodePort masqueraded) are what it is for (about 12 min).
bench-bulk: deps apiserver kube-proxy
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench peers -sizes 1 -window 10s -out docs/BENCHMARKS-bulk.md $(PEERS_FLAGS)

# xvs beside the real kube-proxy in nftables and iptables mode and the
# no-proxy floor, one API server, masqueraded and not, interleaved by round
# (about 25 min). XVS_PEERS_WINDOW sets the masqueraded windows (default
# 30s); PEERS_FLAGS adds flags (bin/bench peers -h).
PEERS_FLAGS ?=
bench-peers: deps apiserver kube-proxy
	$(GO) -C hack/bench build -o $(CURDIR)/bin/bench .
	./bin/bench peers -out docs/BENCHMARKS-peers.md $(PEERS_FLAGS)

clean:
	rm -rf bin

# The Dockerfile's image without a Docker engine: the static binary on a
# Debian bookworm root filesystem unpacked by mmdebstrap (chrootless, cached
# under /var/cache/xvs/rootfs), written as a docker-save tarball by
# hack/image (load it with `ctr images import`, `docker load`, `podman load`).
IMAGE          ?= ghcr.io/xvs-lb/xvs:$(VERSION)
IMAGE_TAR      ?= bin/xvs-image.tar
IMAGE_PACKAGES  = bash coreutils bpftool iproute2 ipvsadm kmod nftables
image: build-node
	$(GO) run ./hack/image -o $(IMAGE_TAR) -tag $(IMAGE) -add $(NODE_BIN)=/usr/local/bin/xvs \
		-rootfs "$$(hack/e2e/rootfs.sh xvs $(IMAGE_PACKAGES))" -entrypoint /usr/local/bin/xvs
	@echo "$(IMAGE_TAR): $(IMAGE)"

image-packages:
	@echo $(IMAGE_PACKAGES)

# A one-node cluster (kube-apiserver+etcd, controller-manager, scheduler,
# kubelet, containerd+runc, CNI bridge, CoreDNS; no kube-proxy) in its own
# namespaces with xvs from hack/e2e/overlay, then upstream e2e.test
# v1.37.2: the [sig-network] Services specs (hack/e2e/skips.sh). Root.
# Builds its components once into /var/cache/xvs/e2e (~13 min cold).
# JUnit and logs in bin/e2e; docs/E2E.md is rendered from them.
E2E_ARGS ?=
e2e:
	./hack/e2e/e2e.sh $(E2E_ARGS); rc=$$?; python3 hack/e2e/report.py bin/e2e docs/E2E.md; exit $$rc

# The 15 [Conformance] Services specs only.
e2e-conformance:
	./hack/e2e/e2e.sh --ginkgo.focus='\[sig-network\] Services .*\[Conformance\]' --ginkgo.skip="$$(hack/e2e/skips.sh)"
