// Command apiserver runs a real Kubernetes API server for xvs's integration
// tests: an embedded etcd (go.etcd.io/etcd/server/v3/embed) and
// kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app) in one process.
//
// It lives in its own Go module so that xvs's go.mod never depends on
// k8s.io/kubernetes. Tests do not run it by hand: lab/kubeapi builds it
// into a cache outside the repository, generates its keys, certificates and
// token file, starts it and writes a kubeconfig.
//
// Usage:
//
//	apiserver -etcd-dir DIR -etcd-client-port N -etcd-peer-port M -- [kube-apiserver flags]
//
// --etcd-servers is added to the kube-apiserver flags. The process stops on
// SIGTERM or SIGINT (kube-apiserver installs that handler, which is why one
// API server runs per process); etcd stops with it. Reusing the same
// -etcd-dir on a later start keeps every object.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "apiserver:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("apiserver", flag.ContinueOnError)
	dir := fs.String("etcd-dir", "", "etcd data directory (required; reused across restarts)")
	clientPort := fs.Int("etcd-client-port", 0, "etcd client port on 127.0.0.1 (required)")
	peerPort := fs.Int("etcd-peer-port", 0, "etcd peer port on 127.0.0.1 (required)")
	logLevel := fs.String("etcd-log-level", "warn", "etcd log level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *clientPort == 0 || *peerPort == 0 {
		return fmt.Errorf("-etcd-dir, -etcd-client-port and -etcd-peer-port are required")
	}

	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = "xvs-test"
	cfg.Dir = *dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	// Metrics and pprof stay off; no listener besides the two above.
	cfg.ListenMetricsUrls = nil

	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("etcd: not ready after 60s")
	}

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(append([]string{"--etcd-servers=" + clientURL.String()}, fs.Args()...))
	errc := make(chan error, 1)
	go func() { errc <- cmd.Execute() }()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("kube-apiserver: %w", err)
		}
		return nil
	case err := <-etcd.Err():
		return fmt.Errorf("etcd: %w", err)
	}
}
