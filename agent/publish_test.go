package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// TestServicesFile: the agent publishes what owns each frontend and each
// endpoint's state; xvs list's reading names a snapshot's frontends
// (a shared frontend after the first port in name order, as the datapaths
// give it), its backends' states and its connections; a frontend nobody
// owns stays unnamed; the writer removes the file when the agent stops.
func TestServicesFile(t *testing.T) {
	vip, lb := netip.MustParseAddr("10.96.0.20"), netip.MustParseAddr("192.0.2.20")
	ep := func(a string, ready, serving, terminating bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(a), Port: 8080, Ready: ready, Serving: serving, Terminating: terminating}
	}
	web := &model.ServicePort{
		Name: model.ServicePortName{Namespace: "shop", Name: "web", Port: "http", Protocol: model.TCP},
		Frontends: []model.Frontend{{Kind: model.ClusterIP, Addr: vip, Port: 80, Proto: model.TCP},
			{Kind: model.LoadBalancer, Addr: lb, Port: 80, Proto: model.TCP}},
		ClusterEndpoints: []model.Endpoint{ep("10.244.1.5", true, true, false), ep("10.244.2.7", false, true, true)},
		LocalEndpoints:   []model.Endpoint{ep("10.244.1.5", true, true, false)},
	}
	// Claims the same LoadBalancer address: it sorts after shop/web.
	other := &model.ServicePort{
		Name:             model.ServicePortName{Namespace: "zoo", Name: "lb", Protocol: model.TCP},
		Frontends:        []model.Frontend{{Kind: model.LoadBalancer, Addr: lb, Port: 80, Proto: model.TCP}},
		ClusterEndpoints: []model.Endpoint{ep("10.244.3.3", false, false, true)},
	}
	path := filepath.Join(t.TempDir(), "services.json")
	pub := newServicesPublisher(slog.Default(), path)
	s := stateSummary{pub: pub}
	s.update(&model.State{Generation: 1, Services: map[model.ServicePortName]*model.ServicePort{web.Name: web, other.Name: other}})
	if err := pub.write(); err != nil {
		t.Fatal(err)
	}
	f, err := ReadServicesFile(path)
	if err != nil || f == nil || len(f.Ports) != 2 || f.Ports[0].Name != "web" {
		t.Fatalf("read back: %+v %v", f, err)
	}

	snap := &maps.Snapshot{Services: []maps.ServiceView{
		{Protocol: "TCP", Address: netip.AddrPortFrom(vip, 80), Backends: []maps.BackendView{
			{Address: netip.MustParseAddrPort("10.244.1.5:8080")}, {Address: netip.MustParseAddrPort("10.244.2.7:8080")}}},
		{Protocol: "TCP", Address: netip.AddrPortFrom(lb, 80), Backends: []maps.BackendView{{Address: netip.MustParseAddrPort("10.244.1.5:8080")}}},
		{Protocol: "UDP", Address: netip.AddrPortFrom(vip, 80)},
	}}
	f.Annotate(snap)
	got := func(i int) string {
		if snap.Services[i].Service == nil {
			return "<none>"
		}
		r := snap.Services[i].Service
		return r.String() + " " + r.Kind
	}
	if got(0) != "shop/web:http ClusterIP" || got(1) != "shop/web:http LoadBalancer" || got(2) != "<none>" {
		t.Errorf("frontends named %q, %q, %q", got(0), got(1), got(2))
	}
	if b := snap.Services[0].Backends; b[0].State != "ready" || b[1].State != "serving-terminating" {
		t.Errorf("backend states %q %q", b[0].State, b[1].State)
	}
	cs := []maps.Connection{{Protocol: "TCP", Virtual: netip.AddrPortFrom(lb, 80)}, {Protocol: "TCP", Virtual: netip.AddrPortFrom(lb, 81)}}
	f.AnnotateConnections(cs)
	if cs[0].Service == nil || cs[0].Service.String() != "shop/web:http" || cs[1].Service != nil {
		t.Errorf("connections named %v, %v", cs[0].Service, cs[1].Service)
	}

	// shop/web goes (through a delta): zoo/lb owns the address now.
	s.update(&model.State{Generation: 2, Services: map[model.ServicePortName]*model.ServicePort{other.Name: other},
		Delta: &model.Delta{Since: 1, Names: []model.ServicePortName{web.Name}, Old: []*model.ServicePort{web}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { pub.run(ctx, 10*time.Millisecond); close(done) }()
	pub.changed()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if f, err = ReadServicesFile(path); err == nil && f != nil && len(f.Ports) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not write the change: %+v %v", f, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.Annotate(snap)
	if got(1) != "zoo/lb LoadBalancer" || snap.Services[1].Backends[0].State != "" || got(0) != "<none>" {
		t.Errorf("after shop/web went: %q, %q, backend state %q", got(0), got(1), snap.Services[1].Backends[0].State)
	}
	if f.Ports[0].Endpoints[0].State != "terminating" {
		t.Errorf("zoo/lb's endpoint: %+v", f.Ports[0].Endpoints)
	}
	cancel()
	<-done
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the file outlives the agent: %v", err)
	}
	if f, err := ReadServicesFile(path); f != nil || err != nil {
		t.Errorf("no file reads as %v, %v; want nil, nil", f, err)
	}
}
