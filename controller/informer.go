package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// InformerConfig configures an InformerSource.
type InformerConfig struct {
	// NodeName is this node: only its Node object is watched (a field
	// selector, so heartbeats of other Nodes never reach the agent).
	NodeName string
	// ServiceProxyName is KubeProxyConfiguration's serviceProxyName, turned
	// into the informers' label selector as kube-proxy does.
	ServiceProxyName string
	// ResyncPeriod is configSyncPeriod: how often the informers replay
	// their caches to the handlers (0 = never). The Tracker collapses the
	// replays, so they cost a comparison each.
	ResyncPeriod time.Duration
}

// Event says what an InformerSource just passed to its Handler.
type Event struct {
	// Kind is "Service", "EndpointSlice", "Node" or "ServiceCIDR".
	Kind string
	// Changed is the Handler's verdict: false for collapsed no-ops.
	Changed bool
	// Node is this node's object after the event, nil when it was deleted
	// (Kind "Node" only). Node eligibility (/healthz) reads it even when
	// the change does not matter to the translation.
	Node *v1.Node
	// TriggerTime is the EndpointSlice's endpoints.kubernetes.io/
	// last-change-trigger-time annotation, zero when absent (Kind
	// "EndpointSlice" only): the start of network programming latency.
	TriggerTime time.Time
	// AddressType is the EndpointSlice's address family (Kind
	// "EndpointSlice" only), for per-family metrics.
	AddressType discoveryv1.AddressType
}

// InformerSource feeds a Handler from the Kubernetes API through client-go
// shared informers: Services and discovery.k8s.io/v1 EndpointSlices
// selected like kube-proxy selects them, this node's Node, and the
// networking.k8s.io/v1 ServiceCIDRs. It is the API counterpart of
// FileSource; both call the same Handler methods.
type InformerSource struct {
	client kubernetes.Interface
	h      Handler
	cfg    InformerConfig
	log    *slog.Logger

	mu       sync.Mutex // guards onEvent and the informers
	onEvent  func(Event)
	synced   atomic.Bool
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	regs     []cache.ResourceEventHandlerRegistration
}

// NewInformerSource returns a source; nothing is watched until Start.
func NewInformerSource(client kubernetes.Interface, h Handler, cfg InformerConfig, log *slog.Logger) *InformerSource {
	return &InformerSource{client: client, h: h, cfg: cfg, log: log}
}

// ProxyLabelSelector is the label selector kube-proxy puts on its Service
// and EndpointSlice informers: no service.kubernetes.io/headless label,
// and the service.kubernetes.io/service-proxy-name label absent (our
// serviceProxyName empty) or equal to ours. The EndpointSlice controller
// copies Service labels onto slices, so the same selector fits both.
func ProxyLabelSelector(serviceProxyName string) (labels.Selector, error) {
	noHeadless, err := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	var proxy *labels.Requirement
	if serviceProxyName == "" {
		proxy, err = labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	} else {
		proxy, err = labels.NewRequirement(LabelServiceProxyName, selection.Equals, []string{serviceProxyName})
	}
	if err != nil {
		return nil, fmt.Errorf("serviceProxyName %q: %w", serviceProxyName, err)
	}
	return labels.NewSelector().Add(*noHeadless, *proxy), nil
}

