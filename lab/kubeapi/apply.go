package kubeapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// DecodeManifests splits multi-document YAML (or JSON) into objects, as
// `kubectl apply -f` reads a file. Empty documents are skipped; a document
// without apiVersion or kind is an error.
func DecodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("document %d: no apiVersion or kind", i)
		}
		objs = append(objs, u)
	}
}

// ApplyOptions for Apply.
type ApplyOptions struct {
	FieldManager string // required by server-side apply
	DryRun       bool   // DryRun=All: validated, defaulted and admitted, never stored
}

// Apply server-side-applies objs with cfg's identity, in order, resolving
// each kind through the server's discovery (so an unknown kind or version
// is an error, not a skip). It returns what the server answered.
func Apply(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	if opts.FieldManager == "" {
		return nil, errors.New("apply: FieldManager is required")
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ao := metav1.ApplyOptions{FieldManager: opts.FieldManager, Force: true}
	if opts.DryRun {
		ao.DryRun = []string{metav1.DryRunAll}
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		got, err := ri.Apply(ctx, o.GetName(), o, ao)
		if err != nil {
			return out, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
		out = append(out, got)
	}
	return out, nil
}
