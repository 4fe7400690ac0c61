package controller

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xvs-lb/xvs/model"
)

// Tracker holds the current Services, EndpointSlices and this node's Node,
// and builds States incrementally, like kube-proxy's ServiceChangeTracker
// and EndpointsChangeTracker together.
//
// The On* methods have the shape of client-go informer handlers (typed;
// an informer adapter only has to unwrap cache.DeletedFinalStateUnknown)
// and are what the FileSource calls too, so both sources share one path.
// Each returns whether the input really changed: updates that cannot change
// the State (same resourceVersion, or equal in every field the translation
// reads, as for re-read manifests or Node heartbeats) are collapsed.
//
// A Tracker is safe for concurrent use.
type Tracker struct {
	mu  sync.Mutex
	cfg Config

	services map[types.NamespacedName]*Service
	slices   map[types.NamespacedName]*Slice // by slice namespace/name
	// bySvc indexes slices by their kubernetes.io/service-name label (a
	// Service has one or a few: a list costs less than a map).
	bySvc map[types.NamespacedName][]*Slice
	// orphans are slices without that label, reported until they go away.
	orphans map[types.NamespacedName]Problem
	node    *v1.Node
	// cidrObjs are the ServiceCIDR objects' ranges by name, and
	// serviceCIDRs the effective ranges (servicecidr.go); cidrsChanged
	// says the next Build must write them.
	cidrObjs     map[string][]netip.Prefix
	cidrProblems map[string][]Problem
	serviceCIDRs []netip.Prefix
	cidrsChanged bool

	// dirty Services are recomputed by the next Build; full recomputes the
	// node view and every Service.
	dirty map[types.NamespacedName]bool
	full  bool

	env         *env
	envProblems []Problem
	built       map[types.NamespacedName]builtService
	// faulty names the built Services that have problems, so that
	// listing them does not walk every Service.
	faulty map[types.NamespacedName]bool
	state  *model.State

	// Frontend collisions (collision.go): every port's claims, the ports
	// as translated (raw) and as served (without the frontends they
	// lose), and the Problems of contested frontends.
	claims    claims
	raw       map[model.ServicePortName]*model.ServicePort
	served    map[model.ServicePortName]*model.ServicePort
	contested map[frontendKey][]Problem
}

// builtService caches one Service's translation between Builds.
type builtService struct {
	ports    []*model.ServicePort
	problems []Problem
}

// Sync is the outcome of Tracker.Build.
type Sync struct {
	// State is the desired state. *ServicePort values are shared with the
	// previous State whenever they are equal, so a datapath can skip a
	// port whose pointer did not change; this holds for full builds too.
	// Its Services map is valid until the next Build (see Build).
	State *model.State
	// Problems lists every current problem with the input (not only new
	// ones), sorted, so that it always matches what Translate would say.
	Problems []Problem
	// Changed is false when State is the very same *State as the previous
	// Build returned: nothing new to apply (but see Full).
	Changed bool
	// Full is true when every input was re-evaluated: the first Build, a
	// Node change (labels feed topology, addresses feed NodePorts), or
	// ForceFullSync. The caller should then sync the datapath even when
	// Changed is false, and may use it to ask for a full resync.
	Full bool
}

// NewTracker returns an empty Tracker. The configuration is fixed for its
// lifetime: a new configuration means a new Tracker and a full sync.
func NewTracker(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("controller config: %w", err)
	}
	cfg.NodePortAddresses = slices.Clone(cfg.NodePortAddresses)
	cfg.ServiceCIDRs = slices.Clone(cfg.ServiceCIDRs)
	cfg.PodCIDRs = slices.Clone(cfg.PodCIDRs)
	cfg.NodeAddresses = slices.Clone(cfg.NodeAddresses)
	t := &Tracker{
		cfg:          cfg,
		services:     make(map[types.NamespacedName]*Service),
		slices:       make(map[types.NamespacedName]*Slice),
		bySvc:        make(map[types.NamespacedName][]*Slice),
		orphans:      make(map[types.NamespacedName]Problem),
		cidrObjs:     make(map[string][]netip.Prefix),
		cidrProblems: make(map[string][]Problem),
		dirty:        make(map[types.NamespacedName]bool),
		built:        make(map[types.NamespacedName]builtService),
		faulty:       make(map[types.NamespacedName]bool),
		full:         true,
		claims:       claims{},
		raw:          make(map[model.ServicePortName]*model.ServicePort),
		served:       make(map[model.ServicePortName]*model.ServicePort),
		contested:    make(map[frontendKey][]Problem),
	}
	t.recomputeServiceCIDRs()
	return t, nil
}

