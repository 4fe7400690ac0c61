package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/common/expfmt"
	kpv1 "k8s.io/kube-proxy/config/v1alpha1"

	xmetrics "github.com/xvs-lb/xvs/metrics"
)

// serveHTTP starts kube-proxy's two servers: /healthz and /livez on
// healthzBindAddress, /metrics and /proxyMode (and /debug/pprof with
// enableProfiling) on metricsBindAddress. An empty address disables a
// server. A server that cannot listen is fatal with bindAddressHardFail,
// else logged.
func serveHTTP(ctx context.Context, log *slog.Logger, c *kpv1.KubeProxyConfiguration, s *syncer, mode string, m *xmetrics.Metrics) error {
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/metrics", metricsHandler(m))
	metricsMux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, mode)
	})
	if c.EnableProfiling {
		metricsMux.HandleFunc("/debug/pprof/", pprof.Index)
		metricsMux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		metricsMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metricsMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		metricsMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	var errs []error
	for _, srv := range []struct {
		what, addr string
		h          http.Handler
	}{
		{"healthz", c.HealthzBindAddress, s.health.Handler()},
		{"metrics", c.MetricsBindAddress, metricsMux},
	} {
		if srv.addr == "" {
			continue
		}
		if err := listenAndServe(ctx, srv.addr, srv.h); err != nil {
			err = fmt.Errorf("%s server: %w", srv.what, err)
			if c.BindAddressHardFail {
				errs = append(errs, err)
				continue
			}
			log.Error("Cannot serve; continuing without it (bindAddressHardFail is false)", "err", err)
			continue
		}
		log.Info("Serving", "server", srv.what, "address", srv.addr)
	}
	return errors.Join(errs...)
}

// listenAndServe listens now (so that a busy port is known at start) and
// serves until ctx ends.
func listenAndServe(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return nil
}

// metricsHandler writes the registry in the Prometheus text format, then
// the datapath-selection metrics of ipvsmode.go (already text).
func metricsHandler(m *xmetrics.Metrics) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mfs, err := m.Registry.Gather()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
		_, _ = w.Write(buf.Bytes())
		metrics.ServeHTTP(w, r)
	})
}