// Start starts the informers and returns once every handler has seen the
// initial list of its informer (HasSynced), or when ctx ends (an error).
// onEvent (may be nil) is called after every Handler call made after that
// point; events of the initial lists are not reported, so a caller that
// syncs on events cannot sync a half-listed world. The informers run until
// ctx ends.
func (s *InformerSource) Start(ctx context.Context, onEvent func(Event)) error {
	if s.cfg.NodeName == "" {
		return errors.New("informer source: no node name")
	}
	sel, err := ProxyLabelSelector(s.cfg.ServiceProxyName)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.onEvent = onEvent
	s.mu.Unlock()

	proxied := informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.ResyncPeriod,
		informers.WithTransform(TrimObject),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	ownNode := informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.ResyncPeriod,
		informers.WithTransform(TrimObject),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String()
		}))
	services := proxied.Core().V1().Services().Informer()
	slices := proxied.Discovery().V1().EndpointSlices().Informer()
	s.mu.Lock()
	s.services, s.slices = services, slices
	s.mu.Unlock()
	nodes := ownNode.Core().V1().Nodes().Informer()
	cidrs, err := s.serviceCIDRInformer(ctx)
	if err != nil {
		return err
	}

	for _, add := range []func() (cache.ResourceEventHandlerRegistration, error){
		func() (cache.ResourceEventHandlerRegistration, error) {
			return services.AddEventHandler(s.serviceHandler())
		},
		func() (cache.ResourceEventHandlerRegistration, error) {
			return slices.AddEventHandler(s.sliceHandler())
		},
		func() (cache.ResourceEventHandlerRegistration, error) { return nodes.AddEventHandler(s.nodeHandler()) },
	} {
		reg, err := add()
		if err != nil {
			return fmt.Errorf("informer handler: %w", err)
		}
		s.regs = append(s.regs, reg)
	}
	if cidrs != nil {
		// Not waited for, as kube-proxy does not wait: the ranges only add
		// the unallocated-address DROP, and a ServiceCIDR watch the
		// ClusterRole does not allow must not hold back every Service.
		if _, err := cidrs.informer.AddEventHandler(s.serviceCIDRHandler()); err != nil {
			return fmt.Errorf("informer handler: %w", err)
		}
		cidrs.factory.Start(ctx.Done())
	}
	proxied.Start(ctx.Done())
	ownNode.Start(ctx.Done())

	// A registration's HasSynced is true once its handler has been called
	// for every object of the initial list, which is what matters here:
	// the Tracker must hold the whole world before the first sync.
	synced := make([]cache.InformerSynced, len(s.regs))
	for i, r := range s.regs {
		synced[i] = r.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informer source: caches not synced: %w", context.Cause(ctx))
	}
	s.synced.Store(true)
	return nil
}

// serviceCIDRWatch is the ServiceCIDR informer and its factory.
type serviceCIDRWatch struct {
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
}

// serviceCIDRInformer returns the ServiceCIDR informer, or nil when the API
// server does not serve networking.k8s.io/v1 servicecidrs (before v1.33,
// or with the API disabled): then the configured ranges are all there is,
// which is logged once. A failed watch is logged each time its error
// changes (typically a ClusterRole without servicecidrs).
func (s *InformerSource) serviceCIDRInformer(ctx context.Context) (*serviceCIDRWatch, error) {
	gv := networkingv1.SchemeGroupVersion.String()
	res, err := s.client.Discovery().ServerResourcesForGroupVersion(gv)
	switch {
	case apierrors.IsNotFound(err) || err == nil && !servesResource(res, "servicecidrs"):
		s.log.Info("The API server does not serve ServiceCIDRs; the unallocated service address DROP uses --service-cluster-ip-range only",
			"groupVersion", gv)
		return nil, nil
	case err != nil:
		if ctx.Err() != nil {
			return nil, fmt.Errorf("informer source: %w", context.Cause(ctx))
		}
		// Watch anyway: a discovery hiccup must not turn the ranges off.
		s.log.Warn("Cannot discover ServiceCIDRs; watching them anyway", "err", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.ResyncPeriod, informers.WithTransform(TrimObject))
	inf := f.Networking().V1().ServiceCIDRs().Informer()
	var last string
	var mu sync.Mutex
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		mu.Lock()
		defer mu.Unlock()
		if msg := err.Error(); msg != last {
			last = msg
			s.log.Warn("ServiceCIDR watch failed; retrying (the unallocated service address DROP keeps the ranges it has)", "err", err)
		}
	}); err != nil {
		return nil, fmt.Errorf("ServiceCIDR informer: %w", err)
	}
	return &serviceCIDRWatch{factory: f, informer: inf}, nil
}

