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
//	apiserver -etcd-dir DIR -etcd-client-port N -etcd-peer-port M -seed FILE
//
// With -seed, the process writes the records of FILE straight into etcd and
// exits without starting kube-apiserver: a benchmark puts 100,000 Services
// in place in seconds, where creating them through the API server takes
// hours (each ClusterIP allocation lists every IPAddress). FILE holds one
// JSON record per line, {"k": etcd key, "v": the object as the API server
// stores it}; lab/kubeapi.Seed writes it.
//
// --etcd-servers is added to the kube-apiserver flags. The process stops on
// SIGTERM or SIGINT (kube-apiserver installs that handler, which is why one
// API server runs per process); etcd stops with it. Reusing the same
// -etcd-dir on a later start keeps every object.
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
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
	seedFile := fs.String("seed", "", "write this file's records into etcd, then exit")
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

	if *seedFile != "" {
		return seed(etcd, *seedFile)
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

// seed puts every record of path into etcd, 128 puts a transaction (etcd's
// default --max-txn-ops), a few transactions in flight.
func seed(etcd *embed.Etcd, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	c := v3client.New(etcd.Server)
	defer c.Close()
	const batch, inflight = 128, 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		slots = make(chan struct{}, inflight)
	)
	put := func(ops []clientv3.Op) {
		defer wg.Done()
		defer func() { <-slots }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			mu.Lock()
			first = cmp.Or(first, err)
			mu.Unlock()
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	var ops []clientv3.Op
	n := 0
	flush := func() {
		if len(ops) == 0 {
			return
		}
		slots <- struct{}{}
		wg.Add(1)
		go put(ops)
		ops = nil
	}
	for sc.Scan() {
		var r struct {
			K string          `json:"k"`
			V json.RawMessage `json:"v"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("%s: record %d: %w", path, n+1, err)
		}
		if r.K == "" || len(r.V) == 0 {
			return fmt.Errorf("%s: record %d: no key or no value", path, n+1)
		}
		ops = append(ops, clientv3.OpPut(r.K, string(r.V)))
		n++
		if len(ops) == batch {
			flush()
		}
	}
	flush()
	wg.Wait()
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if first != nil {
		return fmt.Errorf("etcd put: %w", first)
	}
	fmt.Printf("seeded %d records\n", n)
	return nil
}
