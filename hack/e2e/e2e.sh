#!/usr/bin/env bash
# make e2e: a one-node Kubernetes v1.37 cluster in its own PID, mount,
# network and UTS namespaces (hack/e2e/node.sh), with xvs deployed from
# hack/e2e/overlay as the only Service proxy, then upstream e2e.test.
#
#   hack/e2e/e2e.sh [e2e.test args...]     default: the [sig-network] Services specs
#   E2E_HOLD=1 hack/e2e/e2e.sh             bring the cluster up and keep it (Ctrl-C)
#   XVS_BIN=path                           use this xvs binary instead of `make build`
#   E2E_NODES=2                            a second node (hack/e2e/node2.sh)
#
# Artifacts (JUnit, e2e log, component logs) go to bin/e2e/. Everything is
# torn down on every path: the namespaces' processes (PID 1 of the PID
# namespace is node.sh, and unshare --kill-child ends it with us), the
# kubepods cgroups in every v1 hierarchy, the rig directory, and the global
# sysctls the kubelet sets (vm.overcommit_memory, kernel.panic,
# kernel.panic_on_oops) are restored.
set -euo pipefail
export PATH=$PATH:/usr/local/go/bin
cd "$(dirname "$0")/../.."
ROOT=$PWD
[[ $(id -u) == 0 ]] || { echo "e2e: needs root" >&2; exit 1; }
t0=$SECONDS
# What is tested is what the tree holds now (the binary is built from it
# below); edits made while the suite runs are not in it.
commit_at_start="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (working tree with uncommitted changes)')"
say() { echo "e2e [$((SECONDS - t0))s]: $*" >&2; }

BIN=$(hack/e2e/build.sh)
build_s=$((SECONDS - t0))
say "components in $BIN (${build_s}s)"

ART=$ROOT/bin/e2e
RIG=$(mktemp -d /var/tmp/xvs-e2e.XXXXXX)
rm -rf "$ART"; mkdir -p "$ART" "$RIG/images"

SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops"
declare -A saved
for s in $SYSCTLS; do saved[$s]=$(sysctl -n "$s"); done

