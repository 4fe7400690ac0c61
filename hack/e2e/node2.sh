#!/usr/bin/env bash
# The second node of `E2E_NODES=2 make e2e`: run by node.sh under
# `unshare --net --mount --uts` (same PID namespace, so it dies with the
# cluster). Its only link is eth0p, the peer of node 1's eth0, moved here by
# node.sh: 10.77.0.3/24, pods 10.244.1.0/24. Its own containerd, kubelet
# (cgroup root /xvs-e2e-node2), bpffs, /run, /var/lib, /opt.
#   node2.sh RIG BIN
set -euo pipefail
RIG=$1 BIN=$2
export PATH=$BIN:$BIN/cni:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
NODE=xvs-e2e-node2 NODE_IP=10.77.0.3 PEER_IP=10.77.0.2 POD_CIDR=10.244.1.0/24 PEER_POD_CIDR=10.244.0.0/24
D=$RIG/node2; mkdir -p "$D/logs" "$D/varlog" "$D/cni/net.d" "$D/containerd"
P=$RIG/pki
hostname "$NODE"
mount --make-rprivate /
mkdir -p "$D/oldsys"; mount --rbind /sys "$D/oldsys"
mount -t sysfs sysfs /sys
mount --rbind "$D/oldsys/fs/cgroup" /sys/fs/cgroup
umount -l "$D/oldsys"
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmpfs /run
mount --bind "$D/varlog" /var/log
mount -t tmpfs tmpfs /var/lib
mount -t tmpfs tmpfs /opt
mkdir -p /run/lib-modules
[[ -d /lib/modules ]] && mount --rbind /lib/modules /run/lib-modules
mount --make-rshared /

ip link set lo up
for i in $(seq 50); do ip link show eth0p >/dev/null 2>&1 && break; sleep 0.2; done
ip addr add $NODE_IP/24 dev eth0p
ip link set eth0p up
ip route add default dev eth0p
ip route add $PEER_POD_CIDR via $PEER_IP
sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0

# The kubelet's cgroup root, in every v1 hierarchy (cpuset needs its
# cpus and mems before anything joins it).
for h in /sys/fs/cgroup/*/; do
  [[ -L ${h%/} ]] && continue
  mkdir -p "$h/xvs-e2e-node2"
  if [[ -f $h/cpuset.cpus ]]; then cat "$h/cpuset.cpus" >"$h/xvs-e2e-node2/cpuset.cpus"; cat "$h/cpuset.mems" >"$h/xvs-e2e-node2/cpuset.mems"; fi
done

cat >"$D/cni/net.d/10-bridge.conflist" <<J
{"cniVersion": "1.0.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$D/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
J
sed -e "s#^root = .*#root = \"$D/containerd/root\"#" -e "s#conf_dir = .*#conf_dir = '$D/cni/net.d'#" "$RIG/containerd/config.toml" >"$D/containerd/config.toml"
containerd --config "$D/containerd/config.toml" >"$D/logs/containerd.log" 2>&1 &
for i in $(seq 60); do ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1 && break; sleep 1; done
for t in "$RIG"/images/*.tar; do ctr --address /run/containerd/containerd.sock -n k8s.io images import "$t" >/dev/null 2>&1; done
sed -e "s#^address: .*#address: $NODE_IP#" -e "s#^tlsCertFile: .*#tlsCertFile: \"$P/kubelet2.crt\"#" -e "s#^tlsPrivateKeyFile: .*#tlsPrivateKeyFile: \"$P/kubelet2.key\"#" \
  "$RIG/kubelet.yaml" >"$D/kubelet.yaml"
echo "cgroupRoot: /xvs-e2e-node2" >>"$D/kubelet.yaml"
exec kubelet --config="$D/kubelet.yaml" --kubeconfig="$RIG/kubelet2.kubeconfig" \
  --root-dir="$D/kubelet" --node-ip=$NODE_IP --hostname-override=$NODE -v=2 >"$D/logs/kubelet.log" 2>&1
