package controller

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/xvs-lb/xvs/model"
)

const webService = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: http
`

const webSlice = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: ["10.0.0.1"]
  nodeName: node-a
`

const apiList = `{
  "apiVersion": "v1",
  "kind": "List",
  "items": [
    {"apiVersion": "v1", "kind": "Service",
     "metadata": {"name": "api", "namespace": "prod"},
     "spec": {"clusterIPs": ["10.96.0.20"], "ports": [{"name": "http", "port": 80}]}}
  ]
}`

const ourNode = `apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-a
status:
  addresses:
  - type: InternalIP
    address: 192.168.1.10
`

var (
	webPort = model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.TCP}
	apiPort = model.ServicePortName{Namespace: "prod", Name: "api", Port: "http", Protocol: model.TCP}
)

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func removeFile(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// newTestSource returns a FileSource over a fresh directory, its Tracker,
// and the buffer its log goes to.
func newTestSource(t *testing.T) (string, *FileSource, *Tracker, *syncBuffer) {
	t.Helper()
	dir := t.TempDir()
	tr := newTestTracker(t)
	logs := &syncBuffer{}
	return dir, NewFileSource(dir, tr, slog.New(slog.NewTextHandler(logs, nil))), tr, logs
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func mustLoad(t *testing.T, src *FileSource) bool {
	t.Helper()
	changed, err := src.Load()
	if err != nil {
		t.Fatal(err)
	}
	return changed
}

func TestFileSourceLoadsManifests(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "10-web.yaml", "# web\n---\n"+webService+"---\n"+webSlice+"---\n# trailing\n")
	writeFile(t, dir, "20-api.json", apiList)
	writeFile(t, dir, "30-node.yml", ourNode)
	writeFile(t, dir, "README.txt", "kind: nonsense")
	writeFile(t, dir, ".#10-web.yaml", "editor lock file")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}

	if !mustLoad(t, src) {
		t.Error("first load reported no change")
	}
	if p := src.Problems(); len(p) > 0 {
		t.Errorf("problems %q", problemStrings(p))
	}
	res := tr.Build()
	web, api := res.State.Services[webPort], res.State.Services[apiPort]
	if web == nil || api == nil {
		t.Fatalf("services %v", res.State.Services)
	}
	if got := epStrings(web.LocalEndpoints); got != nil {
		t.Errorf("ClusterIP web has a local set %q", got)
	}
	if got := epStrings(web.ClusterEndpoints); !equalStrings(got, []string{"10.0.0.1:8080"}) || !web.ClusterEndpoints[0].Local {
		t.Errorf("web endpoints %+v", web.ClusterEndpoints)
	}
	if res.State.Node.Zone != "zone-a" || len(res.State.Node.Addresses) != 1 {
		t.Errorf("node %+v", res.State.Node)
	}
	if mustLoad(t, src) {
		t.Error("reloading unchanged files reported a change")
	}
}

func TestFileSourceReportsBadManifests(t *testing.T) {
	dir, src, tr, logs := newTestSource(t)
	writeFile(t, dir, "bad-yaml.yaml", "kind: Service\nmetadata: [unclosed\n")
	writeFile(t, dir, "mixed.yaml", `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
---
apiVersion: v1
kind: Service
metadata: {}
spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}
---
metadata: {name: kindless}
---
apiVersion: v1
kind: Service
metadata: {name: typo}
spec: {clusterIP: 10.96.0.12, selectr: {app: x}, ports: [{name: http, port: 80}]}
`)
	writeFile(t, dir, "web.yaml", webService)

	mustLoad(t, src)
	st := tr.Build().State
	if st.Services[webPort] == nil {
		t.Error("good file not loaded")
	}
	if st.Services[model.ServicePortName{Namespace: "default", Name: "typo", Port: "http", Protocol: model.TCP}] == nil {
		t.Error("Service with an unknown field not loaded")
	}
	probs := src.Problems()
	for _, want := range []string{
		"bad-yaml.yaml#1: not valid YAML",
		"mixed.yaml#1: Deployment web: unsupported kind apps/v1 Deployment",
		"mixed.yaml#2: ConfigMap cfg: unsupported kind v1 ConfigMap",
		"mixed.yaml#3: Service: missing metadata.name",
		"mixed.yaml#4: kindless: missing kind or apiVersion",
		`mixed.yaml#5: Service default/typo: strict decoding error: unknown field "spec.selectr"`,
	} {
		if !hasProblem(probs, want) {
			t.Errorf("no problem %q in\n%s", want, strings.Join(problemStrings(probs), "\n"))
		}
	}
	// Problems are logged once, not on every reload.
	mustLoad(t, src)
	if n := strings.Count(logs.String(), "not valid YAML"); n != 1 {
		t.Errorf("problem logged %d times", n)
	}
}

