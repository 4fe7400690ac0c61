#!/usr/bin/env bash
# Builds every binary the one-node e2e cluster needs, from Go modules and
# Debian packages only, into a cache outside the repository:
#   $XVS_CACHE_DIR (default /var/cache/xvs)/e2e/<key>/bin
# <key> hashes test/e2e/go.mod, go.sum, the versions below and the Go
# version, so an unchanged rig is reused across clones. Each binary is built
# once (a partial build resumes); one build at a time under a file lock.
# Prints the bin directory on stdout; progress goes to stderr.
# Cold: about 25 min on 2 cores. Usage: hack/e2e/build.sh
set -euo pipefail
export PATH=$PATH:/usr/local/go/bin
cd "$(dirname "$0")/../.."
ROOT=$PWD

K8S_VERSION=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' test/e2e/go.mod)
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
COREDNS_VERSION=v1.15.0
CNI_VERSION=v1.10.0

CACHE=${XVS_CACHE_DIR:-/var/cache/xvs}
key=$( { cat test/e2e/go.mod test/e2e/go.sum; echo "$CONTAINERD_VERSION $RUNC_VERSION $COREDNS_VERSION $CNI_VERSION"; go version; } | sha256sum | cut -c1-12)
DIR=$CACHE/e2e/$K8S_VERSION-$key
BIN=$DIR/bin
mkdir -p "$BIN"
exec 9>"$DIR/lock"
flock 9

log() { echo "e2e-build: $*" >&2; }
NICE="nice -n 10"
export GOWORK=off CGO_ENABLED=0 GOFLAGS="-buildvcs=false"

# Debian packages: runc's seccomp, the root filesystems, the node's tools.
need_apt=()
for p in libseccomp-dev pkg-config gcc mmdebstrap iptables nftables conntrack socat ethtool kmod util-linux iproute2 jq openssl python3 curl; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi

step() { # step NAME CMD...: run CMD unless $BIN/NAME exists; time it
  local name=$1; shift
  [[ -e $BIN/$name ]] && return 0
  local t0=$SECONDS
  log "building $name"
  "$@" >&2
  log "built $name in $((SECONDS - t0))s"
  echo "$name $((SECONDS - t0))s" >>"$DIR/times"
}

gi() { # gi VERSION PKG... : go install into $BIN (outside any module)
  local v=$1; shift
  local pkgs=() p
  for p in "$@"; do pkgs+=("$p@$v"); done
  (cd /tmp && GOBIN=$BIN $NICE go install -trimpath "${EXTRA_GOFLAGS[@]}" "${pkgs[@]}")
}

EXTRA_GOFLAGS=(-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION")
step containerd gi $CONTAINERD_VERSION github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
EXTRA_GOFLAGS=(-tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}")
CGO_ENABLED=1 step runc gi $RUNC_VERSION github.com/opencontainers/runc
EXTRA_GOFLAGS=(-ldflags "-s -w")
mkdir -p "$BIN/cni"
cnibuild() { (cd /tmp && GOBIN=$BIN/cni $NICE go install -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" \
  github.com/containernetworking/plugins/plugins/main/bridge@$CNI_VERSION github.com/containernetworking/plugins/plugins/main/loopback@$CNI_VERSION \
  github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_VERSION github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_VERSION) && touch "$BIN/cni/.done"; }
step cni/.done cnibuild
step coredns gi $COREDNS_VERSION github.com/coredns/coredns

# The Kubernetes side, from the scratch module test/e2e (same replace block
# as test/apiserver), with the version stamps release builds carry.
KSRC=$(cd test/e2e && go list -m -f '{{.Dir}}' k8s.io/kubernetes 2>/dev/null || true)
if [[ -z $KSRC ]]; then (cd test/e2e && go mod download k8s.io/kubernetes) >&2; KSRC=$(cd test/e2e && go list -m -f '{{.Dir}}' k8s.io/kubernetes); fi
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
KLD="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"
kb() { (cd test/e2e && $NICE go build -trimpath -ldflags "$KLD" -o "$BIN/$1.tmp" "$2" && mv "$BIN/$1.tmp" "$BIN/$1"); }
step pause sh -c "gcc -Os -static -DVERSION=v3.10.2 -o '$BIN/pause.tmp' '$KSRC/build/pause/linux/pause.c' && strip '$BIN/pause.tmp' && mv '$BIN/pause.tmp' '$BIN/pause'"
step kubectl kb kubectl k8s.io/kubernetes/cmd/kubectl
step kubelet kb kubelet k8s.io/kubernetes/cmd/kubelet
step kube-scheduler kb kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
step kube-controller-manager kb kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
step agnhost kb agnhost k8s.io/kubernetes/test/images/agnhost
# The Conntrack INVALID-state spec's server (image regression-issue-74839:1.5).
step regression-issue-74839 kb regression-issue-74839 k8s.io/kubernetes/test/images/regression-issue-74839
e2etest() { (cd test/e2e && $NICE go test -c -trimpath -ldflags "$KLD" -o "$BIN/e2e.test.tmp" k8s.io/kubernetes/test/e2e && mv "$BIN/e2e.test.tmp" "$BIN/e2e.test"); }
step e2e.test e2etest
# kube-apiserver + etcd: the integration tests' rig (lab/kubeapi's cache).
if [[ ! -e $BIN/apiserver ]]; then
  t0=$SECONDS
  p=$($NICE go run ./lab/kubeapi/cmd/apiserver-build)
  ln -sf "$p" "$BIN/apiserver"
  echo "apiserver $((SECONDS - t0))s" >>"$DIR/times"
fi
echo "$BIN"
