package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	watchapi "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/xvs-lb/xvs/lab/kubeapi"
)

const (
	saNamespace = "kube-system"
	saName      = "xvs"
	saUser      = "system:serviceaccount:kube-system:xvs"
	nodeName    = "node-a"
)

// access is one (verb, group, resource) the agent's identity is asked about.
type access struct {
	verb, group, resource string
	call                  func(ctx context.Context, c kubernetes.Interface) error // the real request
}

func (a access) String() string {
	g := a.group
	if g == "" {
		g = "core"
	}
	return a.verb + " " + g + "/" + a.resource
}

// needed is everything the agent does (informers on Services,
// EndpointSlices, ServiceCIDRs and its Node; the "Starting" Event on its Node in both
// Event APIs), each as the real request.
var needed = []access{
	{"list", "", "services", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"watch", "", "services", func(ctx context.Context, c kubernetes.Interface) error {
		return watch(c.CoreV1().Services("").Watch(ctx, shortWatch()))
	}},
	{"list", "discovery.k8s.io", "endpointslices", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"watch", "discovery.k8s.io", "endpointslices", func(ctx context.Context, c kubernetes.Interface) error {
		return watch(c.DiscoveryV1().EndpointSlices("").Watch(ctx, shortWatch()))
	}},
	{"list", "networking.k8s.io", "servicecidrs", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
		return err
	}},
	{"watch", "networking.k8s.io", "servicecidrs", func(ctx context.Context, c kubernetes.Interface) error {
		return watch(c.NetworkingV1().ServiceCIDRs().Watch(ctx, shortWatch()))
	}},
	{"get", "", "nodes", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err
	}},
	{"list", "", "nodes", func(ctx context.Context, c kubernetes.Interface) error {
		// As the agent's Node informer lists: its own Node by field selector.
		_, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + nodeName})
		return err
	}},
	{"watch", "", "nodes", func(ctx context.Context, c kubernetes.Interface) error {
		o := shortWatch()
		o.FieldSelector = "metadata.name=" + nodeName
		return watch(c.CoreV1().Nodes().Watch(ctx, o))
	}},
	{"create", "", "events", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Events("default").Create(ctx, coreEvent(), metav1.CreateOptions{})
		return err
	}},
	{"patch", "", "events", func(ctx context.Context, c kubernetes.Interface) error {
		// The recorder's repeat of an Event: count and last timestamp.
		p := fmt.Sprintf(`{"count":2,"lastTimestamp":%q}`, time.Now().UTC().Format(time.RFC3339))
		_, err := c.CoreV1().Events("default").Patch(ctx, "xvs-starting", types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}},
	{"create", "events.k8s.io", "events", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.EventsV1().Events("default").Create(ctx, newEvent(), metav1.CreateOptions{})
		return err
	}},
	{"patch", "events.k8s.io", "events", func(ctx context.Context, c kubernetes.Interface) error {
		p := fmt.Sprintf(`{"series":{"count":2,"lastObservedTime":%q}}`, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"))
		_, err := c.EventsV1().Events("default").Patch(ctx, "xvs-starting-v1", types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}},
}

// denied is a representative set of what the agent must not do: write
// what it watches, read what it has no use for (Pods, Secrets,
// ConfigMaps), get single Services (informers never do), escalate.
var denied = []access{
	{"create", "", "services", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "evil"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		return err
	}},
	{"get", "", "services", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	}},
	{"delete", "", "services", func(ctx context.Context, c kubernetes.Interface) error {
		return c.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{})
	}},
	{"list", "", "pods", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"get", "", "secrets", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Secrets("kube-system").Get(ctx, "anything", metav1.GetOptions{})
		return err
	}},
	{"list", "", "secrets", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"list", "", "configmaps", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"update", "", "nodes", func(ctx context.Context, c kubernetes.Interface) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"evil": "yes"}}}
		_, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}},
	{"patch", "", "nodes", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, []byte(`{"metadata":{"labels":{"evil":"yes"}}}`), metav1.PatchOptions{})
		return err
	}},
	{"update", "", "nodes/status", func(ctx context.Context, c kubernetes.Interface) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
		_, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}},
	{"create", "discovery.k8s.io", "endpointslices", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "evil"},
			AddressType: discoveryv1.AddressTypeIPv4,
		}, metav1.CreateOptions{})
		return err
	}},
	{"delete", "discovery.k8s.io", "endpointslices", func(ctx context.Context, c kubernetes.Interface) error {
		return c.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{})
	}},
	{"list", "", "events", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"delete", "events.k8s.io", "events", func(ctx context.Context, c kubernetes.Interface) error {
		return c.EventsV1().Events("default").Delete(ctx, "xvs-starting-v1", metav1.DeleteOptions{})
	}},
	{"list", "", "namespaces", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err
	}},
	{"list", "", "endpoints", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
		return err
	}},
	{"create", "", "serviceaccounts/token", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().ServiceAccounts(saNamespace).CreateToken(ctx, saName, tokenRequest(), metav1.CreateOptions{})
		return err
	}},
	{"create", "rbac.authorization.k8s.io", "clusterrolebindings", func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, escalation(), metav1.CreateOptions{})
		return err
	}},
}