func TestFileSourceFollowsChanges(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "web.yaml", webService+"---\n"+webSlice)
	mustLoad(t, src)
	first := tr.Build().State.Services[webPort]

	writeFile(t, dir, "web.yaml", strings.Replace(webService, "port: 80", "port: 81", 1)+"---\n"+webSlice)
	if !mustLoad(t, src) {
		t.Fatal("edit not seen")
	}
	second := tr.Build().State.Services[webPort]
	if second == first || second.Frontends[0].Port != 81 {
		t.Errorf("frontends after edit %q", feStrings(second.Frontends))
	}

	// Moving the Service to another file is not a change.
	writeFile(t, dir, "other.yaml", strings.Replace(webService, "port: 80", "port: 81", 1))
	writeFile(t, dir, "web.yaml", webSlice)
	if mustLoad(t, src) {
		t.Error("moving an object between files reported a change")
	}

	removeFile(t, dir, "other.yaml")
	removeFile(t, dir, "web.yaml")
	if !mustLoad(t, src) {
		t.Fatal("removal not seen")
	}
	if n := len(tr.Build().State.Services); n != 0 {
		t.Errorf("%d services left after removing the files", n)
	}
}

func TestFileSourceDuplicates(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "a.yaml", webService)
	writeFile(t, dir, "b.yaml", strings.Replace(webService, "10.96.0.10", "10.96.0.99", 1))
	mustLoad(t, src)
	sp := tr.Build().State.Services[webPort]
	if sp.Frontends[0].Addr.String() != "10.96.0.99" {
		t.Errorf("the later file did not win: %q", feStrings(sp.Frontends))
	}
	if !hasProblem(src.Problems(), "a.yaml#1: this later definition is used") {
		t.Errorf("problems %q", problemStrings(src.Problems()))
	}
}

// A file that stops parsing keeps the objects it defined until it is fixed
// (a half-typed edit must not tear a Service down); a removed file does not.
func TestFileSourceKeepsObjectsOfBrokenFile(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	writeFile(t, dir, "web.yaml", webService+"---\n"+webSlice)
	mustLoad(t, src)

	writeFile(t, dir, "web.yaml", webService+"---\n"+"kind: EndpointSlice\nendpoints: [oops\n")
	mustLoad(t, src)
	st := tr.Build().State
	if sp := st.Services[webPort]; sp == nil || !sp.HasEndpoints {
		t.Fatalf("objects of the broken file were dropped: %+v", sp)
	}
	if !hasProblem(src.Problems(), "EndpointSlice default/web-1: file has errors: keeping the object") {
		t.Errorf("problems %q", problemStrings(src.Problems()))
	}

	writeFile(t, dir, "web.yaml", webService)
	mustLoad(t, src)
	if sp := tr.Build().State.Services[webPort]; sp.HasEndpoints || len(src.Problems()) > 0 {
		t.Errorf("fixed file: endpoints %v problems %q", sp.HasEndpoints, problemStrings(src.Problems()))
	}
}

