#!/usr/bin/env bash
# rootfs.sh NAME PKG...: a Debian bookworm root filesystem holding PKG and
# their dependencies, unpacked without a chroot (mmdebstrap chrootless,
# variant extract: no maintainer scripts run), cached under
# $XVS_CACHE_DIR/rootfs/NAME-<hash of the package list>. Prints the dir.
set -euo pipefail
name=$1; shift
CACHE=${XVS_CACHE_DIR:-/var/cache/xvs}
SUITE=bookworm
key=$(echo "$SUITE $*" | sha256sum | cut -c1-12)
dir=$CACHE/rootfs/$name-$key
mkdir -p "$CACHE/rootfs"
exec 8>"$CACHE/rootfs/$name.lock"
flock 8
if [[ ! -e $dir/.done ]]; then
  command -v mmdebstrap >/dev/null || { apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >&2; }
  rm -rf "$dir.tmp"
  inc=$(IFS=,; echo "$*")
  nice -n 10 mmdebstrap --quiet --mode=chrootless --variant=extract --include="$inc" \
    --dpkgopt='path-exclude=/usr/share/{doc,man,info,locale}/*' "$SUITE" "$dir.tmp" >&2
  # What an image needs that no maintainer script wrote.
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$dir.tmp/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir.tmp/etc/group"
  rm -rf "$dir.tmp/var/cache/apt" "$dir.tmp/var/lib/apt/lists" "$dir.tmp/dev"
  mkdir -p "$dir.tmp/dev" "$dir.tmp/proc" "$dir.tmp/sys" "$dir.tmp/tmp" "$dir.tmp/root"
  chmod 1777 "$dir.tmp/tmp"
  touch "$dir.tmp/.done"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
fi
# /bin/sh is written by a maintainer script (none runs here): bash, or
# busybox.
if [[ ! -e $dir/bin/sh ]]; then
  if [[ -e $dir/bin/bash ]]; then ln -s bash "$dir/bin/sh"; elif [[ -e $dir/bin/busybox ]]; then ln -s busybox "$dir/bin/sh"; fi
fi
echo "$dir"
