#!/usr/bin/env bash
# The one-node cluster, run by hack/e2e/e2e.sh as PID 1 of its own PID,
# mount, network and UTS namespaces (unshare --kill-child): when this script
# ends, the kernel ends every process of the cluster with it. Nothing here
# touches the host's network: the node's only link is a veth pair whose two
# ends are both in this namespace.
#   node.sh RIG BIN ARTIFACTS -- E2E.TEST-ARGS...
set -euo pipefail
RIG=$1 BIN=$2 ART=$3; shift 3; [[ ${1:-} == -- ]] && shift
export PATH=$BIN:$BIN/cni:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "$0")" && pwd)
NODE=xvs-e2e-node NODE_IP=10.77.0.2 SVC_CIDR=10.96.0.0/16 POD_CIDR=10.244.0.0/24
LOG=$RIG/logs; mkdir -p "$LOG"
t0=$SECONDS
say() { echo "e2e-node [$((SECONDS - t0))s]: $*" >&2; }

pids=()
stopall() {
  local rc=$?
  set +e
  say "stopping (rc $rc)"
  # Pods first (through the kubelet's own teardown is too slow here):
  # kill the kubelet, then containerd and every shim and container by PID.
  for p in $(printf '%s\n' "${pids[@]}" | tac); do kill -TERM "$p" 2>/dev/null; done
  sleep 2
  for p in /proc/[0-9]*; do p=${p#/proc/}; [[ $p != 1 && $p != $$ ]] && kill -KILL "$p" 2>/dev/null; done
  # Overlay and shm mounts of the containers go with this mount namespace.
  exit "$rc"
}
trap stopall EXIT
trap 'exit 130' INT TERM

hostname "$NODE"
# Mounts: private to this namespace, then shared inside it (the DaemonSet's
# Bidirectional bpffs mount needs a shared parent).
mount --make-rprivate /
mkdir -p "$RIG/oldsys"
mount --rbind /sys "$RIG/oldsys"
mount -t sysfs sysfs /sys                 # this netns's /sys/class/net
mount --rbind "$RIG/oldsys/fs/cgroup" /sys/fs/cgroup
umount -l "$RIG/oldsys"
mount -t bpf bpf /sys/fs/bpf              # pins die with the namespace
mount -t tmpfs tmpfs /run                 # /run/containerd, /run/xvs, /run/netns
mkdir -p "$RIG/varlog"; mount --bind "$RIG/varlog" /var/log   # /var/log/pods
# Paths the components write whatever their flags say (host-local's and
# libcni's /var/lib/cni, the kubelet's /var/lib/kubelet/device-plugins,
# containerd's /opt/containerd): empty tmpfs here, so the host's stay
# untouched and no IP reservation outlives a run.
mount -t tmpfs tmpfs /var/lib
mount -t tmpfs tmpfs /opt
# The DaemonSet's /lib/modules, from /run (this machine's kernel has no
# loadable modules and no /lib/modules; the host's tree stays untouched).
mkdir -p /run/lib-modules
[[ -d /lib/modules ]] && mount --rbind /lib/modules /run/lib-modules
mount --make-rshared /

# Network: lo, and eth0 (10.77.0.2/24) whose peer eth0p is here too; the
# default route is a device route, so nothing ever leaves the namespace.
ip link set lo up
ip link add eth0 type veth peer name eth0p
ip addr add $NODE_IP/24 dev eth0
ip link set eth0 up; ip link set eth0p up
ip route add default dev eth0
sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0

# ---- PKI (openssl): one CA for everything.
P=$RIG/pki; mkdir -p "$P"
cert() { # cert NAME CN O [SANs]
  local n=$1 cn=$2 o=$3 san=${4:-}
  openssl req -new -newkey rsa:2048 -nodes -keyout "$P/$n.key" -subj "/CN=$cn${o:+/O=$o}" -out "$P/$n.csr" 2>/dev/null
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"; [[ -n $san ]] && echo "subjectAltName=$san"; } >"$P/$n.ext"
  openssl x509 -req -in "$P/$n.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 2 -extfile "$P/$n.ext" -out "$P/$n.crt" 2>/dev/null
}
openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$P/ca.key" -subj "/CN=xvs-e2e-ca" -days 2 -out "$P/ca.crt" 2>/dev/null
cert apiserver kube-apiserver "" "IP:$NODE_IP,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE"
cert admin kubernetes-admin system:masters
cert kubelet "system:node:$NODE" system:nodes "IP:$NODE_IP,DNS:$NODE"
cert kcm system:kube-controller-manager ""
cert scheduler system:kube-scheduler ""
cert apiserver-kubelet kube-apiserver-kubelet-client system:masters
openssl genrsa -out "$P/sa.key" 2048 2>/dev/null; openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
kcfg() { # kcfg NAME: kubeconfig with the NAME client cert
  cat >"$RIG/$1.kubeconfig" <<K
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$P/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: $1}}]
current-context: e2e
K
}
cert kubelet2 "system:node:xvs-e2e-node2" system:nodes "IP:10.77.0.3,DNS:xvs-e2e-node2"
for n in admin kubelet kubelet2 kcm scheduler; do kcfg $n; done
export KUBECONFIG=$RIG/admin.kubeconfig

