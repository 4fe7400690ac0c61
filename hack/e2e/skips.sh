#!/usr/bin/env bash
# The --ginkgo.skip regexp of make e2e, one reason per alternative
# (docs/E2E.md lists them). Specs that need two nodes skip themselves at
# run time (e2eskipper) and show as skipped in the JUnit file.
skips=(
  '\[Disruptive\]'   # restart or kill the API server, kube-proxy, nodes: not with this rig
  '\[Serial\]'       # need the whole cluster to themselves; run separately
  'SCTP'             # the host kernel has no SCTP (no sctp module, none loadable)
  '\[Feature:LoadBalancer\]|LoadBalancer'  # no cloud provider, no load-balancer controller
)
(IFS='|'; echo "${skips[*]}")
