package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/xvs-lb/xvs/model"
)

// stateOf has n ClusterIP ServicePorts, one frontend each, plus
// default/kubernetes when kube is set.
func stateOf(n int, kube bool) *model.State {
	st := &model.State{Services: map[model.ServicePortName]*model.ServicePort{}}
	add := func(ns, name string, i int) {
		pn := model.ServicePortName{Namespace: ns, Name: name, Port: "p", Protocol: model.TCP}
		st.Services[pn] = &model.ServicePort{Name: pn, Frontends: []model.Frontend{{Kind: model.ClusterIP,
			Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}}}
	}
	for i := range n {
		add("apps", fmt.Sprintf("s%d", i), i+2)
	}
	if kube {
		add("default", "kubernetes", 1)
	}
	return st
}

// TestFirstSyncGuard: a restarted agent's first sync that drops most of
// what was programmed, or default/kubernetes, waits for a direct list to
// agree; ordinary first syncs pass without one.
func TestFirstSyncGuard(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		name       string
		st         *model.State
		recovered  int
		proxyName  string
		maxRemoved float64 // 0: the default, a half
		confirm    *model.State
		confirmErr error
		listed     bool // the confirming list is made
		held       bool
	}{
		{name: "fresh node", st: stateOf(0, false), recovered: 0},
		{name: "few programmed", st: stateOf(0, false), recovered: firstSyncGuardMin - 1},
		{name: "same picture", st: stateOf(99, true), recovered: 100},
		{name: "half kept", st: stateOf(49, true), recovered: 100},
		{name: "empty list, confirmed", st: stateOf(0, false), recovered: 100, confirm: stateOf(0, false), listed: true},
		{name: "empty cache, the API has them", st: stateOf(0, false), recovered: 100, confirm: stateOf(99, true), listed: true, held: true},
		{name: "confirming list fails", st: stateOf(0, false), recovered: 100, confirmErr: errors.New("timeout"), listed: true, held: true},
		{name: "no kubernetes Service, the API has it", st: stateOf(99, false), recovered: 100, confirm: stateOf(99, true), listed: true, held: true},
		{name: "no kubernetes Service, confirmed", st: stateOf(99, false), recovered: 100, confirm: stateOf(99, false), listed: true},
		{name: "a proxy name: no kubernetes Service expected", st: stateOf(99, false), recovered: 100, proxyName: "xvs"},
		{name: "a tenth allowed, a fifth removed", st: stateOf(79, true), recovered: 100, maxRemoved: 0.1, confirm: stateOf(79, true), listed: true},
		{name: "a tenth allowed, the API has them", st: stateOf(79, true), recovered: 100, maxRemoved: 0.1, confirm: stateOf(99, true), listed: true, held: true},
		{name: "a tenth allowed, a tenth removed", st: stateOf(89, true), recovered: 100, maxRemoved: 0.1},
		{name: "any share allowed", st: stateOf(0, true), recovered: 100, maxRemoved: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			listed := false
			g := firstSyncGuard{maxRemoved: 0.5, proxyName: c.proxyName}
			if c.maxRemoved != 0 {
				g.maxRemoved = c.maxRemoved
			}
			err := g.check(log, c.st, c.recovered, func() (*model.State, error) {
				listed = true
				return c.confirm, c.confirmErr
			})
			if (err != nil) != c.held || listed != c.listed {
				t.Fatalf("held %v (%v), listed %v; want held %v, listed %v", err != nil, err, listed, c.held, c.listed)
			}
			if err != nil && !strings.Contains(err.Error(), "first sync held") {
				t.Errorf("error %q does not say the sync is held", err)
			}
		})
	}
}