func servesResource(res *metav1.APIResourceList, name string) bool {
	if res == nil {
		return false
	}
	for _, r := range res.APIResources {
		if r.Name == name {
			return true
		}
	}
	return false
}

// HasSynced reports whether Start has seen every initial list.
func (s *InformerSource) HasSynced() bool { return s.synced.Load() }

// Service returns the cached Service namespace/name, nil if unknown: the
// object an Event about a bad Service is attached to.
func (s *InformerSource) Service(namespace, name string) *v1.Service {
	s.mu.Lock()
	inf := s.services
	s.mu.Unlock()
	if inf == nil {
		return nil
	}
	o, ok, err := inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	svc, ok := serviceOf(o)
	if !ok {
		return nil
	}
	return &v1.Service{ObjectMeta: svc.ObjectMeta()}
}

// EndpointSlice returns the cached EndpointSlice namespace/name, nil if
// unknown. The cache holds Slices: the object has the identity of the API
// object (name, namespace, UID, resourceVersion: what an Event refers to)
// and no more.
func (s *InformerSource) EndpointSlice(namespace, name string) *discoveryv1.EndpointSlice {
	sl := s.cachedSlice(namespace, name)
	if sl == nil {
		return nil
	}
	return &discoveryv1.EndpointSlice{ObjectMeta: sl.ObjectMeta()}
}

func (s *InformerSource) cachedSlice(namespace, name string) *Slice {
	s.mu.Lock()
	inf := s.slices
	s.mu.Unlock()
	if inf == nil {
		return nil
	}
	o, ok, err := inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	sl, _ := sliceOf(o)
	return sl
}

// serviceOf returns the Service of an informer notification (see cached).
func serviceOf(obj any) (*Service, bool) { return cached(obj, NewService) }

// sliceOf returns the Slice of an informer notification (see cached).
func sliceOf(obj any) (*Slice, bool) { return cached(obj, NewSlice) }

// cached returns the object of an informer notification in the form the
// cache keeps (C, which TrimObject made), or made from the API object (A)
// when it did not go through the transform; tombstones are unwrapped.
func cached[C, A any](obj any, conv func(A) C) (C, bool) {
	if c, ok := unwrap[C](obj); ok {
		return c, true
	}
	if a, ok := unwrap[A](obj); ok {
		return conv(a), true
	}
	var none C
	return none, false
}

func (s *InformerSource) emit(ev Event) {
	if !s.synced.Load() {
		return
	}
	s.mu.Lock()
	f := s.onEvent
	s.mu.Unlock()
	if f != nil {
		f(ev)
	}
}

// unwrap returns the object of a delete notification: the object itself,
// or the last known state inside a DeletedFinalStateUnknown tombstone (the
// watch missed the delete and a relist found the object gone).
func unwrap[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	o, ok := obj.(T)
	return o, ok
}

func (s *InformerSource) unexpected(what string, obj any) {
	s.log.Error("Unexpected object from informer; ignored", "informer", what, "type", fmt.Sprintf("%T", obj))
}

// typedHandler adapts a kind's typed On* methods to an informer handler:
// notifications are made T by of (tombstones unwrapped), and each call is
// reported as the Event ev makes of the object after it (nil-valued
// after a delete) and the Handler's verdict.
func typedHandler[T comparable](s *InformerSource, kind string, of func(any) (T, bool), add func(T) bool,
	update func(old, o T) bool, del func(T) bool, ev func(o T, changed bool) Event) cache.ResourceEventHandler {
	var none T
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := of(obj); ok {
				s.emit(ev(o, add(o)))
			} else {
				s.unexpected(kind, obj)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := of(oldObj)
			o, ok2 := of(obj)
			if !ok1 || !ok2 {
				s.unexpected(kind, obj)
				return
			}
			s.emit(ev(o, update(old, o)))
		},
		DeleteFunc: func(obj any) {
			if o, ok := of(obj); ok {
				s.emit(ev(none, del(o)))
			} else {
				s.unexpected(kind, obj)
			}
		},
	}
}