func (t *Tracker) OnServiceAdd(svc *Service) bool       { return t.upsertService(svc) }
func (t *Tracker) OnServiceUpdate(_, svc *Service) bool { return t.upsertService(svc) }
func (t *Tracker) OnServiceDelete(svc *Service) bool    { return t.deleteService(svc) }
func (t *Tracker) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) bool {
	return t.upsertSlice(NewSlice(s))
}
func (t *Tracker) OnEndpointSliceUpdate(_, s *discoveryv1.EndpointSlice) bool {
	return t.upsertSlice(NewSlice(s))
}
func (t *Tracker) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) bool {
	// Only the name matters: the Tracker unindexes the Slice it holds.
	return t.deleteSlice(&Slice{Meta: Meta{Namespace: s.Namespace, Name: s.Name}})
}

// OnSliceAdd and friends take EndpointSlices already parsed (the
// informers' cache holds Slices: see TrimObject).
func (t *Tracker) OnSliceAdd(s *Slice) bool       { return t.upsertSlice(s) }
func (t *Tracker) OnSliceUpdate(_, s *Slice) bool { return t.upsertSlice(s) }
func (t *Tracker) OnSliceDelete(s *Slice) bool    { return t.deleteSlice(s) }

// OnNodeAdd and friends ignore every Node but ours (cfg.NodeName); with no
// NodeName configured, all Nodes are ignored.
func (t *Tracker) OnNodeAdd(n *v1.Node) bool       { return t.setNode(n) }
func (t *Tracker) OnNodeUpdate(_, n *v1.Node) bool { return t.setNode(n) }
func (t *Tracker) OnNodeDelete(n *v1.Node) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ours(n) || t.node == nil {
		return false
	}
	t.node = nil
	t.full = true
	return true
}

// ForceFullSync makes the next Build re-evaluate everything and report
// Full, e.g. after the datapath failed to apply a State.
func (t *Tracker) ForceFullSync() {
	t.mu.Lock()
	t.full = true
	t.mu.Unlock()
}

// Pending reports whether Build has anything to recompute.
func (t *Tracker) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.full || len(t.dirty) > 0 || t.cidrsChanged
}

func nameOf(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

func (t *Tracker) upsertService(svc *Service) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := svc.Key()
	old := t.services[k]
	t.services[k] = svc // keep the newest resourceVersion even for no-ops
	if old != nil && sameService(old, svc) {
		return false
	}
	t.dirty[k] = true
	return true
}

func (t *Tracker) deleteService(svc *Service) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := svc.Key()
	if _, ok := t.services[k]; !ok {
		return false
	}
	delete(t.services, k)
	t.dirty[k] = true
	return true
}

func (t *Tracker) upsertSlice(s *Slice) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := s.Key()
	old := t.slices[k]
	t.slices[k] = s
	if old != nil && sameSlice(old, s) {
		// Equal labels, so the same Service: just hold the newest object.
		if sk, ok := sliceService(s); ok {
			t.bySvc[sk] = putSlice(t.bySvc[sk], s)
		}
		return false
	}
	if old != nil {
		t.unindexSlice(old)
	}
	t.indexSlice(s)
	return true
}

func (t *Tracker) deleteSlice(s *Slice) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := s.Key()
	old, ok := t.slices[k]
	if !ok {
		return false
	}
	delete(t.slices, k)
	t.unindexSlice(old)
	return true
}

// indexSlice files s under its Service and marks that Service dirty. A
// slice whose label changed is unindexed from the old Service first, so
// both get recomputed.
func (t *Tracker) indexSlice(s *Slice) {
	sk, ok := sliceService(s)
	if !ok {
		t.orphans[s.Key()] = noServiceProblem(s)
		return
	}
	t.bySvc[sk] = putSlice(t.bySvc[sk], s)
	t.dirty[sk] = true
}

func (t *Tracker) unindexSlice(s *Slice) {
	sk, ok := sliceService(s)
	if !ok {
		delete(t.orphans, s.Key())
		return
	}
	rest := slices.DeleteFunc(t.bySvc[sk], func(o *Slice) bool { return o.Name == s.Name })
	if len(rest) == 0 {
		delete(t.bySvc, sk)
	} else {
		t.bySvc[sk] = rest
	}
	t.dirty[sk] = true
}