bg() { # bg NAME CMD...: start in the background, log to $LOG/NAME.log
  local n=$1; shift
  "$@" >"$LOG/$n.log" 2>&1 &
  pids+=($!)
  say "started $n (pid $!)"
}
waitfor() { # waitfor WHAT SECONDS CMD...: SECONDS of wall time, however long CMD takes
  local what=$1 n=$2 until=$((SECONDS + $2)); shift 2
  while ((SECONDS < until)); do "$@" >/dev/null 2>&1 && { say "$what ready"; return 0; }; sleep 1; done
  say "$what not ready after ${n}s"; return 1
}

# ---- Control plane: etcd + kube-apiserver (test/apiserver's rig binary).
bg apiserver apiserver -etcd-dir "$RIG/etcd" -etcd-client-port 2379 -etcd-peer-port 2380 -- \
  --bind-address=$NODE_IP --advertise-address=$NODE_IP --secure-port=6443 \
  --cert-dir="$P" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=$SVC_CIDR --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --kubelet-client-certificate="$P/apiserver-kubelet.crt" --kubelet-client-key="$P/apiserver-kubelet.key" \
  --kubelet-preferred-address-types=InternalIP --allow-privileged=true --profiling=false
waitfor apiserver 180 kubectl get --raw /readyz
bg kube-controller-manager kube-controller-manager --kubeconfig="$RIG/kcm.kubeconfig" \
  --authentication-kubeconfig="$RIG/kcm.kubeconfig" --authorization-kubeconfig="$RIG/kcm.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --allocate-node-cidrs=true --cluster-cidr=10.244.0.0/16 --node-cidr-mask-size=24 --service-cluster-ip-range=$SVC_CIDR
bg kube-scheduler kube-scheduler --kubeconfig="$RIG/scheduler.kubeconfig" \
  --authentication-kubeconfig="$RIG/scheduler.kubeconfig" --authorization-kubeconfig="$RIG/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false

