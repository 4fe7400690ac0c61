package agent

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xvs-lb/xvs/config"
	"github.com/xvs-lb/xvs/controller"
)

// eventController is the reportingController of xvs's Events.
const eventController = "xvs"

// kubeClient is the agent's API side: the client, the informer source and
// the Event recorder.
type kubeClient struct {
	log         *slog.Logger
	node        string
	client      kubernetes.Interface
	src         *controller.InformerSource
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	limiter     *eventLimiter
	dropped     prometheus.Counter
}

// The Events client's own rate: Events never spend the informers' share
// of clientConnection.qps, and a storm of them waits here instead.
const eventsQPS, eventsAPIBurst = 5, 10

// restConfig is kube-proxy's choice: --kubeconfig and/or --master when
// given, else the in-cluster service account. clientConnection's QPS,
// burst and content type apply to either.
func restConfig(o *config.Options) (*rest.Config, error) {
	cc := &o.Config.ClientConnection
	var cfg *rest.Config
	var err error
	if cc.Kubeconfig != "" || o.Master != "" {
		cfg, err = clientcmd.BuildConfigFromFlags(o.Master, cc.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			err = fmt.Errorf("%w (outside a cluster, give --kubeconfig, --master or --objects)", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("API client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = cc.QPS, int(cc.Burst)
	cfg.ContentType = cc.ContentType
	cfg.UserAgent = "xvs-agent"
	return cfg, nil
}

func newKubeClient(ctx context.Context, log *slog.Logger, o *config.Options, node string, dropped prometheus.Counter) (*kubeClient, error) {
	cfg, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	k := &kubeClient{log: log, node: node, client: client, limiter: newEventLimiter(EventBurst, EventEvery, EventNodeRate, EventNodeBurst), dropped: dropped}
	ecfg := rest.CopyConfig(cfg)
	ecfg.QPS, ecfg.Burst = eventsQPS, eventsAPIBurst
	eclient, err := kubernetes.NewForConfig(ecfg)
	if err != nil {
		return nil, fmt.Errorf("API client for Events: %w", err)
	}
	// Events go through the events.k8s.io/v1 API, as kube-proxy's do.
	k.broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: eclient.EventsV1()})
	if err := k.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, fmt.Errorf("event recorder: %w", err)
	}
	k.recorder = k.broadcaster.NewRecorder(scheme.Scheme, eventController)
	return k, nil
}

func (k *kubeClient) shutdown() { k.broadcaster.Shutdown() }

// startInformers starts the informer source and waits until the Tracker
// holds every Service, EndpointSlice and this Node (HasSynced).
func (k *kubeClient) startInformers(ctx context.Context, tr *controller.Tracker, resync time.Duration,
	proxyName string, onEvent func(controller.Event)) error {
	k.src = controller.NewInformerSource(k.client, tr, controller.InformerConfig{
		NodeName: k.node, ServiceProxyName: proxyName, ResyncPeriod: resync,
	}, k.log)
	start := time.Now()
	k.log.Info("Waiting for the informer caches to sync")
	if err := k.src.Start(ctx, onEvent); err != nil {
		return err
	}
	k.log.Info("Informer caches synced", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// nodeRef is the Node as Events refer to it (kube-proxy's NodeRef: the
// UID is the name, so no API read is needed).
func (k *kubeClient) nodeRef() *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Node", Name: k.node, UID: types.UID(k.node)}
}

// birthCry records the "Starting" Event on the Node, as kube-proxy does
// when its proxier is up.
func (k *kubeClient) birthCry(mode string) {
	k.recorder.Eventf(k.nodeRef(), nil, v1.EventTypeNormal, "Starting", "StartKubeProxy",
		"Starting xvs (kube-proxy replacement), mode %s.", mode)
}

// record records an Event on obj (key: kind/namespace/name) unless the
// object has used up its share (eventLimiter).
func (k *kubeClient) record(key string, obj runtime.Object, eventType, reason, note string) {
	if !k.limiter.allow(key, time.Now()) {
		k.dropped.Inc()
		return
	}
	k.recorder.Eventf(obj, nil, eventType, reason, "Sync", "%s", truncateNote(note))
}

// nodeEvent is the nodeEvents API sink (datapath fallback Events).
func (k *kubeClient) nodeEvent(eventType, reason, message string) error {
	k.record("Node/"+k.node, k.nodeRef(), eventType, reason, message)
	return nil
}

// serviceEvent records an Event on a Service known to the informers.
func (k *kubeClient) serviceEvent(name types.NamespacedName, eventType, reason, format string, args ...any) {
	if k.src == nil {
		return
	}
	if svc := k.src.Service(name.Namespace, name.Name); svc != nil {
		k.record("Service/"+name.String(), svc, eventType, reason, fmt.Sprintf(format, args...))
	}
}

// problemEvent records a Warning Event on the Service or EndpointSlice a
// Problem is about, so that `kubectl describe` shows why it has no effect.
func (k *kubeClient) problemEvent(p controller.Problem) {
	if k.src == nil {
		return
	}
	ns, name, ok := strings.Cut(p.Object, "/")
	if !ok {
		return
	}
	var obj runtime.Object
	switch p.Kind {
	case "Service":
		if svc := k.src.Service(ns, name); svc != nil {
			obj = svc
		}
	case "EndpointSlice":
		if es := k.src.EndpointSlice(ns, name); es != nil {
			obj = es
		}
	}
	if obj == nil {
		return
	}
	k.record(p.Kind+"/"+p.Object, obj, v1.EventTypeWarning, "XvsInvalidInput", "xvs: "+p.Reason)
}

// truncateNote keeps an Event note within the API's 1 kB limit.
func truncateNote(s string) string {
	const max = 1000
	if len(s) <= max {
		return s
	}
	return s[:max-3] + "..."
}