// putSlice replaces the slice of s's name in list, or adds s.
func putSlice(list []*Slice, s *Slice) []*Slice {
	for i, o := range list {
		if o.Name == s.Name {
			list[i] = s
			return list
		}
	}
	return append(list, s)
}

func (t *Tracker) ours(n *v1.Node) bool {
	return t.cfg.NodeName != "" && n.Name == t.cfg.NodeName
}

func (t *Tracker) setNode(n *v1.Node) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ours(n) {
		return false
	}
	old := t.node
	t.node = n
	if old != nil && sameNode(old, n) {
		return false
	}
	// Labels feed topology and addresses feed NodePorts of every Service:
	// recompute all of them (nftables' needFullSync on node label change).
	t.full = true
	return true
}

// Build brings the State up to date and returns it. Only dirty Services are
// recomputed (all of them after a Node change), and a recomputed port equal
// to its previous version keeps its previous pointer. A changed State is
// numbered and carries what changed (model.Delta); its Services map is the
// previous State's, updated in place, so that a sync that changed one
// Service costs O(1) here, allocates next to nothing, and leaves the
// garbage collector idle. A State's map is therefore valid until the next
// Build.
func (t *Tracker) Build() Sync {
	t.mu.Lock()
	defer t.mu.Unlock()
	full := t.full || t.state == nil
	if !full && len(t.dirty) == 0 && !t.cidrsChanged {
		return Sync{State: t.state, Problems: t.problems()}
	}
	if full {
		t.env, t.envProblems = newEnv(&t.cfg, t.node)
		for k := range t.built {
			t.dirty[k] = true
		}
		for k := range t.services {
			t.dirty[k] = true
		}
	}
	t.env.serviceCIDRs = t.serviceCIDRs
	var changed []model.ServicePortName
	touched := make(map[frontendKey]bool)
	for k := range t.dirty {
		changed = t.rebuild(k, changed, touched)
	}
	changed = t.resolve(changed, touched)
	t.dirty = make(map[types.NamespacedName]bool) // not clear: it costs what the map once held
	t.full = false
	t.cidrsChanged = false

	header := t.env.newState(0)
	header.ServiceCIDRs = slices.Clone(t.serviceCIDRs)
	if t.state != nil && len(changed) == 0 && sameHeader(t.state, header) {
		return Sync{State: t.state, Problems: t.problems(), Full: full}
	}
	st := header
	if t.state == nil {
		n := 0
		for _, b := range t.built {
			n += len(b.ports)
		}
		st.Services = make(map[model.ServicePortName]*model.ServicePort, n)
		for name, sp := range t.served {
			st.Services[name] = sp
		}
		st.Generation = 1
	} else {
		st.Services = t.state.Services
		d := &model.Delta{Since: t.state.Generation, Names: changed, Old: make([]*model.ServicePort, len(changed))}
		for i, name := range changed {
			d.Old[i] = st.Services[name]
			delete(st.Services, name)
		}
		for _, name := range changed {
			if sp := t.served[name]; sp != nil {
				st.Services[name] = sp
			}
		}
		st.Generation = t.state.Generation + 1
		st.Delta = d
	}
	t.state = st
	return Sync{State: t.state, Problems: t.problems(), Changed: true, Full: full}
}

// rebuild recomputes one Service, reusing unchanged ports' pointers, and
// appends to changed the names of its ports that were added, replaced or
// removed.
func (t *Tracker) rebuild(k types.NamespacedName, changed []model.ServicePortName, touched map[frontendKey]bool) []model.ServicePortName {
	old := t.built[k].ports
	for _, sp := range old {
		t.claims.remove(sp, touched)
		delete(t.raw, sp.Name)
	}
	svc := t.services[k]
	if svc == nil {
		delete(t.built, k)
		delete(t.faulty, k)
		for _, sp := range old {
			changed = append(changed, sp.Name)
		}
		return changed
	}
	ports, probs := t.env.service(svc, t.bySvc[k])
	defer func() {
		for _, sp := range t.built[k].ports {
			t.claims.add(sp, svc.Created, touched)
			t.raw[sp.Name] = sp
		}
	}()
	prev := make(map[model.ServicePortName]*model.ServicePort, len(old))
	for _, sp := range old {
		prev[sp.Name] = sp
	}
	for i, sp := range ports {
		if o := prev[sp.Name]; o != nil && reflect.DeepEqual(o, sp) {
			ports[i] = o
		} else {
			changed = append(changed, sp.Name)
		}
		delete(prev, sp.Name)
	}
	for name := range prev {
		changed = append(changed, name)
	}
	t.built[k] = builtService{ports: ports, problems: probs}
	if len(probs) > 0 {
		t.faulty[k] = true
	} else {
		delete(t.faulty, k)
	}
	return changed
}

