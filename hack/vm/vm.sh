#!/usr/bin/env bash
# hack/vm/vm.sh: run commands and the privileged test suites in a qemu VM on
# one of Debian's own kernels (software emulation; no KVM needed).
#
#   vm.sh deps                       install qemu and the guest userland's packages (apt)
#   vm.sh kernel KERNEL              fetch and unpack Debian's newest linux-image-KERNEL.* (cached)
#   vm.sh image KERNEL               build the guest initramfs for it (cached)
#   vm.sh run KERNEL [opts] -- CMD   boot, run CMD (sh -c) inside, exit with its status
#       --share DIR   mount DIR read-write at /host in the guest; CMD runs there (default: the repo)
#       --timeout S   kill the VM after S seconds (default 1500)
#       --mem MB      guest memory (default 2048)
#   vm.sh test KERNEL                build the privileged test binaries and run them in the VM
#
# KERNEL is a Debian kernel series: 6.1 (bookworm) or 6.12 (bookworm-security/backports).
# Everything downloaded or built lives under $XVS_VM_CACHE (default /var/cache/xvs/vm),
# never in the repository. The guest has no network device (-nic none): tests make their
# own network namespaces inside it. Output is the guest's serial console, streamed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${XVS_VM_CACHE:-/var/cache/xvs/vm}
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

# Host packages whose binaries (with their shared libraries) make the guest userland.
DEB_PKGS=(qemu-system-x86 xz-utils busybox-static ipvsadm ipset netbase kmod iproute2 iptables nftables conntrack util-linux cpio wireguard-tools)
# Binaries copied into the guest, with the libraries ldd lists for them.
GUEST_BINS=(/bin/bash /usr/bin/ip /usr/sbin/tc /usr/sbin/nft /usr/sbin/ipvsadm /usr/sbin/ipset /usr/sbin/conntrack
	/usr/bin/nsenter /usr/bin/unshare /usr/bin/kmod /usr/sbin/xtables-nft-multi /usr/bin/wg)
# Modules loaded at boot (with their dependencies). Missing ones are skipped:
# not every kernel has every IPVS scheduler.
GUEST_MODULES=(virtio_pci 9pnet_virtio 9p xfrm_user nfnetlink
	veth dummy tun vxlan geneve ipip wireguard 8021q bonding sch_ingress cls_bpf
	nf_conntrack nf_conntrack_netlink nf_nat nf_tables nft_chain_nat nft_ct nft_nat nft_masq
	nft_reject nft_reject_inet nft_compat nft_fib_inet nf_reject_ipv4 nf_reject_ipv6
	x_tables ip_tables ip6_tables iptable_filter iptable_nat xt_conntrack xt_MASQUERADE xt_mark
	xt_comment xt_addrtype xt_nat xt_tcpudp
	ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr ip_vs_dh ip_vs_sh
	ip_vs_sed ip_vs_nq ip_vs_mh ip_vs_fo ip_vs_ovf ip_vs_twos)
# Modules copied (with their dependencies) but not loaded: the kernel loads
# them on demand (an SCTP socket), and tests can check it did not.
GUEST_ON_DEMAND_MODULES=(sctp)
# Module directories copied whole, so the kernel can autoload what a rule or
# qdisc asks for (nft expressions, xtables matches, classifiers).
GUEST_MODULE_DIRS=(net/netfilter net/ipv4/netfilter net/ipv6/netfilter net/sched net/bridge)
# Packages whose privileged tests run in the VM; ./pkg=REGEX narrows one of
# them to REGEX's tests (go test -run) instead of VM_RUN's.
VM_SUITES=${VM_SUITES:-./reconcile ./cmd/xvs ./ipvs}
# The tests run of each suite (go test -run).
VM_RUN=${VM_RUN:-^TestPriv}
# Tests skipped in the VM (go test -skip): TestPrivKube* run the agent
# against the real kube-apiserver, a host-built binary the guest lacks, and
# exercise the control plane rather than the kernel; TestPrivConformance*
# check the conformance runner itself (its reports, malformed files, a
# killed runner's cleanup), which the host runs, while the VMs run the
# whole corpus through it (make conformance-vm-*).
VM_SKIP=${VM_SKIP:-^TestPriv(Kube|Conformance)}
# Each suite's go test -timeout. Under TCG the agent suite (./cmd/xvs) on 6.1
# takes about 22 minutes of test time (2026-12-06: its real-traffic and fabric tests move
# tens of MiB each way in both netfilter modes); 20m cut it off in CI.
VM_TEST_TIMEOUT=${VM_TEST_TIMEOUT:-35m}

log() { echo "vm: $*" >&2; }
die() { echo "vm: $*" >&2; exit 1; }

