package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
)

// listedSnapshot is a node's listing as a datapath may hand it out, in no
// particular order: two addresses of each family, every protocol, ports
// whose text and numbers sort apart (80 < 8080 < 9, 10.0.0.9 < 10.0.0.10),
// node-wide counters and an orphan slot of one frontend.
func listedSnapshot() *maps.Snapshot {
	sv := func(proto, addr string, backends ...string) maps.ServiceView {
		v := maps.ServiceView{Protocol: proto, Address: netip.MustParseAddrPort(addr), Kind: "ClusterIP", Scheduler: "rr",
			Stats: xbpf.Stats{Conns: 10, PacketsIn: 100, BytesIn: 1000}}
		for _, b := range backends {
			v.Backends = append(v.Backends, maps.BackendView{Address: netip.MustParseAddrPort(b), Weight: 1,
				Stats: xbpf.Stats{Conns: 5, PacketsIn: 50, BytesIn: 500}})
		}
		return v
	}
	return &maps.Snapshot{
		Services: []maps.ServiceView{
			sv("UDP", "[fd00::10]:53", "[fd00:244::2]:53"),
			sv("SCTP", "10.0.0.9:9", "10.244.0.2:9"),
			sv("TCP", "10.0.0.10:8080", "10.244.0.3:8080"),
			sv("UDP", "10.0.0.10:53", "10.244.0.10:53", "10.244.0.9:53"),
			sv("TCP", "[fd00::10]:80", "[fd00:244::2]:80"),
			sv("TCP", "10.0.0.10:80", "10.244.0.12:8080", "10.244.0.3:8080", "10.244.0.3:80"),
			sv("TCP", "10.0.0.9:80", "10.244.0.2:80"),
		},
		Verdicts:  map[string]xbpf.Stats{"forward_new": {PacketsIn: 7}},
		Conntrack: map[string]maps.ConntrackView{"established": {Entries: 2, Capacity: 1024}},
		Orphans:   []string{"TCP 10.0.0.9:80 slot 2: missing"},
	}
}

func frontends(snap *maps.Snapshot) []string {
	var out []string
	for _, s := range snap.Services {
		out = append(out, s.Protocol+" "+s.Address.String())
	}
	return out
}

// TestSnapshotSort: both modes list frontends in ipvsadm's order (libipvs's
// ipvs_cmp_services: IPv4 before IPv6, then the protocol's number, then
// address and port as numbers) and backends by address and port, whatever
// order they were read in.
func TestSnapshotSort(t *testing.T) {
	snap := listedSnapshot()
	snap.Sort()
	want := []string{
		"TCP 10.0.0.9:80", "TCP 10.0.0.10:80", "TCP 10.0.0.10:8080", "UDP 10.0.0.10:53", "SCTP 10.0.0.9:9",
		"TCP [fd00::10]:80", "UDP [fd00::10]:53",
	}
	if got := frontends(snap); !slices.Equal(got, want) {
		t.Errorf("sorted frontends:\n%q\nwant\n%q", got, want)
	}
	for _, s := range snap.Services {
		if !slices.IsSortedFunc(s.Backends, func(a, b maps.BackendView) int { return a.Address.Compare(b.Address) }) {
			t.Errorf("%s %s: backends %v not sorted by address and port", s.Protocol, s.Address, s.Backends)
		}
	}
	var buf bytes.Buffer
	printList(&buf, snap, false)
	if !strings.Contains(buf.String(), "  -> 10.244.0.3:80 ") || strings.Index(buf.String(), "10.244.0.3:80 ") > strings.Index(buf.String(), "10.244.0.3:8080") ||
		strings.Index(buf.String(), "10.244.0.3:8080") > strings.Index(buf.String(), "10.244.0.12:8080") {
		t.Errorf("backends out of order in the listing:\n%s", &buf)
	}
}

// TestListSortFlag: `xvs list --sort`, an ipvsadm habit, is accepted (the
// listing is always sorted); the command goes on to read the datapath.
func TestListSortFlag(t *testing.T) {
	for _, args := range [][]string{{"--sort"}, {"--sort", "--stats"}, {"-c", "--sort"}} {
		err := runList(append(args, "--proxy-mode", "ebpf", "--pin-path", filepath.Join(t.TempDir(), "none")))
		if err == nil || strings.Contains(err.Error(), "flag provided but not defined") || !strings.Contains(err.Error(), "is the agent running") {
			t.Errorf("xvs list %v: %v, want the flags accepted and the missing maps reported", args, err)
		}
	}
}

