# Multi-stage build of the static xvs binary. The generated BPF objects are
# committed, so the build stage needs Go only.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/xvs ./cmd/xvs

# The runtime image carries bpftool, iproute2 (tc) and ipvsadm for inspection
# on the node. mode: ipvs runs `nft` (its masquerade and filter rules) and
# `modprobe ip_vs` (against the host's /lib/modules, which the DaemonSet
# mounts), so nftables and kmod are part of the agent, not extras.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        bpftool iproute2 ipvsadm kmod nftables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/xvs /usr/local/bin/xvs
ENTRYPOINT ["/usr/local/bin/xvs"]
