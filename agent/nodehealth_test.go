package agent

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/healthcheck"
)

// TestNodeHealthHandler: with the file source, this node's Node decides
// /healthz eligibility as it does with the informers; other Nodes do not.
func TestNodeHealthHandler(t *testing.T) {
	tr, err := controller.NewTracker(controller.Config{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	health := healthcheck.NewProxyHealth(time.Minute, healthcheck.Counters{})
	h := nodeHealthHandler{Handler: tr, health: health, node: "n1"}
	node := func(name string, mod func(*v1.Node)) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if mod != nil {
			mod(n)
		}
		return n
	}
	tainted := func(n *v1.Node) {
		n.Spec.Taints = []v1.Taint{{Key: healthcheck.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	}
	deleting := func(n *v1.Node) { n.DeletionTimestamp = &metav1.Time{Time: time.Now()} }
	steps := []struct {
		what     string
		do       func()
		eligible bool
	}{
		{"clean node", func() { h.OnNodeAdd(node("n1", nil)) }, true},
		{"another node tainted", func() { h.OnNodeAdd(node("n2", tainted)) }, true},
		{"tainted", func() { h.OnNodeUpdate(nil, node("n1", tainted)) }, false},
		{"untainted", func() { h.OnNodeUpdate(nil, node("n1", nil)) }, true},
		{"being deleted", func() { h.OnNodeUpdate(nil, node("n1", deleting)) }, false},
		{"back", func() { h.OnNodeUpdate(nil, node("n1", nil)) }, true},
		{"another node deleted", func() { h.OnNodeDelete(node("n2", nil)) }, true},
		{"deleted", func() { h.OnNodeDelete(node("n1", nil)) }, false},
	}
	for _, s := range steps {
		s.do()
		if got := health.NodeEligible(); got != s.eligible {
			t.Errorf("%s: eligible %v, want %v", s.what, got, s.eligible)
		}
	}
}
