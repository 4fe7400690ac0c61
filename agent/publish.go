package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/xvs-lb/xvs/ipvs"
	xmaps "github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// The Services file names what the datapath serves, for `xvs list`: which
// Service port owns each frontend, and the state of each endpoint. The
// maps and the IPVS table hold addresses only; the names live in the
// agent, which publishes them here (in /run/xvs, beside the IPVS mode's
// state file, one file per network namespace). The sync loop keeps the
// published ports current through the States' deltas; a writer writes the
// file at most once a second, off the sync loop, by rename. The agent
// removes the file when it stops: a listing without names says that no
// agent runs.

// ServicesFileSchema names the layout of the file.
const ServicesFileSchema = "xvs.services/v1"

// ServicesFile is the file's content.
type ServicesFile struct {
	SchemaVersion string `json:"schemaVersion"`
	// Written is when the agent wrote it.
	Written time.Time `json:"written"`
	// Ports are the Service ports of the last synced State, in the order
	// model gives conflicting frontends to (namespace, name, port).
	Ports []PublishedPort `json:"ports"`
}

// PublishedPort is one Service port: its frontends and endpoints.
type PublishedPort struct {
	Namespace string              `json:"namespace"`
	Name      string              `json:"name"`
	Port      string              `json:"port"`
	Protocol  string              `json:"protocol"`
	Frontends []PublishedFrontend `json:"frontends"`
	Endpoints []PublishedEndpoint `json:"endpoints"`
}

// PublishedFrontend is an address:port the port is served on, and as what
// (ClusterIP, NodePort, ExternalIP, LoadBalancer).
type PublishedFrontend struct {
	Address netip.AddrPort `json:"address"`
	Kind    string         `json:"kind"`
}

// PublishedEndpoint is an endpoint of the port with its EndpointSlice
// state: ready, serving-terminating or terminating (kube-proxy's terms),
// and whether it is on this node.
type PublishedEndpoint struct {
	Address netip.AddrPort `json:"address"`
	State   string         `json:"state"`
	Local   bool           `json:"local,omitempty"`
}

// EndpointState is e's state in the listing's words.
func EndpointState(e model.Endpoint) string {
	switch {
	case e.Ready:
		return "ready"
	case e.Serving:
		return "serving-terminating"
	case e.Terminating:
		return "terminating"
	}
	return "not-ready"
}

func publishedPort(sp *model.ServicePort) PublishedPort {
	p := PublishedPort{Namespace: sp.Name.Namespace, Name: sp.Name.Name, Port: sp.Name.Port, Protocol: sp.Name.Protocol.String(),
		Frontends: make([]PublishedFrontend, 0, len(sp.Frontends)), Endpoints: []PublishedEndpoint{}}
	for _, f := range sp.Frontends {
		p.Frontends = append(p.Frontends, PublishedFrontend{Address: netip.AddrPortFrom(f.Addr, f.Port), Kind: f.Kind.String()})
	}
	seen := map[netip.AddrPort]bool{}
	for _, set := range [][]model.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, e := range set {
			if a := e.AddrPort(); !seen[a] {
				seen[a] = true
				p.Endpoints = append(p.Endpoints, PublishedEndpoint{Address: a, State: EndpointState(e), Local: e.Local})
			}
		}
	}
	slices.SortFunc(p.Endpoints, func(a, b PublishedEndpoint) int { return a.Address.Compare(b.Address) })
	return p
}

// DefaultServicesFile is the Services file of the caller's network
// namespace: /run/xvs/services-<netns inode>.json.
func DefaultServicesFile() string { return ipvs.NamespaceFile(servicesFilePrefix) }

// servicesFilePrefix is among ipvs.NamespaceFilePrefixes.
const servicesFilePrefix = "services"

