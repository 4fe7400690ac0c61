# Multi-stage build of the static xvs binary. The generated BPF objects are
# committed, so the build stage needs Go only.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/xvs ./cmd/xvs

# The runtime image carries bpftool and iproute2 for inspection on the node.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends bpftool iproute2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/xvs /usr/local/bin/xvs
ENTRYPOINT ["/usr/local/bin/xvs"]
