package healthcheck

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Service is what the health check server of one Service needs.
type Service struct {
	// Port is spec.healthCheckNodePort.
	Port uint16
	// LocalEndpoints counts this node's Ready endpoints (over all ports of
	// the Service, as kube-proxy counts them). Terminating endpoints never
	// count, even while traffic still goes to serving-terminating ones.
	LocalEndpoints int
}

// ServiceHealth runs the healthCheckNodePort servers (docs/semantics.md §3.8).
type ServiceHealth struct {
	// healthy is the proxy's own health (ProxyHealth.IsHealthy): a stale
	// proxy answers 503 everywhere so that load balancers move away.
	healthy func() bool
	// bindFailed is told once per Service and port when a listener cannot
	// be opened (kube-proxy's FailedToStartServiceHealthcheck Event).
	bindFailed func(svc types.NamespacedName, port uint16, err error)

	mu      sync.Mutex
	servers map[types.NamespacedName]*hcServer
	failed  map[types.NamespacedName]uint16
}

// hcServer is the server of one Service: one listener per address.
type hcServer struct {
	name      types.NamespacedName
	port      uint16
	addrs     []netip.Addr
	endpoints atomic.Int64
	srv       *http.Server
}

// NewServiceHealth returns an empty set of servers.
func NewServiceHealth(healthy func() bool, bindFailed func(types.NamespacedName, uint16, error)) *ServiceHealth {
	return &ServiceHealth{healthy: healthy, bindFailed: bindFailed,
		servers: map[types.NamespacedName]*hcServer{}, failed: map[types.NamespacedName]uint16{}}
}

// Sync makes the running servers match want. Servers listen on each of
// addrs, or on every address when addrs is empty (nodePortAddresses
// unset). A Service whose port or addresses changed gets a new server;
// one whose only change is its endpoint count keeps its listener. Binding
// is retried on every Sync until it works.
func (s *ServiceHealth) Sync(want map[types.NamespacedName]Service, addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hs := range s.servers {
		w, ok := want[name]
		if !ok || w.Port != hs.port || !slices.Equal(hs.addrs, addrs) {
			hs.close()
			delete(s.servers, name)
		}
	}
	for name := range s.failed {
		if w, ok := want[name]; !ok || w.Port != s.failed[name] {
			delete(s.failed, name)
		}
	}
	for name, w := range want {
		if hs := s.servers[name]; hs != nil {
			hs.endpoints.Store(int64(w.LocalEndpoints))
			continue
		}
		hs, err := s.listen(name, w, addrs)
		if err != nil {
			if s.failed[name] != w.Port && s.bindFailed != nil {
				s.bindFailed(name, w.Port, err)
			}
			s.failed[name] = w.Port
			continue
		}
		delete(s.failed, name)
		s.servers[name] = hs
	}
}

// Ports returns the running servers' ports by Service (for tests and
// inspection).
func (s *ServiceHealth) Ports() map[types.NamespacedName]uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[types.NamespacedName]uint16, len(s.servers))
	for n, hs := range s.servers {
		out[n] = hs.port
	}
	return out
}

// Close stops every server.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, hs := range s.servers {
		hs.close()
		delete(s.servers, name)
	}
}

func (s *ServiceHealth) listen(name types.NamespacedName, w Service, addrs []netip.Addr) (*hcServer, error) {
	hs := &hcServer{name: name, port: w.Port, addrs: slices.Clone(addrs)}
	hs.endpoints.Store(int64(w.LocalEndpoints))
	hs.srv = NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		s.serve(rw, hs)
	}))
	hosts := []string{""}
	if len(addrs) > 0 {
		hosts = hosts[:0]
		for _, a := range addrs {
			hosts = append(hosts, a.String())
		}
	}
	var lns []net.Listener
	for _, h := range hosts {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(w.Port))))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("health check server for %s: %w", name, err)
		}
		lns = append(lns, ln)
	}
	for _, ln := range lns {
		// Serve returns http.ErrServerClosed when Sync or Close shuts the
		// server down; nothing else ends it while the listener is open.
		go func() { _ = Serve(hs.srv, ln) }()
	}
	return hs, nil
}

func (hs *hcServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = hs.srv.Shutdown(ctx)
}

// serve answers any path as kube-proxy does: 200 when the Service has
// local endpoints and the proxy is healthy, else 503; the endpoint count
// also goes into X-Load-Balancing-Endpoint-Weight.
func (s *ServiceHealth) serve(rw http.ResponseWriter, hs *hcServer) {
	n := hs.endpoints.Load()
	healthy := s.healthy == nil || s.healthy()
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("X-Content-Type-Options", "nosniff")
	rw.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(n, 10))
	if n > 0 && healthy {
		rw.WriteHeader(http.StatusOK)
	} else {
		rw.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintf(rw, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		hs.name.Namespace, hs.name.Name, n, healthy)
}
