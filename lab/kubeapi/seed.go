package kubeapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// Seed writes objs straight into the etcd data under dir (the Options.Dir
// of a later Start, which must not be running), as the API server stores
// them: JSON under its keys, with a UID and a creation time where the
// object has none and no resourceVersion, and for every ClusterIP of a Service the IPAddress
// object the API server's allocator keeps beside it (so its repair loop
// finds nothing to do). It takes Services and EndpointSlices. The API
// server does not default what it reads back: give the fields it would
// have set on create (ipFamilies, sessionAffinity, ports' protocol, ...).
//
// Creating 100,000 Services through the API server takes hours, because
// each ClusterIP allocation lists every IPAddress to update a metric;
// seeding them takes seconds. It returns how many records were written.
func Seed(ctx context.Context, dir string, objs []runtime.Object) (int, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	path := filepath.Join(dir, "seed.jsonl")
	n, err := writeSeed(path, objs, metav1.NewTime(time.Now()))
	defer os.Remove(path)
	if err != nil {
		return 0, err
	}
	ports, err := pickPorts(2)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, bin,
		"-etcd-dir", filepath.Join(dir, "etcd"),
		"-etcd-client-port", strconv.Itoa(ports[0]),
		"-etcd-peer-port", strconv.Itoa(ports[1]),
		"-seed", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("seed etcd: %w: %s", err, out)
	}
	return n, nil
}

// writeSeed writes the records of objs to path, one JSON line each.
func writeSeed(path string, objs []runtime.Object, now metav1.Time) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w)
	n := 0
	// put stamps obj (its meta) as the API server does on create and
	// writes its record: a UID and a creation time where it has none, and
	// no resourceVersion (the server reads it from etcd's revision).
	put := func(key string, meta *metav1.ObjectMeta, obj any) error {
		if meta.UID == "" {
			meta.UID = uuid.NewUUID()
		}
		if meta.CreationTimestamp.IsZero() {
			meta.CreationTimestamp = now
		}
		meta.ResourceVersion = ""
		n++
		return enc.Encode(struct {
			K string `json:"k"`
			V any    `json:"v"`
		}{key, obj})
	}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *v1.Service:
			s := *o
			s.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
			if err := put("/registry/services/specs/"+s.Namespace+"/"+s.Name, &s.ObjectMeta, &s); err != nil {
				return n, err
			}
			for _, ip := range s.Spec.ClusterIPs {
				a, err := ipAddressOf(&s, ip)
				if err != nil {
					return n, err
				}
				if a == nil {
					continue
				}
				if err := put("/registry/ipaddresses/"+a.Name, &a.ObjectMeta, a); err != nil {
					return n, err
				}
			}
		case *discoveryv1.EndpointSlice:
			s := *o
			s.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
			if err := put("/registry/endpointslices/"+s.Namespace+"/"+s.Name, &s.ObjectMeta, &s); err != nil {
				return n, err
			}
		default:
			return n, fmt.Errorf("seed: %T is not a Service or an EndpointSlice", obj)
		}
	}
	if err := w.Flush(); err != nil {
		return n, err
	}
	return n, f.Close()
}

// ipAddressOf is the IPAddress the API server's allocator creates for one
// ClusterIP of s; nil for a headless Service.
func ipAddressOf(s *v1.Service, ip string) (*networkingv1.IPAddress, error) {
	if ip == "" || ip == v1.ClusterIPNone {
		return nil, nil
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: clusterIP %q: %w", s.Namespace, s.Name, ip, err)
	}
	family := v1.IPv4Protocol
	if addr.Is6() {
		family = v1.IPv6Protocol
	}
	return &networkingv1.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{
			Name: addr.String(),
			Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: string(family),
				// The allocator's name (ipallocator.ControllerName).
				networkingv1.LabelManagedBy: "ipallocator.k8s.io",
			},
		},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{
			Group: "", Resource: "services", Namespace: s.Namespace, Name: s.Name,
		}},
	}, nil
}
