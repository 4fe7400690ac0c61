package agent

import (
	"context"
	"fmt"
	"log/slog"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xvs-lb/xvs/controller"
	"github.com/xvs-lb/xvs/model"
)

// A restarted agent's first sync replaces what the pinned maps hold with
// what the informers listed. A list that is valid but wrong (an API server
// answering from an empty watch cache after an etcd restore, an aggregator
// glitch) would remove every Service on every node the DaemonSet reaches.
// So a first sync that would remove more than a share (half by default,
// --first-sync-max-removed) of at least firstSyncGuardMin programmed
// frontends, or that has no default/kubernetes
// Service where every cluster has one, is applied only once a second,
// direct list of the API server (not the informers' cache) gives the same
// picture; otherwise it is held (not ready, retried, counted in
// xvs_first_sync_held_total), and traffic keeps flowing on the maps as
// they are.
const firstSyncGuardMin = 16

func frontendCount(st *model.State) int {
	n := 0
	for _, sp := range st.Services {
		n += len(sp.Frontends)
	}
	return n
}

func hasKubernetesService(st *model.State) bool {
	for name := range st.Services {
		if name.Namespace == metav1.NamespaceDefault && name.Name == "kubernetes" {
			return true
		}
	}
	return false
}

// firstSyncGuard is what makes a first sync suspicious.
type firstSyncGuard struct {
	// maxRemoved is the share of the recovered frontends a first sync
	// may remove without a confirming list.
	maxRemoved float64
	// proxyName is --service-proxy-name: with one, default/kubernetes is
	// not expected.
	proxyName string
}

// suspect says why st would be a suspicious first sync over recovered
// frontends ("" when it is not).
func (g firstSyncGuard) suspect(st *model.State, recovered int) string {
	if recovered < firstSyncGuardMin {
		return ""
	}
	if n := frontendCount(st); n < recovered && float64(recovered-n) > g.maxRemoved*float64(recovered) {
		return fmt.Sprintf("it would remove %d of the %d frontends programmed before the restart (more than --first-sync-max-removed=%v)",
			recovered-n, recovered, g.maxRemoved)
	}
	if g.proxyName == "" && !hasKubernetesService(st) {
		return "it has no default/kubernetes Service"
	}
	return ""
}

// checkFirstSync is the guard's decision: nil to apply st. confirm lists
// the API server again and returns the state that list translates to.
func (g firstSyncGuard) check(log *slog.Logger, st *model.State, recovered int, confirm func() (*model.State, error)) error {
	why := g.suspect(st, recovered)
	if why == "" {
		return nil
	}
	again, err := confirm()
	if err != nil {
		return fmt.Errorf("first sync held (%s), and the confirming list failed: %w", why, err)
	}
	if frontendCount(again) > frontendCount(st) || (hasKubernetesService(again) && !hasKubernetesService(st)) {
		return fmt.Errorf("first sync held: %s, but a direct list of the API server has %d frontends where the informers' has %d",
			why, frontendCount(again), frontendCount(st))
	}
	log.Warn("First sync removes most of what was programmed; a second, direct list of the API server agrees, applying it", "why", why)
	return nil
}

// listState lists Services, EndpointSlices and this Node straight from
// the API server (a quorum read, not the informers' cache) and translates
// them as the Tracker would.
func (k *kubeClient) listState(ctx context.Context, cfg controller.Config) (*model.State, error) {
	svcs, err := k.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slices, err := k.client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var sp []*v1.Service
	for i := range svcs.Items {
		sp = append(sp, &svcs.Items[i])
	}
	var es []*discoveryv1.EndpointSlice
	for i := range slices.Items {
		es = append(es, &slices.Items[i])
	}
	st, _ := controller.Translate(cfg, sp, es, node)
	return st, nil
}
