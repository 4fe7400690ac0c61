package controller

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Handler receives object events. *Tracker implements it; client-go
// informer handlers call the same methods, so manifests and the API server
// go through one code path. Each method reports whether the input changed.
type Handler interface {
	// OnServiceAdd and friends take Services as both sources keep them
	// (see TrimObject).
	OnServiceAdd(svc *Service) bool
	OnServiceUpdate(old, svc *Service) bool
	OnServiceDelete(svc *Service) bool
	OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) bool
	OnEndpointSliceUpdate(old, s *discoveryv1.EndpointSlice) bool
	OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) bool
	// OnSliceAdd and friends take EndpointSlices already parsed: both
	// sources keep them as Slices (see TrimObject).
	OnSliceAdd(s *Slice) bool
	OnSliceUpdate(old, s *Slice) bool
	OnSliceDelete(s *Slice) bool
	OnNodeAdd(n *v1.Node) bool
	OnNodeUpdate(old, n *v1.Node) bool
	OnNodeDelete(n *v1.Node) bool
	OnServiceCIDRAdd(c *networkingv1.ServiceCIDR) bool
	OnServiceCIDRUpdate(old, c *networkingv1.ServiceCIDR) bool
	OnServiceCIDRDelete(c *networkingv1.ServiceCIDR) bool
}

const (
	defaultRescanInterval = time.Minute
	defaultDebounce       = 50 * time.Millisecond
)

// FileSource feeds a Handler from a directory of manifests: every *.yaml,
// *.yml and *.json file in it (not in subdirectories; names starting with
// "." are skipped, which covers editor swap files and the ..data
// directories of a mounted ConfigMap). It lets xvs run without an API
// server: in the lab, in tests, or on a host that is not a cluster node.
//
// The directory is the whole truth: an object present in no file is
// deleted. An object defined twice is taken from the file that sorts last.
// A file that has a document that cannot be identified (bad YAML, no kind,
// no name) keeps the objects it last defined successfully, so a typo being
// typed does not tear a Service down.
type FileSource struct {
	// RescanInterval is how often Run re-reads the directory without any
	// event, a safety net for missed events (network filesystems, a
	// directory replaced underneath the watch). Default 1m.
	RescanInterval time.Duration
	// Debounce is how long Run waits after the first event of a burst
	// (editors write, rename and chmod) before reloading. Default 50ms.
	Debounce time.Duration

	dir string
	h   Handler
	log *slog.Logger

	mu       sync.Mutex // serialises loads
	applied  map[objectKey]manifestObject
	problems []Problem
	// decoded caches each file's decoded objects under a digest of its
	// content, so that a reload (every event, every rescan) decodes only
	// the files that changed: at 100k Services a directory takes tens of
	// seconds of CPU to decode, and milliseconds to read and hash. (File
	// timestamps are too coarse to tell two quick writes apart.)
	decoded map[string]decodedFile
	seed    maphash.Seed
}

// decodedFile is one file's decoded content and the digest of the bytes
// it was decoded from.
type decodedFile struct {
	size       int
	digest     uint64
	objs       []manifestObject
	probs      []Problem
	incomplete bool
}

// NewFileSource returns a source for dir; nothing is read until Load or Run.
func NewFileSource(dir string, h Handler, log *slog.Logger) *FileSource {
	return &FileSource{
		RescanInterval: defaultRescanInterval,
		Debounce:       defaultDebounce,
		dir:            dir,
		h:              h,
		log:            log.With("dir", dir),
		applied:        make(map[objectKey]manifestObject),
		seed:           maphash.MakeSeed(),
	}
}

// Problems returns the manifest problems found by the last load.
func (s *FileSource) Problems() []Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Problem(nil), s.problems...)
}

// Load reads the directory once and applies the differences to the
// Handler. changed reports whether the Handler saw a real change. An
// unreadable directory is an error and changes nothing: a transient error
// must not delete every Service.
func (s *FileSource) Load() (changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, probs, err := s.read()
	if err != nil {
		return false, err
	}
	changed = s.apply(next)
	s.report(probs)
	return changed, nil
}

// Run loads the directory, then watches it and reloads on every change,
// calling notify (if not nil) after each load that changed something. It
// returns when ctx is done, or an error if the directory cannot be watched.
func (s *FileSource) Run(ctx context.Context, notify func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.dir, err)
	}
	defer w.Close()
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("watch %s: %w", s.dir, err)
	}
	reload := func() {
		changed, err := s.Load()
		if err != nil {
			s.log.Error("Cannot read manifests; keeping the current objects", "err", err)
		} else if changed && notify != nil {
			notify()
		}
	}
	reload()

	interval := s.RescanInterval
	if interval <= 0 {
		interval = defaultRescanInterval
	}
	rescan := time.NewTicker(interval)
	defer rescan.Stop()
	// pending fires Debounce after the first event of a burst; later events
	// do not push it back, so a steady trickle of writes still gets loaded.
	var pending <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("fsnotify watcher closed")
			}
			if ev.Op != fsnotify.Chmod && pending == nil {
				pending = time.After(s.Debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("fsnotify watcher closed")
			}
			// Typically an event queue overflow: events were lost.
			s.log.Warn("Watch error; rescanning", "err", err)
			if pending == nil {
				pending = time.After(s.Debounce)
			}
		case <-pending:
			pending = nil
			reload()
		case <-rescan.C:
			// Re-arm the watch in case the directory was removed and
			// recreated; a no-op when it is still watched.
			if err := w.Add(s.dir); err != nil {
				s.log.Debug("Cannot watch manifest directory", "err", err)
			}
			reload()
		}
	}
}