# ---- containerd + runc, CNI bridge + host-local.
mkdir -p "$RIG/cni/net.d" "$RIG/containerd"
cat >"$RIG/cni/net.d/10-bridge.conflist" <<J
{"cniVersion": "1.0.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": $([[ ${E2E_NODES:-1} == 2 ]] && echo false || echo true), "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RIG/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
J
cat >"$RIG/containerd/config.toml" <<T
version = 3
root = "$RIG/containerd/root"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10.2'
[plugins.'io.containerd.cri.v1.runtime']
  # This machine's root has no CAP_SYS_RESOURCE in its bounding set: no
  # process may lower its oom_score_adj, and runc fails every sandbox
  # (-998) otherwise. Restricted, the scores are clamped at containerd's own.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$BIN/cni']
    conf_dir = '$RIG/cni/net.d'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '$BIN/runc'
      SystemdCgroup = false
T
bg containerd containerd --config "$RIG/containerd/config.toml"
waitfor containerd 60 ctr --address /run/containerd/containerd.sock version
for t in "$RIG"/images/*.tar; do
  ctr --address /run/containerd/containerd.sock -n k8s.io images import --no-unpack=false "$t" >&2
done
ctr --address /run/containerd/containerd.sock -n k8s.io images ls -q >&2

# ---- kubelet (cgroup v1, cgroupfs: failCgroupV1 false).
echo "nameserver $NODE_IP" >"$RIG/resolv.conf"   # nothing answers: no lookups leave the node
cat >"$RIG/kubelet.yaml" <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$P/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$P/kubelet.crt"
tlsPrivateKeyFile: "$P/kubelet.key"
address: $NODE_IP
healthzBindAddress: 127.0.0.1
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: "$RIG/resolv.conf"
runtimeRequestTimeout: 10m
failSwapOn: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 250
Y
bg kubelet kubelet --config="$RIG/kubelet.yaml" --kubeconfig="$RIG/kubelet.kubeconfig" \
  --root-dir="$RIG/kubelet" --node-ip=$NODE_IP --hostname-override=$NODE -v=2
waitfor node 180 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"

# ---- E2E_NODES=2: a second node (node2.sh) in its own network, mount and
# UTS namespaces, on the other end of eth0 (eth0p moves there).
if [[ ${E2E_NODES:-1} == 2 ]]; then
  unshare --net --mount --uts "$HERE/node2.sh" "$RIG" "$BIN" &
  n2=$!; pids+=($n2)
  for i in $(seq 50); do [[ $(readlink /proc/$n2/ns/net) != $(readlink /proc/self/ns/net) ]] && break; sleep 0.1; done
  ip link set eth0p netns "$n2"
  ip route add 10.244.1.0/24 via 10.77.0.3
  say "started node2 (pid $n2)"
  waitfor node2 180 sh -c "kubectl get node xvs-e2e-node2 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
fi

# ---- Cluster add-ons: xvs (the only Service proxy) and CoreDNS.
kubectl apply -k "$HERE/overlay" >&2
kubectl apply -f "$HERE/coredns.yaml" >&2
if ! waitfor xvs 300 kubectl -n kube-system rollout status ds/xvs --timeout=5s; then
  # What the agent said: each pod's init container and agent, the
  # previous run of a crashing one too, into the component logs.
  for pod in $(kubectl -n kube-system get pods -l app.kubernetes.io/name=xvs -o name 2>/dev/null); do
    for c in init xvs; do
      kubectl -n kube-system logs "$pod" -c $c >"$LOG/${pod#pod/}-$c.log" 2>&1 || true
      kubectl -n kube-system logs "$pod" -c $c --previous >>"$LOG/${pod#pod/}-$c.log" 2>&1 || true
    done
  done
  kubectl -n kube-system describe pods -l app.kubernetes.io/name=xvs >"$LOG/xvs-pods.txt" 2>&1 || true
  exit 1
fi
waitfor coredns 300 kubectl -n kube-system rollout status deploy/coredns --timeout=5s
waitfor default-sa 120 kubectl get sa default
kubectl get pods -A -o wide >&2
kubectl -n kube-system logs ds/xvs --tail=20 >&2 || true
[[ ${E2E_HOLD:-} ]] && { say "E2E_HOLD set: holding the cluster (KUBECONFIG=$KUBECONFIG); Ctrl-C ends it"; sleep infinity; }

# ---- e2e.test.
mkdir -p "$ART"
echo $((SECONDS - t0)) >"$ART/bringup"
say "e2e.test $*"
set +e
# In the background, so that a signal stops it at once (bash runs traps
# only between foreground commands).
# Its temporary files (kubectl's test-kuberc* directories) go under the
# rig, which the teardown removes.
mkdir -p "$RIG/tmp"
{ TMPDIR="$RIG/tmp" e2e.test --kubeconfig="$KUBECONFIG" --provider=local --kubectl-path="$BIN/kubectl" \
    --report-dir="$ART" --e2e-output-dir="$ART" --minStartupPods=1 --ginkgo.no-color --ginkgo.timeout=3h --ginkgo.v "$@" 2>&1
  echo $? >"$RIG/e2e.rc"; } | tee "$ART/e2e.log" >&2 &
pids+=($!)
wait $!
rc=$(cat "$RIG/e2e.rc" 2>/dev/null || echo 1)
set -e
kubectl get pods -A -o wide >"$LOG/pods.txt" 2>&1 || true
for p in $(kubectl -n kube-system get pods -l k8s-app=xvs -o name 2>/dev/null); do
  kubectl -n kube-system logs "$p" >"$LOG/xvs-agent-${p#pod/}.log" 2>&1 || true
done
[[ -d $RIG/node2/logs ]] && cp -r "$RIG/node2/logs" "$LOG/node2"
say "e2e.test exit $rc"
exit "$rc"
