#!/usr/bin/env bash
# Installs what building and testing xvs needs on a fresh Debian machine
# (run as root). Idempotent: a second run only checks.
set -euo pipefail

need=()
command -v clang-14 >/dev/null || need+=(clang-14)
command -v llvm-strip-14 >/dev/null || need+=(llvm-14)
command -v clang-format-14 >/dev/null || need+=(clang-format-14)
command -v bpftool >/dev/null || need+=(bpftool)
command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables-save >/dev/null || need+=(iptables)
command -v nft >/dev/null || need+=(nftables)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -f /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)
if [ "${#need[@]}" -gt 0 ]; then
	echo "install-deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "install-deps: add /usr/local/go/bin to PATH" >&2
	else
		echo "install-deps: Go is missing (https://go.dev/dl); xvs needs the version in go.mod" >&2
	fi
	exit 1
fi

# bpffs for the pins (a DaemonSet gets the host's through a mount).
if ! mountpoint -q /sys/fs/bpf; then
	mount -t bpf bpf /sys/fs/bpf
fi
