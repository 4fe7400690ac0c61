package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// agentReady bounds how long the agent may take to read the manifests and
// program every Service.
const agentReady = 10 * time.Minute

// writeManifests writes the N Services and their EndpointSlices, as
// kubectl would take them, into one file of dir (replaced by rename).
func writeManifests(dir string, svcs []ruleService) error {
	tmp := filepath.Join(dir, ".services.yaml.tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, s := range svcs {
		fmt.Fprintf(w, `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  type: ClusterIP
  clusterIP: %[3]s
  clusterIPs: [%[3]s]
  ports: [{name: %[4]s, port: %[5]d, targetPort: %[6]d, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-1
  namespace: %[2]s
  labels: {kubernetes.io/service-name: %[1]s}
addressType: IPv4
ports: [{name: %[4]s, port: %[6]d, protocol: TCP}]
endpoints:
`, s.Name, s.Namespace, s.VIP, s.Port, s.VIPPort, trafficPodPort)
		for _, ep := range s.Endpoints {
			fmt.Fprintf(w, "- {addresses: [%s], nodeName: node, conditions: {ready: true}}\n", ep.Addr())
		}
		fmt.Fprintf(w, "---\n")
	}
	err = errors.Join(w.Flush(), f.Close())
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "services.yaml"))
}

// installAgent runs the real `xvs agent` binary in the node namespace, in
// ebpf or ipvs mode, on manifests for the N Services (the file source),
// and waits until the last Service answers. The time returned runs from
// the agent's start to that answer: reading, translating and programming
// everything. Removal stops the agent and runs `xvs cleanup`.
func (w *trafficWorld) installAgent(ctx context.Context, d datapath, n int, bin string) (time.Duration, func() error, error) {
	if bin == "" {
		return 0, nil, errors.New("no xvs binary (-xvs-bin) for the agent datapaths")
	}
	dir := filepath.Join(w.dir, "objects")
	if err := os.RemoveAll(dir); err != nil {
		return 0, nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, nil, err
	}
	if err := writeManifests(dir, trafficServices(n)); err != nil {
		return 0, nil, err
	}
	pin := w.pinRoot + "-agent"
	state := filepath.Join(w.dir, "ipvs-state.json")
	mode := "ebpf"
	if d == dpAgentIPVS {
		mode = "ipvs"
	}
	logPath := filepath.Join(w.dir, "agent-"+mode+".log")
	start := time.Now()
	p, err := lab.StartTied(w.node.NS, logPath, bin, "agent", "--objects", dir, "--hostname-override", "node",
		"--node-ip", trafficNodeIP.String(), "--pin-path", pin, "--proxy-mode", mode, "--ipvs-state-file", state)
	if err != nil {
		return 0, nil, err
	}
	remove := func() error {
		errs := []error{p.Stop(10 * time.Second)}
		if out, err := lab.Run(w.node.NS, bin, "cleanup", "--pin-path", pin, "--ipvs-state-file", state); err != nil {
			errs = append(errs, fmt.Errorf("xvs cleanup: %v: %s", err, out))
		}
		if out, err := lab.Run(w.node.NS, "nft", "flush", "ruleset"); err != nil {
			errs = append(errs, fmt.Errorf("nft flush ruleset: %v: %s", err, out))
		}
		return errors.Join(errs...)
	}
	last := targets(d, n)[n-1]
	deadline := time.Now().Add(agentReady)
	for {
		if ended, aerr := p.Exited(); ended {
			log, _ := os.ReadFile(logPath)
			return 0, nil, errors.Join(fmt.Errorf("agent exited (%v): %s", aerr, tail(string(log), 25)), remove())
		}
		if w.client.Do(func() error { _, err := oneConnection(last, make([]byte, reqSize), make([]byte, 64)); return err }) == nil {
			return time.Since(start), remove, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			log, _ := os.ReadFile(logPath)
			return 0, nil, errors.Join(fmt.Errorf("%s not reachable after %v; agent log: %s", last, agentReady, tail(string(log), 25)), remove())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
