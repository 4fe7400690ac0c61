package healthcheck

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// The agent's HTTP endpoints (/healthz on 0.0.0.0:10256 by default,
// /metrics, the health check NodePorts) are reachable from anything that
// reaches the node, so no client may hold them: every phase of a request
// has a deadline, and at most MaxConns connections are served at once
// (more wait in the listen backlog).
const (
	MaxConns          = 128
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 2 * time.Minute // a large /metrics on a slow link, a 30 s /debug/pprof/profile
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 16 << 10
)

// NewServer is an http.Server for h with those deadlines.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// Serve serves srv on ln, MaxConns connections at a time.
func Serve(srv *http.Server, ln net.Listener) error {
	return srv.Serve(netutil.LimitListener(ln, MaxConns))
}
