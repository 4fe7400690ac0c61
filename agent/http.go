package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/spf13/pflag"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/healthcheck"
	xmetrics "github.com/xvs-lb/xvs/metrics"
	"github.com/xvs-lb/xvs/version"
)

// serveHTTP starts kube-proxy's two servers: /healthz, /livez and /readyz on
// healthzBindAddress, and metricsMux on metricsBindAddress. An empty
// address disables a server. A server that cannot listen is fatal with
// bindAddressHardFail, else logged. stop shuts the servers down and waits
// for running handlers: call it before closing what they read (the BPF
// maps).
func serveHTTP(log *slog.Logger, c *kpv1.KubeProxyConfiguration, flags *pflag.FlagSet, s *syncer, mode string, m *xmetrics.Metrics) (stop func(), err error) {
	log.Info("xvs version", "version", version.Version(), "commit", version.GitCommit(), "built", version.BuildDate())
	if err := m.Registry.Register(version.BuildInfo()); err != nil {
		return nil, err
	}
	metricsMux, err := metricsMux(c, flags, mode, m.Handler())
	if err != nil {
		return nil, err
	}
	var errs []error
	var servers []*http.Server
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, srv := range servers {
			_ = srv.Shutdown(ctx)
		}
	}
	for _, srv := range []struct {
		what, addr string
		h          http.Handler
	}{
		{"healthz", c.HealthzBindAddress, readyHandler(s.health)},
		{"metrics", c.MetricsBindAddress, metricsMux},
	} {
		if srv.addr == "" {
			continue
		}
		hs, err := listenAndServe(srv.addr, srv.h)
		if err != nil {
			err = fmt.Errorf("%s server: %w", srv.what, err)
			if c.BindAddressHardFail {
				errs = append(errs, err)
				continue
			}
			log.Error("Cannot serve; continuing without it (bindAddressHardFail is false)", "err", err)
			continue
		}
		servers = append(servers, hs)
		log.Info("Serving", "server", srv.what, "address", srv.addr)
	}
	if err := errors.Join(errs...); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// listenAndServe listens now (so that a busy port is known at start) and
// serves until the server is shut down.
func listenAndServe(addr string, h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := healthcheck.NewServer(h)
	go func() { _ = healthcheck.Serve(srv, ln) }()
	return srv, nil
}

// metricsMux is the metrics server's mux, kube-proxy's paths: /metrics,
// /healthz (a liveness ping of the server itself, as kube-proxy's metrics
// server has; the proxy's health is on healthzBindAddress), /proxyMode,
// /configz, and, behind the feature gates kube-proxy checks, /flagz (the
// command line as parsed, flags nil: none) and /statusz (start time,
// uptime, Go and binary version, the paths served) (zpages.go); /debug/pprof with enableProfiling.
func metricsMux(c *kpv1.KubeProxyConfiguration, flags *pflag.FlagSet, mode string, metrics http.Handler) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	paths := []string{"/configz", "/healthz", "/metrics", "/proxyMode"}
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, mode)
	})
	// kube-proxy's /configz: the configuration in effect, keyed by its
	// group (here the v1alpha1 form the file is written in).
	configz, err := json.Marshal(map[string]any{"kubeproxy.config.k8s.io": c})
	if err != nil {
		return nil, err
	}
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(configz)
	})
	if c.EnableProfiling {
		for path, h := range map[string]http.HandlerFunc{
			"/debug/pprof/": pprof.Index, "/debug/pprof/cmdline": pprof.Cmdline, "/debug/pprof/profile": pprof.Profile,
			"/debug/pprof/symbol": pprof.Symbol, "/debug/pprof/trace": pprof.Trace,
		} {
			mux.Handle(path, loopbackOnly(h))
		}
		paths = append(paths, "/debug/pprof")
	}
	if flags != nil && config.FeatureEnabled(c, "ComponentFlagz") {
		mux.Handle("/flagz", flagzHandler(flags))
		paths = append(paths, "/flagz")
	}
	if config.FeatureEnabled(c, "ComponentStatusz") {
		paths = append(paths, "/statusz")
		mux.Handle("/statusz", statuszHandler(processStart, paths))
	}
	return mux, nil
}

// loopbackOnly serves h to clients on the node's loopback only: the
// metrics address is usually every address (Prometheus scrapes it from
// elsewhere), and a profile, the command line or a 30-second CPU profile
// on demand is not for anyone who can reach the node. kube-proxy serves
// them to all; an operator profiles from the node (or kubectl
// port-forward, which arrives on loopback).
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "profiling is served to the node's loopback addresses only", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// componentName is what the z-pages call the component.
const componentName = "xvs"

// processStart is when the process started, near enough (/statusz).
var processStart = time.Now()