// read decodes every manifest file into the next set of objects.
func (s *FileSource) read() (map[objectKey]manifestObject, []Problem, error) {
	entries, err := os.ReadDir(s.dir) // sorted by name: later files win
	if err != nil {
		return nil, nil, fmt.Errorf("read manifest directory: %w", err)
	}
	next := make(map[objectKey]manifestObject)
	var probs []Problem
	broken := make(map[string]bool) // files with unidentifiable documents
	decoded := make(map[string]decodedFile, len(s.decoded))
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isManifestName(name) {
			continue
		}
		path := filepath.Join(s.dir, name)
		df, err := s.decodeFile(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errIsDir) {
			continue // removed since ReadDir, dangling symlink, or a directory
		}
		if err != nil {
			probs = append(probs, Problem{Kind: "File", File: path, Reason: err.Error()})
			broken[path] = true
			continue
		}
		decoded[path] = df
		objs := df.objs
		probs = append(probs, df.probs...)
		broken[path] = broken[path] || df.incomplete
		for _, o := range objs {
			if prev, dup := next[o.key]; dup {
				probs = append(probs, Problem{Kind: o.key.kind, Object: objectString(o.key), File: o.file, Doc: o.doc,
					Reason: fmt.Sprintf("also defined in %s#%d: this later definition is used", prev.file, prev.doc)})
			}
			next[o.key] = o
		}
	}
	for k, o := range s.applied {
		if _, ok := next[k]; !ok && broken[o.file] {
			next[k] = o
			probs = append(probs, Problem{Kind: k.kind, Object: objectString(k), File: o.file,
				Reason: "file has errors: keeping the object as last loaded"})
		}
	}
	sortProblems(probs)
	s.decoded = decoded
	return next, probs, nil
}

var errIsDir = errors.New("is a directory")

// decodeFile returns path's decoded objects, from the cache when the
// file's content has not changed since it was decoded.
func (s *FileSource) decodeFile(path string) (decodedFile, error) {
	fi, err := os.Stat(path) // follows symlinks, as ConfigMap mounts use
	if err != nil {
		return decodedFile{}, err
	}
	if fi.IsDir() {
		return decodedFile{}, errIsDir
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return decodedFile{}, err
	}
	digest := maphash.Bytes(s.seed, data)
	if df, ok := s.decoded[path]; ok && df.size == len(data) && df.digest == digest {
		return df, nil
	}
	objs, probs, incomplete := decodeManifests(path, data)
	return decodedFile{size: len(data), digest: digest, objs: objs, probs: probs, incomplete: incomplete}, nil
}

func isManifestName(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

func objectString(k objectKey) string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.String()
}

// apply sends the differences between the applied objects and next to the
// Handler: adds, updates (the Handler collapses equal ones), deletes.
func (s *FileSource) apply(next map[objectKey]manifestObject) bool {
	changed := false
	for k, old := range s.applied {
		if _, ok := next[k]; !ok {
			changed = s.dispatch(nil, old.obj) || changed
		}
	}
	for k, o := range next {
		old, ok := s.applied[k]
		switch {
		case !ok:
			changed = s.dispatch(o.obj, nil) || changed
		case old.obj != o.obj:
			changed = s.dispatch(o.obj, old.obj) || changed
		}
	}
	s.applied = next
	return changed
}

// dispatch calls the Handler method for an add (old nil), an update, or a
// delete (obj nil, old is the object deleted).
func (s *FileSource) dispatch(obj, old any) bool {
	switch {
	case old == nil:
		switch o := obj.(type) {
		case *Service:
			return s.h.OnServiceAdd(o)
		case *Slice:
			return s.h.OnSliceAdd(o)
		case *v1.Node:
			return s.h.OnNodeAdd(o)
		case *networkingv1.ServiceCIDR:
			return s.h.OnServiceCIDRAdd(o)
		}
	case obj == nil:
		switch o := old.(type) {
		case *Service:
			return s.h.OnServiceDelete(o)
		case *Slice:
			return s.h.OnSliceDelete(o)
		case *v1.Node:
			return s.h.OnNodeDelete(o)
		case *networkingv1.ServiceCIDR:
			return s.h.OnServiceCIDRDelete(o)
		}
	default:
		switch o := obj.(type) {
		case *Service:
			return s.h.OnServiceUpdate(old.(*Service), o)
		case *Slice:
			return s.h.OnSliceUpdate(old.(*Slice), o)
		case *v1.Node:
			return s.h.OnNodeUpdate(old.(*v1.Node), o)
		case *networkingv1.ServiceCIDR:
			return s.h.OnServiceCIDRUpdate(old.(*networkingv1.ServiceCIDR), o)
		}
	}
	return false
}

// report logs the problems that are new since the last load, once each,
// and remembers the current list.
func (s *FileSource) report(probs []Problem) {
	seen := make(map[Problem]bool, len(s.problems))
	for _, p := range s.problems {
		seen[p] = true
	}
	for _, p := range probs {
		if !seen[p] {
			s.log.Warn("Manifest problem", "file", p.File, "doc", p.Doc, "kind", p.Kind, "object", p.Object, "reason", p.Reason)
		}
	}
	s.problems = probs
}