// TestAPIServerRBACLeastPrivilege applies deploy/rbac.yaml for real and
// shows, as the agent's ServiceAccount (impersonated, and with a real
// token from the TokenRequest API), that every request the agent makes
// succeeds, that a representative set of others is forbidden, with the
// same answers from SelfSubjectAccessReview, and that over every resource
// and verb the server knows, the ServiceAccount is allowed exactly the
// needed set beyond what any authenticated user may do.
func TestAPIServerRBACLeastPrivilege(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := kubeapi.StartT(t, kubeapi.Options{})

	objs, err := kubeapi.DecodeManifests(manifests(t)["rbac.yaml"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeapi.Apply(ctx, srv.Config, objs, kubeapi.ApplyOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	// The objects the requests touch, created by the admin.
	if _, err := srv.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tokCfg, err := srv.ServiceAccountToken(ctx, saNamespace, saName)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []struct {
		name string
		cfg  *rest.Config
	}{
		{"impersonated", srv.ServiceAccountConfig(saNamespace, saName)},
		{"token", tokCfg},
	} {
		t.Run(id.name, func(t *testing.T) {
			c := kubernetes.NewForConfigOrDie(id.cfg)
			who, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, selfReview(), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if who.Status.UserInfo.Username != saUser {
				t.Fatalf("identity %q, want %q", who.Status.UserInfo.Username, saUser)
			}
			// Events are created once per identity; clear the previous run's.
			srv.Client.CoreV1().Events("default").Delete(ctx, "xvs-starting", metav1.DeleteOptions{})
			srv.Client.EventsV1().Events("default").Delete(ctx, "xvs-starting-v1", metav1.DeleteOptions{})
			for _, a := range needed {
				if err := a.call(ctx, c); err != nil {
					t.Errorf("%s: %v", a, err)
				}
				if ok := selfAllowed(ctx, t, c, a); !ok {
					t.Errorf("%s: SelfSubjectAccessReview says denied", a)
				}
			}
			for _, a := range denied {
				if err := a.call(ctx, c); !apierrors.IsForbidden(err) {
					t.Errorf("%s: want Forbidden, got %v", a, err)
				}
				if ok := selfAllowed(ctx, t, c, a); ok {
					t.Errorf("%s: SelfSubjectAccessReview says allowed", a)
				}
			}
		})
	}

	t.Run("everything-else", func(t *testing.T) {
		// The server's every resource and verb, asked for xvs and for a
		// ServiceAccount with no binding: the difference is the grant.
		lists, err := srv.Client.Discovery().ServerPreferredResources()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		asked := 0
		for _, l := range lists {
			gv, err := schemaGroup(l.GroupVersion)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range l.APIResources {
				for _, verb := range r.Verbs {
					attrs := authzv1.ResourceAttributes{Verb: verb, Group: gv, Resource: r.Name}
					asked++
					if sar(ctx, t, srv, saUser, saNamespace, attrs) && !sar(ctx, t, srv, "system:serviceaccount:kube-system:nobody", saNamespace, attrs) {
						got = append(got, access{verb: verb, group: gv, resource: r.Name}.String())
					}
				}
			}
		}
		var want []string
		for _, a := range needed {
			want = append(want, a.String())
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("granted beyond any authenticated user:\n got  %v\n want %v", got, want)
		}
		t.Logf("%d (verb, resource) pairs asked; granted to xvs alone: %v", asked, got)
	})
}

func selfAllowed(ctx context.Context, t *testing.T, c kubernetes.Interface, a access) bool {
	t.Helper()
	res, sub, _ := strings.Cut(a.resource, "/")
	r, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
		Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: "default", Verb: a.verb, Group: a.group, Resource: res, Subresource: sub,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectAccessReview %s: %v", a, err)
	}
	return r.Status.Allowed
}

// sar asks, as the admin, whether user (a ServiceAccount, with the groups
// its token carries) may do attrs cluster-wide.
func sar(ctx context.Context, t *testing.T, srv *kubeapi.Server, user, ns string, attrs authzv1.ResourceAttributes) bool {
	t.Helper()
	res, sub, _ := strings.Cut(attrs.Resource, "/")
	attrs.Resource, attrs.Subresource = res, sub
	r, err := srv.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User:               user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &attrs,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %+v: %v", attrs, err)
	}
	return r.Status.Allowed
}

func schemaGroup(groupVersion string) (string, error) {
	gv, err := schema.ParseGroupVersion(groupVersion)
	return gv.Group, err
}

func watch(w watchapi.Interface, err error) error {
	if err != nil {
		return err
	}
	w.Stop()
	return nil
}

func shortWatch() metav1.ListOptions {
	s := int64(1)
	return metav1.ListOptions{TimeoutSeconds: &s}
}

// coreEvent is the "Starting" Event on the Node as kube-proxy records it
// (core/v1, namespace default for a cluster-scoped object).
func coreEvent() *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "xvs-starting", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)},
		Reason:         "Starting",
		Message:        "Starting xvs.",
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "xvs", Host: nodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
}

// newEvent is the same through events.k8s.io/v1 (client-go's new recorder).
func newEvent() *eventsv1.Event {
	return &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "xvs-starting-v1", Namespace: "default"},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: "xvs",
		ReportingInstance:   "xvs-" + nodeName,
		Action:              "StartXVS",
		Reason:              "Starting",
		Regarding:           corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)},
		Note:                "Starting xvs.",
		Type:                corev1.EventTypeNormal,
	}
}

func tokenRequest() *authnv1.TokenRequest {
	exp := int64(600)
	return &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp}}
}

func selfReview() *authnv1.SelfSubjectReview { return &authnv1.SelfSubjectReview{} }

// escalation binds the agent to cluster-admin.
func escalation() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "xvs-escalation"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: saName, Namespace: saNamespace}},
	}
}