// TestListServiceFilter: -t, -u and --sctp-service keep the virtual
// servers they name (ADDR alone: every port of the address) in the plain
// listing, --stats (without the node-wide counters, which are no virtual
// server's), -o json and --rate; a filter that names none fails, as
// ipvsadm's "No such service", before anything is printed.
func TestListServiceFilter(t *testing.T) {
	filter := func(proto model.Protocol, v string) maps.ConnectionFilter {
		ap, err := parseFrontend(v)
		if err != nil {
			t.Fatal(err)
		}
		return maps.ConnectionFilter{Protocol: proto, Virtual: ap}
	}
	for _, c := range []struct {
		f    maps.ConnectionFilter
		want []string
	}{
		{maps.ConnectionFilter{}, frontends(listedSnapshot())},
		{filter(model.TCP, "10.0.0.10:80"), []string{"TCP 10.0.0.10:80"}},
		{filter(model.TCP, "10.0.0.10"), []string{"TCP 10.0.0.10:8080", "TCP 10.0.0.10:80"}},
		{filter(model.UDP, "10.0.0.10"), []string{"UDP 10.0.0.10:53"}},
		{filter(model.UDP, "[fd00::10]:53"), []string{"UDP [fd00::10]:53"}},
		{filter(model.TCP, "fd00::10"), []string{"TCP [fd00::10]:80"}},
		{filter(model.SCTP, "10.0.0.9:9"), []string{"SCTP 10.0.0.9:9"}},
	} {
		snap := listedSnapshot()
		if err := selectFrontends(snap, c.f); err != nil {
			t.Errorf("%+v: %v", c.f, err)
			continue
		}
		if got := frontends(snap); !slices.Equal(got, c.want) {
			t.Errorf("%+v kept %q, want %q", c.f, got, c.want)
		}
		if !c.f.Virtual.IsValid() {
			if snap.Verdicts == nil || snap.Conntrack == nil || len(snap.Orphans) != 1 {
				t.Errorf("no filter: the node-wide sections went: %+v", snap)
			}
			continue
		}
		if snap.Verdicts != nil || snap.Conntrack != nil {
			t.Errorf("%+v: the node-wide counters stayed: %v %v", c.f, snap.Verdicts, snap.Conntrack)
		}
		if orphan := slices.Contains(c.want, "TCP 10.0.0.9:80"); orphan != (len(snap.Orphans) == 1) {
			t.Errorf("%+v: orphans %q", c.f, snap.Orphans)
		}
	}

	// The outputs of -t 10.0.0.10:80: text, --stats, json, --rate.
	snap := listedSnapshot()
	if err := selectFrontends(snap, filter(model.TCP, "10.0.0.10:80")); err != nil {
		t.Fatal(err)
	}
	others := []string{"10.0.0.9", "10.0.0.10:8080", ":53", "fd00::10", "SCTP", "forward_new", "Conntrack", "missing"}
	for _, stats := range []bool{false, true} {
		var buf bytes.Buffer
		printList(&buf, snap, stats)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 3+4 || !strings.HasPrefix(lines[3], "TCP  10.0.0.10:80 ") {
			t.Errorf("--stats=%v: want the header and one virtual server with three backends:\n%s", stats, &buf)
		}
		for _, o := range others {
			if strings.Contains(strings.Join(lines[3:], "\n"), o) {
				t.Errorf("--stats=%v: %q listed:\n%s", stats, o, &buf)
			}
		}
	}
	var buf bytes.Buffer
	if err := printStructured(&buf, "json", "xvs.list/v1", snap); err != nil {
		t.Fatal(err)
	}
	var got maps.Snapshot
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil || len(got.Services) != 1 || got.Services[0].Address.String() != "10.0.0.10:80" || got.Verdicts != nil {
		t.Errorf("-o json (%v):\n%s", err, &buf)
	}
	start := time.Now()
	views := rateViews(snap, snap, time.Second)
	for _, output := range []string{"text", "json"} {
		buf.Reset()
		if err := printRates(&buf, output, start, start.Add(time.Second), views); err != nil {
			t.Fatal(err)
		}
		if strings.Count(buf.String(), "10.0.0.10:80") != 1 || strings.Contains(buf.String(), "10.0.0.9") || strings.Contains(buf.String(), ":53") {
			t.Errorf("--rate -o %s: want only TCP 10.0.0.10:80:\n%s", output, &buf)
		}
	}

	for _, f := range []maps.ConnectionFilter{filter(model.TCP, "10.0.0.10:81"), filter(model.UDP, "10.0.0.10:80"),
		filter(model.SCTP, "10.0.0.10"), filter(model.TCP, "10.0.0.11")} {
		snap := listedSnapshot()
		err := selectFrontends(snap, f)
		if err == nil || !strings.Contains(err.Error(), "no such service") || !strings.Contains(err.Error(), f.Protocol.String()+" "+f.Virtual.Addr().String()) {
			t.Errorf("%+v: %v, want no such service, naming it", f, err)
		}
	}
}