// resolve brings the served ports up to date with the claims after the
// ports changed and the frontends touched: every port whose translation
// changed, and every claimant of a touched frontend, is served again, and
// those whose served form changed join changed.
func (t *Tracker) resolve(changed []model.ServicePortName, touched map[frontendKey]bool) []model.ServicePortName {
	again := make(map[model.ServicePortName]bool, len(changed))
	for _, name := range changed {
		again[name] = true
	}
	for k := range touched {
		for _, cl := range t.claims[k] {
			if !again[cl.name] {
				again[cl.name] = true
				changed = append(changed, cl.name) // taken out again below if its served form is the same
			}
		}
		if p := t.claims.problems(k); len(p) > 0 {
			t.contested[k] = p
		} else {
			delete(t.contested, k)
		}
	}
	out := changed[:0]
	for _, name := range changed {
		old, had := t.served[name]
		sp := t.claims.served(t.raw[name])
		switch {
		case sp == nil:
			delete(t.served, name)
		case had && old != sp && reflect.DeepEqual(old, sp):
			sp = old // keep the pointer: the port did not change
		default:
			t.served[name] = sp
		}
		if sp != old {
			out = append(out, name)
		}
	}
	return out
}

func (t *Tracker) problems() []Problem {
	out := slices.Clone(t.envProblems)
	for _, ps := range t.contested {
		out = append(out, ps...)
	}
	for _, ps := range t.cidrProblems {
		out = append(out, ps...)
	}
	for _, p := range t.orphans {
		out = append(out, p)
	}
	for k := range t.faulty {
		out = append(out, t.built[k].problems...)
	}
	sortProblems(out)
	return out
}

// sameHeader reports whether two States agree on every node-wide field.
func sameHeader(a, b *model.State) bool {
	return a.MasqueradeAll == b.MasqueradeAll && reflect.DeepEqual(a.Node, b.Node) &&
		slices.Equal(a.ServiceCIDRs, b.ServiceCIDRs) && slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

// sameService reports whether two versions of a Service translate alike.
// An equal non-empty resourceVersion settles it (informer resyncs); else
// the fields the translation reads are compared, so that re-read manifests
// and status-only updates are no-ops. equality.Semantic treats nil and
// empty slices and maps as equal, as the API does.
func sameService(a, b *Service) bool {
	if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
		return true
	}
	for _, k := range []string{AnnotationScheduler, AnnotationWeights} {
		va, okA := a.Annotations[k]
		vb, okB := b.Annotations[k]
		if va != vb || okA != okB {
			return false
		}
	}
	return equality.Semantic.DeepEqual(a.Labels, b.Labels) &&
		equality.Semantic.DeepEqual(a.Spec, b.Spec) &&
		a.Created.Equal(b.Created) &&
		equality.Semantic.DeepEqual(a.LoadBalancer, b.LoadBalancer)
}

func sameSlice(a, b *Slice) bool {
	if a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion {
		return true
	}
	return a.AddressType == b.AddressType &&
		a.Service == b.Service && equality.Semantic.DeepEqual(a.Labels, b.Labels) &&
		reflect.DeepEqual(a.Endpoints, b.Endpoints) && // parsed by NewSlice: no nil/empty ambiguity
		reflect.DeepEqual(a.Ports, b.Ports) &&
		slices.Equal(a.Reasons, b.Reasons)
}

// sameNode compares only labels and addresses: Node status heartbeats
// change the resourceVersion every few seconds and must not cause syncs.
func sameNode(a, b *v1.Node) bool {
	return equality.Semantic.DeepEqual(a.Labels, b.Labels) &&
		equality.Semantic.DeepEqual(a.Status.Addresses, b.Status.Addresses)
}