cmd_deps() {
	local missing=()
	for p in "${DEB_PKGS[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# kernel_pkg KERNEL: the newest signed amd64 image package of that series in the apt sources.
kernel_pkg() {
	local re="^linux-image-${1//./\\.}\\.[0-9].*-amd64\$" pkg
	pkg=$(apt-cache search --names-only "$re" | awk '{print $1}' |
		grep -Ev -- '-(cloud|rt)-amd64$|dbg|unsigned' | sort -V | tail -1)
	if [ -z "$pkg" ]; then
		apt-get update -qq
		pkg=$(apt-cache search --names-only "$re" | awk '{print $1}' |
			grep -Ev -- '-(cloud|rt)-amd64$|dbg|unsigned' | sort -V | tail -1)
	fi
	[ -n "$pkg" ] || die "no linux-image-$1.* package in the apt sources (6.1: bookworm; 6.12: bookworm-security or bookworm-backports)"
	echo "$pkg"
}

# cmd_kernel KERNEL: prints the unpacked kernel directory.
cmd_kernel() {
	local pkg dir
	pkg=$(kernel_pkg "$1")
	dir="$CACHE/kernels/$pkg"
	if [ ! -e "$dir/.done" ]; then
		log "downloading $pkg"
		rm -rf "$dir" && mkdir -p "$dir/deb"
		(cd "$dir/deb" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
		ls "$dir"/deb/*.deb >/dev/null 2>&1 || die "apt-get download $pkg failed"
		dpkg-deb -x "$dir"/deb/*.deb "$dir/root"
		rm -rf "$dir/deb"
		touch "$dir/.done"
	fi
	echo "$dir"
}

# copy_with_libs ROOT FILE...: FILE and the shared libraries it needs, at the same paths.
copy_with_libs() {
	local root=$1 f l
	shift
	for f in "$@"; do
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
		for l in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*'); do
			[ -e "$root$l" ] && continue
			mkdir -p "$root$(dirname "$l")"
			cp -L "$l" "$root$l"
		done
	done
}

# cmd_image KERNEL: prints the initramfs path.
cmd_image() {
	local kdir kver key img root m
	kdir=$(cmd_kernel "$1")
	kver=$(ls "$kdir/root/lib/modules")
	key=$(cat "$HERE/vm.sh" "$HERE/init" | sha256sum | cut -c1-12)
	img="$CACHE/images/$(basename "$kdir")-$key.cpio.gz"
	if [ -e "$img" ]; then
		echo "$img"
		return
	fi
	cmd_deps
	log "building $img"
	mkdir -p "$CACHE/images"
	root=$(mktemp -d "$CACHE/images/root.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$root'" RETURN
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,host,etc,var/run,lib/modules}
	cp /bin/busybox "$root/bin/busybox"
	for a in $("$root/bin/busybox" --list); do
		[ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
	done
	copy_with_libs "$root" "${GUEST_BINS[@]}"
	for f in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_with_libs "$root" "$f"; done
	for a in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
		ln -sf xtables-nft-multi "$root/usr/sbin/$a"
	done
	for a in modprobe lsmod insmod rmmod depmod modinfo; do ln -sf /usr/bin/kmod "$root/usr/sbin/$a"; done
	ln -sf /usr/bin/kmod "$root/sbin/modprobe" # the kernel's request_module runs /sbin/modprobe
	# Kernel modules: the dependency closure of GUEST_MODULES, then a fresh depmod.
	[ -e "$kdir/root/lib/modules/$kver/modules.dep" ] || depmod -b "$kdir/root" "$kver"
	: >"$root/etc/modules"
	for m in "${GUEST_MODULES[@]}" "${GUEST_ON_DEMAND_MODULES[@]}"; do
		local deps
		deps=$(modprobe -d "$kdir/root" -S "$kver" --show-depends "$m" 2>/dev/null) || continue
		case " ${GUEST_ON_DEMAND_MODULES[*]} " in
		*" $m "*) ;;
		*) echo "$m" >>"$root/etc/modules" ;;
		esac
		for f in $(echo "$deps" | awk '$1 == "insmod" {print $2}'); do
			f=${f#"$kdir/root"}
			mkdir -p "$root$(dirname "$f")"
			cp -n "$kdir/root$f" "$root$f"
		done
	done
	for m in "${GUEST_MODULE_DIRS[@]}"; do
		[ -d "$kdir/root/lib/modules/$kver/kernel/$m" ] || continue
		mkdir -p "$root/lib/modules/$kver/kernel/$m"
		cp -rn "$kdir/root/lib/modules/$kver/kernel/$m/." "$root/lib/modules/$kver/kernel/$m/"
	done
	# Newer Debian kernels compress modules; plain ones load without kmod's
	# decompression fallback (and its "Invalid ELF header" noise).
	find "$root/lib/modules" -name '*.ko.xz' -exec xz -d {} +
	find "$root/lib/modules" -name '*.ko.zst' -exec zstd -q -d --rm {} +
	cp "$kdir/root/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
	sed -i 's/\.ko\.\(xz\|zst\)$/.ko/' "$root/lib/modules/$kver/modules.order"
	depmod -b "$root" "$kver"
	cp "$HERE/init" "$root/init"
	chmod +x "$root/init"
	echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
	echo "root:x:0:" >"$root/etc/group"
	printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
	# Protocol names (getprotobyname): ipset's "udp:53" entries, kube-proxy's.
	cp /etc/protocols "$root/etc/protocols"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$img.tmp"
	mv "$img.tmp" "$img"
	# Images of this kernel from older versions of the rig, unused for a day.
	find "$CACHE/images" -name "$(basename "$kdir")-*.cpio.gz" ! -path "$img" -mmin +1440 -delete
	echo "$img"
}

QEMU_PID=
CTL=
stop_vm() {
	if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
		kill "$QEMU_PID" 2>/dev/null || true
		sleep 1
		kill -9 "$QEMU_PID" 2>/dev/null || true
	fi
	QEMU_PID=
	[ -n "$CTL" ] && rm -rf "$CTL"
	CTL=
	# The test binaries of cmd_test, whose RETURN trap an exit from a
	# failed boot (die) skips.
	[ -n "${VM_FILES:-}" ] && rm -rf "$VM_FILES"
	return 0
}

# cmd_run KERNEL [--share DIR] [--timeout S] [--mem MB] -- CMD...
# A guest whose kernel crashed (it powered off without reporting a status:
# a panic, an oops, or a soft lockup, which softlockup_panic turns into a
# panic within a minute) is booted once more and runs CMD again: under
# multi-threaded TCG the guest kernel has crashed on its own now and then
# (docs/vm.md), and that says nothing of the tests. CMD failing is never
# retried, nor is a timeout.
cmd_run() {
	local kernel=$1 share=$REPO timeout=1500 mem=2048
	shift
	while [ $# -gt 0 ]; do
		case $1 in
		--share) share=$(cd "$2" && pwd); shift 2 ;;
		--timeout) timeout=$2; shift 2 ;;
		--mem) mem=$2; shift 2 ;;
		--) shift; break ;;
		*) die "run: unknown option $1" ;;
		esac
	done
	[ $# -gt 0 ] || die "run: no command"
	local kdir img kver rc attempt
	kdir=$(cmd_kernel "$kernel")
	img=$(cmd_image "$kernel")
	kver=$(ls "$kdir/root/lib/modules")
	trap stop_vm EXIT INT TERM
	for attempt in 1 2; do
		rc=0
		boot_once "$kdir" "$img" "$kver" "$share" "$timeout" "$mem" "$@" || rc=$?
		[ "$rc" -ne 200 ] && break
		if [ "$attempt" -eq 1 ]; then
			log "the guest kernel crashed (its console above says how): booting it once more to run the command again"
		else
			log "the guest kernel crashed twice"
			rc=1
		fi
	done
	stop_vm
	return "$rc"
}

# boot_once KDIR IMG KVER SHARE TIMEOUT MEM CMD...: one boot; returns CMD's
# status, 124 on timeout, 200 when the guest crashed.
boot_once() {
	local kdir=$1 img=$2 kver=$3 share=$4 timeout=$5 mem=$6
	shift 6
	CTL=$(mktemp -d /tmp/xvs-vm.XXXXXX)
	printf '%s\n' "$*" >"$CTL/cmd"
	[ -n "${VM_FILES:-}" ] && cp -r "$VM_FILES"/. "$CTL/"
	log "booting $kver ($(basename "$img")), sharing $share at /host"
	local start=$SECONDS
	qemu-system-x86_64 -machine q35 -cpu max -accel tcg,thread=multi -smp 2 -m "$mem" \
		-kernel "$kdir/root/boot/vmlinuz-$kver" -initrd "$img" \
		-append "console=ttyS0 panic=-1 oops=panic softlockup_panic=1 loglevel=5 xvs.kver=$kver" \
		-display none -monitor none -serial stdio -no-reboot -nic none \
		-virtfs "local,path=$CTL,mount_tag=ctl,security_model=none,multidevs=remap" \
		-virtfs "local,path=$share,mount_tag=host,security_model=none,multidevs=remap" \
		</dev/null &
	QEMU_PID=$!
	local waited=0
	while kill -0 "$QEMU_PID" 2>/dev/null; do
		sleep 1
		waited=$((waited + 1))
		if [ "$waited" -ge "$timeout" ]; then
			log "timeout after ${timeout}s: stopping the VM"
			kill "$QEMU_PID" 2>/dev/null || true
			sleep 1
			kill -9 "$QEMU_PID" 2>/dev/null || true
			QEMU_PID=
			rm -rf "$CTL"
			CTL=
			return 124
		fi
	done
	wait "$QEMU_PID" || true
	QEMU_PID=
	log "VM ran $((SECONDS - start))s"
	local rc=200
	if [ -e "$CTL/rc" ]; then
		rc=$(cat "$CTL/rc")
	else
		log "the guest ended without reporting a status (crash?)"
	fi
	rm -rf "$CTL"
	CTL=
	return "$rc"
}

# cmd_test KERNEL [-- CMD]: the privileged suites (TestPriv*) of VM_SUITES,
# in the VM; CMD (run from /host whatever the suites did) follows them in the
# same boot, which saves a boot and the guest's setup (make test runs the
# conformance corpus this way).
cmd_test() {
	local kernel=$1 files suite pkg run name script src then="" timeout=2400
	shift
	if [ $# -gt 0 ]; then
		[ "$1" = "--" ] && [ $# -ge 2 ] || die "usage: vm.sh test KERNEL [-- CMD]"
		shift
		then="$*"
		timeout=3600
	fi
	cmd_deps
	files=$(mktemp -d /tmp/xvs-vmtest.XXXXXX)
	# shellcheck disable=SC2064
	trap "rm -rf '$files'" RETURN
	(cd "$REPO" && CGO_ENABLED=0 go build -o "$files/pinhooks" ./hack/vm/pinhooks)
	script="set -u; fail=0; /run/xvs-vm/pinhooks || echo 'vm: cannot pin the cgroup socket hooks'"
	# The real kube-apiserver and kube-proxy v1.37 (make apiserver, make
	# kube-proxy), for the migration off kube-proxy's own IPVS mode, which
	# only a guest has: linked (or copied) next to the test binaries.
	local bin
	for bin in "apiserver:XVS_APISERVER_BIN:/var/cache/xvs/apiserver/*/apiserver" \
		"kube-proxy:XVS_KUBE_PROXY_BIN:/var/cache/xvs/kube-proxy/v1.37.*/kube-proxy"; do
		# shellcheck disable=SC2086
		src=$(ls -t ${bin##*:} 2>/dev/null | head -1) || true # not built: ls fails (pipefail)
		[ -n "$src" ] || continue
		name=${bin%%:*}
		ln -f "$src" "$files/$name" 2>/dev/null || cp "$src" "$files/$name"
		bin=${bin#*:}
		script+="; export ${bin%%:*}=/run/xvs-vm/$name"
	done
	for suite in $VM_SUITES; do
		# ./pkg=REGEX runs REGEX's tests of that suite instead of VM_RUN's.
		pkg=${suite%%=*} run=$VM_RUN
		[ "$suite" != "$pkg" ] && run=${suite#*=}
		name=$(echo "${pkg#./}" | tr / _)
		log "go test -c $pkg"
		(cd "$REPO" && CGO_ENABLED=0 go test -c -vet=off -o "$files/$name.test" "$pkg")
		script+="; echo '=== suite $pkg'; cd /host/${pkg#./} && /run/xvs-vm/$name.test -test.run '$run' -test.skip '$VM_SKIP' -test.v -test.count=1 -test.timeout=$VM_TEST_TIMEOUT || { echo '=== suite $pkg FAILED'; fail=1; }"
	done
	if [ -n "$then" ]; then
		script+="; echo '=== then (the command after the suites)'; cd /host && { $then; } || { echo '=== then FAILED'; fail=1; }"
	fi
	script+="; exit \$fail"
	VM_FILES=$files cmd_run "$kernel" --share "$REPO" --timeout "$timeout" -- "$script"
}

[ $# -ge 1 ] || die "usage: vm.sh deps | kernel K | image K | run K [opts] -- CMD | test K [-- CMD]"
sub=$1
shift
case $sub in
deps) cmd_deps ;;
kernel) [ $# -eq 1 ] || die "usage: vm.sh kernel KERNEL"; cmd_kernel "$1" ;;
image) [ $# -eq 1 ] || die "usage: vm.sh image KERNEL"; cmd_image "$1" ;;
run) [ $# -ge 1 ] || die "usage: vm.sh run KERNEL -- CMD"; cmd_run "$@" ;;
test) [ $# -ge 1 ] || die "usage: vm.sh test KERNEL [-- CMD]"; cmd_test "$@" ;;
*) die "unknown command $sub" ;;
esac