func (s *InformerSource) serviceHandler() cache.ResourceEventHandler {
	return typedHandler(s, "Service", serviceOf, s.h.OnServiceAdd, s.h.OnServiceUpdate, s.h.OnServiceDelete,
		func(_ *Service, changed bool) Event { return Event{Kind: "Service", Changed: changed} })
}

func (s *InformerSource) nodeHandler() cache.ResourceEventHandler {
	return typedHandler(s, "Node", unwrap[*v1.Node], s.h.OnNodeAdd, s.h.OnNodeUpdate, s.h.OnNodeDelete,
		func(n *v1.Node, changed bool) Event { return Event{Kind: "Node", Changed: changed, Node: n} })
}

func (s *InformerSource) serviceCIDRHandler() cache.ResourceEventHandler {
	return typedHandler(s, "ServiceCIDR", unwrap[*networkingv1.ServiceCIDR], s.h.OnServiceCIDRAdd, s.h.OnServiceCIDRUpdate, s.h.OnServiceCIDRDelete,
		func(_ *networkingv1.ServiceCIDR, changed bool) Event {
			return Event{Kind: "ServiceCIDR", Changed: changed}
		})
}

func (s *InformerSource) sliceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if es, ok := sliceOf(obj); ok {
				s.emit(Event{Kind: "EndpointSlice", Changed: s.h.OnSliceAdd(es), TriggerTime: es.TriggerTime, AddressType: es.AddressType})
			} else {
				s.unexpected("EndpointSlice", obj)
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := sliceOf(oldObj)
			es, ok2 := sliceOf(obj)
			if !ok1 || !ok2 {
				s.unexpected("EndpointSlice", obj)
				return
			}
			s.emit(Event{Kind: "EndpointSlice", Changed: s.h.OnSliceUpdate(old, es), TriggerTime: es.TriggerTime,
				AddressType: es.AddressType})
		},
		DeleteFunc: func(obj any) {
			if es, ok := sliceOf(obj); ok {
				// No trigger time: the annotation describes the last
				// update, not the deletion.
				s.emit(Event{Kind: "EndpointSlice", Changed: s.h.OnSliceDelete(es), AddressType: es.AddressType})
			} else {
				s.unexpected("EndpointSlice", obj)
			}
		},
	}
}

// triggerTime reads the EndpointSlice controller's
// endpoints.kubernetes.io/last-change-trigger-time annotation (RFC 3339):
// when the Pod or Service change that produced this slice happened.
func triggerTime(annotations map[string]string) time.Time {
	v, ok := annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// TrimObject is the informers' transform: before an object enters the
// cache it drops what the proxy never reads, so that the cache of a large
// cluster costs a fraction of the objects' size. Services become Services
// (object.go) and EndpointSlices Slices (slice.go): what the translation
// reads, at about half and a quarter of the API objects' size. Gone from
// Nodes and ServiceCIDRs are managedFields (often larger than the object
// itself), annotations (kubectl's last-applied-configuration copies the
// whole object), and the Node's status beyond its addresses. It changes
// the object in place, as client-go allows, and passes anything else
// through (a tombstone, an object already transformed).
func TrimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		return NewService(o), nil
	case *discoveryv1.EndpointSlice:
		return NewSlice(o), nil
	case *v1.Node:
		o.ManagedFields = nil
		o.Annotations = nil
		o.Status = v1.NodeStatus{Addresses: o.Status.Addresses}
	case *networkingv1.ServiceCIDR:
		o.ManagedFields = nil
		o.Annotations = nil
		o.Status = networkingv1.ServiceCIDRStatus{}
	}
	return obj, nil
}

func keepAnnotations(a map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := a[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}