node_pid=
teardown() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [[ -n $node_pid ]] && kill -0 "$node_pid" 2>/dev/null; then
    # node.sh (unshare's child, PID 1 inside) stops the cluster itself.
    pkill -TERM -P "$node_pid" 2>/dev/null
    for i in $(seq 30); do kill -0 "$node_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$node_pid" 2>/dev/null
    wait "$node_pid" 2>/dev/null
  fi
  # Anything still running from the rig (there should be none: the PID
  # namespace died with its PID 1): by PID, from the binaries' paths.
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    [[ $exe == "$BIN"/* || $exe == "$RIG"/* ]] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
  # The kubelet's cgroups, deepest first, in every v1 hierarchy.
  # (kubepods: node 1's; xvs-e2e-node2: the second node's cgroup root.)
  for h in /sys/fs/cgroup/*/; do
    for c in kubepods xvs-e2e-node2; do
      [[ -d $h/$c ]] || continue
      for i in 1 2 3 4 5; do
        find "$h/$c" -depth -type d -exec rmdir {} + 2>/dev/null
        [[ -d $h/$c ]] || break; sleep 1
      done
      [[ -d $h/$c ]] && echo "e2e: could not remove $h/$c" >&2
    done
  done
  for s in $SYSCTLS; do sysctl -qw "$s=${saved[$s]}"; done
  cp -r "$RIG/logs" "$ART/logs" 2>/dev/null
  # Overlay mounts were in the node's mount namespace; none is left on the
  # host, so the rig directory goes as a plain tree.
  if grep -q " $RIG" /proc/self/mountinfo; then echo "e2e: mounts left under $RIG; not removing it" >&2; else rm -rf "$RIG"; fi
  say "torn down (exit $rc)"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- Images, as docker-save tarballs (hack/image), imported by node.sh.
if [[ -z ${XVS_BIN:-} ]]; then
  nice -n 10 make -s build-node >&2
  XVS_BIN=bin/node/xvs
fi
img() { go run ./hack/image "$@"; }
img -o "$RIG/images/xvs.tar" -tag ghcr.io/xvs-lb/xvs:e2e -add "$XVS_BIN=/usr/local/bin/xvs" \
  -rootfs "$(hack/e2e/rootfs.sh xvs $(make -s image-packages))" -entrypoint /usr/local/bin/xvs
# agnhost's own image is Alpine: bind-tools curl netcat-openbsd iproute2
# bash socat, and busybox for everything else. GNU wget: Debian's static
# busybox 1.35 wget -T (which e2e uses) exits 139 (SIGSEGV).
agn=$(hack/e2e/rootfs.sh agnhost bash coreutils netcat-openbsd bind9-dnsutils curl iproute2 socat procps iputils-ping conntrack wget busybox)
ln -sfn nc.openbsd "$agn/bin/nc"
for a in $("$agn/bin/busybox" --list); do
  [[ -e $agn/bin/$a || -L $agn/bin/$a || -e $agn/usr/bin/$a || -e $agn/sbin/$a || -e $agn/usr/sbin/$a ]] || ln -s busybox "$agn/bin/$a"
done
img -o "$RIG/images/agnhost.tar" -tag registry.k8s.io/e2e-test-images/agnhost:2.66.1 -rootfs "$agn" \
  -add "$BIN/agnhost=/agnhost" -entrypoint /agnhost
# Debian busybox 1.35: its wget segfaults with -T (both builds), so GNU
# wget (/usr/bin, ahead of /bin in PATH) as in agnhost.
bb=$(hack/e2e/rootfs.sh busybox busybox wget)
for a in $("$bb/bin/busybox" --list); do [[ -e $bb/bin/$a || -L $bb/bin/$a ]] || ln -s busybox "$bb/bin/$a"; done
img -o "$RIG/images/busybox.tar" -tag registry.k8s.io/e2e-test-images/busybox:1.37.0-2 -rootfs "$bb" \
  -cmd /bin/sh
img -o "$RIG/images/regression-issue-74839.tar" -tag registry.k8s.io/e2e-test-images/regression-issue-74839:1.5 \
  -add "$BIN/regression-issue-74839=/regression-issue-74839" -entrypoint /regression-issue-74839
# The CLOSE_WAIT spec's host-network probe: sh, sleep, grep, which, conntrack.
ipt=$(hack/e2e/rootfs.sh distroless-iptables bash coreutils grep debianutils conntrack iptables)
[[ -e $ipt/usr/bin/which ]] || ln -s which.debianutils "$ipt/usr/bin/which"   # an alternative: made by postinst
img -o "$RIG/images/distroless-iptables.tar" -tag registry.k8s.io/build-image/distroless-iptables:v0.9.9 -rootfs "$ipt" -cmd /bin/sh
img -o "$RIG/images/pause.tar" -tag registry.k8s.io/pause:3.10.2 -add "$BIN/pause=/pause" -entrypoint /pause
img -o "$RIG/images/coredns.tar" -tag registry.k8s.io/coredns/coredns:v1.15.0 -add "$BIN/coredns=/coredns" -entrypoint /coredns
say "images built"

if (($# == 0)); then
  # [sig-network] Services, and from test/e2e/network the conntrack specs,
  # the CLOSE_WAIT one and two Granular Checks (large requests, endpoints
  # on hostNetwork).
  focus='\[sig-network\] Services |\[sig-network\] Conntrack |\[sig-network\] KubeProxy should set TCP CLOSE_WAIT'
  focus+='|\[sig-network\] Networking Granular Checks: Services should (be able to handle large requests|function for service endpoints using hostNetwork)'
  set -- --ginkgo.focus="$focus" --ginkgo.skip="$(hack/e2e/skips.sh)"
fi
start_s=$SECONDS
unshare --pid --mount --net --uts --fork --kill-child --mount-proc \
  hack/e2e/node.sh "$RIG" "$BIN" "$ART" -- "$@" &
node_pid=$!
set +e
wait "$node_pid"
rc=$?
set -e
node_pid=
{
  echo "commit=$commit_at_start"
  echo "version=$("$XVS_BIN" --version)"
  echo "kernel=$(uname -r) ($(nproc) CPUs, $(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1048576)) GiB)"
  echo "k8s=$(awk '$1=="k8s.io/kubernetes"{print $2}' test/e2e/go.mod), containerd v2.4.2, runc v1.5.3, CoreDNS v1.15.0, CNI plugins v1.10.0"
  echo "date=$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "nodes=${E2E_NODES:-1}"
  [[ ${E2E_NODES:-1} == 2 ]] && echo "title=Two nodes (E2E_NODES=2): the specs that need a second node"
  echo "build=${build_s}s this run; the cold build of each component: $(paste -sd' ' "$(dirname "$BIN")/times" 2>/dev/null)"
  [[ -f $ART/bringup ]] && echo "bringup=$(cat "$ART/bringup")s"
  [[ -f $ART/bringup ]] && echo "e2e=$((SECONDS - start_s - $(cat "$ART/bringup")))s"
  echo "total=$((SECONDS - t0))s"
  for a in "$@"; do
    case $a in --ginkgo.focus=*) echo "focus=${a#--ginkgo.focus=}";; --ginkgo.skip=*) echo "skip=${a#--ginkgo.skip=}";; esac
  done
} >"$ART/meta.txt"
say "e2e.test finished: exit $rc; JUnit and logs in $ART"
exit "$rc"