func TestFileSourceRunNotifies(t *testing.T) {
	dir, src, tr, _ := newTestSource(t)
	src.RescanInterval = time.Hour // prove fsnotify does the work
	writeFile(t, dir, "web.yaml", webService)
	notified := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func() { notified <- struct{}{} }) }()

	wait := func(what string, ok func(*model.State) bool) {
		t.Helper()
		deadline := time.After(time.Second)
		for {
			select {
			case <-notified:
				if ok(tr.Build().State) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: no notification within 1s", what)
			}
		}
	}
	wait("initial load", func(st *model.State) bool { return st.Services[webPort] != nil })

	writeFile(t, dir, "api.json", apiList)
	wait("new file", func(st *model.State) bool { return st.Services[apiPort] != nil })

	writeFile(t, dir, "web.yaml", webService+"---\n"+webSlice)
	wait("edited file", func(st *model.State) bool { return st.Services[webPort].HasEndpoints })

	removeFile(t, dir, "web.yaml")
	wait("removed file", func(st *model.State) bool { return st.Services[webPort] == nil })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Second):
		t.Error("Run did not return after cancel")
	}
}

func TestFileSourceMissingDirectory(t *testing.T) {
	src := NewFileSource(filepath.Join(t.TempDir(), "nope"), newTestTracker(t), slog.New(slog.DiscardHandler))
	if _, err := src.Load(); err == nil {
		t.Error("Load: no error for a missing directory")
	}
	if err := src.Run(context.Background(), nil); err == nil {
		t.Error("Run: no error for a missing directory")
	}
}

// TestFileSourceDecodesOnlyChangedFiles: a reload reuses the objects of
// files whose content did not change (the same pointers: nothing goes to
// the Handler), and decodes again a file rewritten at once with content of
// the same size (its timestamps may not change), or replaced by a rename.
func TestFileSourceDecodesOnlyChangedFiles(t *testing.T) {
	dir, src, _, _ := newTestSource(t)
	writeFile(t, dir, "10-web.yaml", webService+"---\n"+webSlice)
	writeFile(t, dir, "20-api.json", apiList)
	mustLoad(t, src)
	objs := func() map[objectKey]any {
		out := map[objectKey]any{}
		for k, o := range src.applied {
			out[k] = o.obj
		}
		return out
	}
	first := objs()
	if changed := mustLoad(t, src); changed {
		t.Error("a reload of unchanged files changed something")
	}
	for k, o := range objs() {
		if first[k] != o {
			t.Errorf("%v decoded again though its file did not change", k)
		}
	}
	// Same size, other content: 10.0.0.1 becomes 10.0.0.2.
	writeFile(t, dir, "10-web.yaml", webService+"---\n"+strings.Replace(webSlice, "10.0.0.1", "10.0.0.2", 1))
	if changed := mustLoad(t, src); !changed {
		t.Error("a rewritten file was not decoded again")
	}
	webKey := objectKey{kind: "EndpointSlice", NamespacedName: types.NamespacedName{Namespace: "default", Name: "web-1"}}
	if sl := src.applied[webKey].obj.(*Slice); sl.Endpoints[0].Addr().String() != "10.0.0.2" {
		t.Errorf("slice after the rewrite: %+v", sl.Endpoints)
	}
	apiKey := objectKey{kind: "Service", NamespacedName: types.NamespacedName{Namespace: "prod", Name: "api"}}
	if src.applied[apiKey].obj != first[apiKey] {
		t.Error("the unchanged file was decoded again")
	}
	// Replaced by a rename, as editors and ConfigMap mounts do.
	tmp := filepath.Join(dir, ".20-api.json.tmp")
	if err := os.WriteFile(tmp, []byte(strings.Replace(apiList, "10.96.0.20", "10.96.0.21", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "20-api.json")); err != nil {
		t.Fatal(err)
	}
	if changed := mustLoad(t, src); !changed {
		t.Error("a file replaced by a rename was not decoded again")
	}
}