// RemoveServicesFile removes a Services file (path "": the namespace's
// default); a missing one is fine.
func RemoveServicesFile(path string) error {
	if path == "" {
		path = DefaultServicesFile()
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// ReadServicesFile reads a Services file (path "": the namespace's
// default). A missing file is (nil, nil): no agent publishes names.
func ReadServicesFile(path string) (*ServicesFile, error) {
	if path == "" {
		path = DefaultServicesFile()
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f ServicesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.SchemaVersion != ServicesFileSchema {
		return nil, fmt.Errorf("%s: layout %q, this xvs reads %q", path, f.SchemaVersion, ServicesFileSchema)
	}
	return &f, nil
}

// Annotate names snap's frontends after the ports that own them and gives
// their backends their endpoint states.
func (f *ServicesFile) Annotate(snap *xmaps.Snapshot) {
	idx := f.index()
	for i := range snap.Services {
		sv := &snap.Services[i]
		p, ref := idx.owner(sv.Protocol, sv.Address)
		sv.Service = ref
		states := map[netip.AddrPort]string{}
		if p != nil {
			for _, e := range p.Endpoints {
				states[e.Address] = e.State
			}
		}
		for _, set := range [][]xmaps.BackendView{sv.Backends, sv.ShortCircuit} {
			for j := range set {
				set[j].State = states[set[j].Address]
			}
		}
	}
}

// AnnotateConnections names the Service port of each connection's
// virtual address.
func (f *ServicesFile) AnnotateConnections(cs []xmaps.Connection) {
	idx := f.index()
	for i := range cs {
		_, cs[i].Service = idx.owner(cs[i].Protocol, cs[i].Virtual)
	}
}

// frontendIndex finds a frontend's owner: the first port in the file's
// order, as both datapaths give a shared frontend to it.
type frontendIndex struct {
	f  *ServicesFile
	at map[frontendAddr]int
}

func (f *ServicesFile) index() frontendIndex {
	idx := frontendIndex{f, map[frontendAddr]int{}}
	for i, p := range f.Ports {
		for _, fe := range p.Frontends {
			k := frontendAddr{p.Protocol, fe.Address}
			if _, taken := idx.at[k]; !taken {
				idx.at[k] = i
			}
		}
	}
	return idx
}

func (idx frontendIndex) owner(proto string, addr netip.AddrPort) (*PublishedPort, *xmaps.ServiceRef) {
	i, ok := idx.at[frontendAddr{proto, addr}]
	if !ok {
		return nil, nil
	}
	p := &idx.f.Ports[i]
	ref := &xmaps.ServiceRef{Namespace: p.Namespace, Name: p.Name, Port: p.Port}
	for _, fe := range p.Frontends {
		if fe.Address == addr {
			ref.Kind = fe.Kind
			break
		}
	}
	return p, ref
}

// writeBudget is how many times the last write's duration the publisher
// waits before the next one.
const writeBudget = 10

// servicesPublisher keeps the published ports and writes the file.
type servicesPublisher struct {
	path string
	log  *slog.Logger

	mu sync.Mutex
	// ports are the synced State's ServicePorts. A State replaces a
	// ServicePort rather than change it (model.State), so the writer
	// reads them outside the lock, and converts each as it writes it: a
	// converted copy of every port is about 1 KB per port of 10
	// endpoints, 110 MB of live heap at 100k Service ports.
	ports map[model.ServicePortName]*model.ServicePort
	dirty bool
	wake  chan struct{}
}

func newServicesPublisher(log *slog.Logger, path string) *servicesPublisher {
	return &servicesPublisher{path: path, log: log, ports: map[model.ServicePortName]*model.ServicePort{}, wake: make(chan struct{}, 1)}
}

// reset forgets every port (before a full recount). The caller holds mu.
func (p *servicesPublisher) reset() { clear(p.ports); p.dirty = true }

// count adds (by = 1) or removes (by = -1) sp. The caller holds mu.
func (p *servicesPublisher) count(sp *model.ServicePort, by int) {
	if by > 0 {
		p.ports[sp.Name] = sp
	} else {
		delete(p.ports, sp.Name)
	}
	p.dirty = true
}

// changed wakes the writer after a sync that changed the ports.
func (p *servicesPublisher) changed() {
	p.mu.Lock()
	dirty := p.dirty
	p.mu.Unlock()
	if dirty {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// run writes the file after each change, at most once per interval, and
// spends at most a tenth of a CPU on it (a write at 100,000 Service ports
// takes most of a second: it waits ten times as long as the last write
// took before the next), until ctx ends; then it removes the file.
func (p *servicesPublisher) run(ctx context.Context, interval time.Duration) {
	defer func() {
		if err := RemoveServicesFile(p.path); err != nil {
			p.log.Warn("Cannot remove the Services file", "file", p.path, "err", err)
		}
	}()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		began := time.Now()
		err := p.write()
		wait := max(interval, writeBudget*time.Since(began))
		switch {
		case err != nil && !failing:
			p.log.Warn("Cannot write the Services file; xvs list shows no Service names", "file", p.path, "err", err)
		case err == nil && failing:
			p.log.Info("Writing the Services file again", "file", p.path)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// write writes the ports as they are now. It encodes them one at a time
// into the file: at 100,000 Service ports the file is about 100 MB, and
// encoding it whole (with the encoder's doubling buffer) cost the agent
// several hundred MB of RSS after every change.
func (p *servicesPublisher) write() (err error) {
	p.mu.Lock()
	names := slices.SortedFunc(maps.Keys(p.ports), model.ServicePortName.Compare)
	ports := make([]*model.ServicePort, 0, len(names))
	for _, n := range names {
		ports = append(ports, p.ports[n])
	}
	p.dirty = false
	p.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(p.path), 0o755); err != nil {
		return err
	}
	tmp := p.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 256<<10)
	schema, _ := json.Marshal(ServicesFileSchema)
	written, _ := time.Now().UTC().MarshalJSON()
	fmt.Fprintf(w, `{"schemaVersion":%s,"written":%s,"ports":[`, schema, written)
	enc := json.NewEncoder(w)
	for i := range ports {
		if i > 0 {
			w.WriteByte(',')
		}
		if err := enc.Encode(publishedPort(ports[i])); err != nil {
			return err
		}
	}
	w.WriteString("]}\n")
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, p.path)
}
