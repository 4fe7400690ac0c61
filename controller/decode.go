package controller

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifestDecoder decodes with the real API machinery, so apiVersion and
// kind are checked exactly as the API server would, and typed structs are
// filled by the same JSON rules. The scheme holds core/v1,
// discovery.k8s.io/v1 and networking.k8s.io/v1 only: other known kinds
// (ConfigMap, Pod, NetworkPolicy) decode and
// are reported as unsupported, and unknown ones (Deployment, CRDs) fail
// with a not-registered error, which we report the same way. Strict mode
// turns unknown or duplicate fields into warnings, like kubectl's field
// validation, so a typo such as "clusterIp" does not go unnoticed.
var manifestDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	if err := errors.Join(v1.AddToScheme(s), discoveryv1.AddToScheme(s), networkingv1.AddToScheme(s)); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// objectKey identifies a manifest object across files and reloads.
type objectKey struct {
	kind string // "Service", "EndpointSlice", "Node" or "ServiceCIDR"
	types.NamespacedName
}

// manifestObject is one decoded object and where it was found.
type manifestObject struct {
	key  objectKey
	file string
	doc  int
	// obj is what the informers would cache (TrimObject): a *v1.Service,
	// a *Slice, a *v1.Node or a *networkingv1.ServiceCIDR.
	obj any
}

// decodeManifests decodes every YAML (or JSON) document of one file, what
// `kubectl apply -f` accepts: multi-document streams and `kind: List`.
// Documents that cannot be used are reported and skipped. incomplete is
// set when some document could not be identified (bad syntax, no kind, no
// name): it might be an object the file defined before, which the caller
// then keeps rather than deleting it because of a typo.
func decodeManifests(file string, data []byte) (objs []manifestObject, probs []Problem, incomplete bool) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			probs = append(probs, Problem{Kind: "File", File: file, Doc: doc, Reason: fmt.Sprintf("read: %v", err)})
			return objs, probs, true
		}
		d := docDecoder{file: file, doc: doc}
		d.decode(raw, "")
		objs = append(objs, d.objs...)
		probs = append(probs, d.probs...)
		incomplete = incomplete || d.incomplete
	}
	return objs, probs, incomplete
}

// docDecoder collects the outcome of decoding one YAML document.
type docDecoder struct {
	file       string
	doc        int
	objs       []manifestObject
	probs      []Problem
	incomplete bool
}

func (d *docDecoder) report(kind, object, format string, args ...any) {
	d.probs = append(d.probs, Problem{Kind: kind, Object: object, File: d.file, Doc: d.doc, Reason: fmt.Sprintf(format, args...)})
}

// decode decodes one document, or one item of a List (where says which).
func (d *docDecoder) decode(raw []byte, where string) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		d.report("", "", "%snot valid YAML: %v: skipped", where, err)
		d.incomplete = true
		return
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return // empty document, e.g. after a trailing "---"
	}
	obj, gvk, err := manifestDecoder.Decode(js, nil, nil)
	var warning error
	switch {
	case err == nil:
	case runtime.IsStrictDecodingError(err) && obj != nil:
		// Usable: unknown fields are dropped, as the API server does.
		warning = err
	case runtime.IsNotRegisteredError(err):
		d.report(gvkKind(gvk), docName(js), "%sunsupported kind %s: ignored", where, gvkString(gvk))
		return
	case runtime.IsMissingKind(err), runtime.IsMissingVersion(err):
		d.report("", docName(js), "%smissing kind or apiVersion: skipped", where)
		d.incomplete = true
		return
	default:
		d.report(gvkKind(gvk), docName(js), "%s%v: skipped", where, err)
		d.incomplete = true
		return
	}
	name := d.add(obj, gvk, where)
	if warning != nil {
		d.report(gvkKind(gvk), name, "%s%v (ignored)", where, warning)
	}
}

// add files a decoded object, expanding Lists, and returns its name for
// problem reports.
func (d *docDecoder) add(obj runtime.Object, gvk *schema.GroupVersionKind, where string) string {
	var kind string
	switch o := obj.(type) {
	case *v1.List:
		for i, item := range o.Items {
			d.decode(item.Raw, fmt.Sprintf("%sitems[%d]: ", where, i))
		}
		return ""
	case *v1.Service:
		kind = "Service"
	case *discoveryv1.EndpointSlice:
		kind = "EndpointSlice"
	case *v1.Node:
		kind = "Node"
	case *networkingv1.ServiceCIDR:
		kind = "ServiceCIDR"
	default:
		d.report(gvkKind(gvk), objectName(obj), "%sunsupported kind %s: ignored", where, gvkString(gvk))
		return ""
	}
	m := obj.(metav1.Object)
	if m.GetName() == "" {
		d.report(kind, "", "%smissing metadata.name: skipped", where)
		d.incomplete = true
		return ""
	}
	if kind == "Node" || kind == "ServiceCIDR" {
		m.SetNamespace("") // cluster-scoped
	} else if m.GetNamespace() == "" {
		m.SetNamespace(metav1.NamespaceDefault) // as kubectl apply does
	}
	// A resourceVersion copied from `kubectl get -o yaml` would make the
	// Tracker take an edited manifest for a no-op: it is meaningless here.
	m.SetResourceVersion("")
	key := objectKey{kind: kind, NamespacedName: nameOf(m)}
	applyAPIDefaults(obj)
	cached, _ := TrimObject(obj) // never fails
	d.objs = append(d.objs, manifestObject{key: key, file: d.file, doc: d.doc, obj: cached})
	return objectString(key)
}

// docName extracts metadata.namespace/name from a document the scheme
// could not decode, to say which object a problem is about.
func docName(js []byte) string {
	var doc struct {
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if json.Unmarshal(js, &doc) != nil || doc.Metadata.Name == "" {
		return ""
	}
	if doc.Metadata.Namespace == "" {
		return doc.Metadata.Name
	}
	return doc.Metadata.Namespace + "/" + doc.Metadata.Name
}

func objectName(obj runtime.Object) string {
	m, ok := obj.(metav1.Object)
	if !ok || m.GetName() == "" {
		return ""
	}
	if m.GetNamespace() == "" {
		return m.GetName()
	}
	return m.GetNamespace() + "/" + m.GetName()
}

func gvkKind(gvk *schema.GroupVersionKind) string {
	if gvk == nil {
		return ""
	}
	return gvk.Kind
}

func gvkString(gvk *schema.GroupVersionKind) string {
	if gvk == nil {
		return "(unknown)"
	}
	return gvk.GroupVersion().String() + " " + gvk.Kind
}
