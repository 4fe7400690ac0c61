// Command image writes a container image as a docker-save tarball (the
// format `docker load`, `ctr images import` and `podman load` read) from a
// root filesystem directory and extra files, with no Docker engine and no
// registry. `make image` and the e2e rig (hack/e2e) use it.
//
//	go run ./hack/image -o out.tar -tag NAME:TAG [-rootfs DIR] [-add SRC=DST]... \
//	    [-entrypoint /bin/x,arg] [-env K=V]...
//
// One layer: the rootfs tree, then the -add files (mode kept, owner root).
// Symlinks are kept; device nodes, sockets and FIFOs are skipped.
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var adds, envs multi
	out := flag.String("o", "", "output tarball (required)")
	tag := flag.String("tag", "", "image reference, e.g. ghcr.io/xvs-lb/xvs:v1 (required)")
	rootfs := flag.String("rootfs", "", "root filesystem directory (optional: from scratch)")
	entry := flag.String("entrypoint", "", "entrypoint, comma-separated")
	cmd := flag.String("cmd", "", "cmd, comma-separated")
	flag.Var(&adds, "add", "SRC=DST: add a file (repeatable)")
	flag.Var(&envs, "env", "K=V: environment (repeatable)")
	flag.Parse()
	if *out == "" || !strings.Contains(path.Base(*tag), ":") {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *tag, *rootfs, adds, envs, *entry, *cmd); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// epoch: fixed timestamps, so the same inputs give the same image ID.
var epoch = time.Unix(0, 0).UTC()

func run(out, tag, rootfs string, adds, envs []string, entry, cmd string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	layerPath := filepath.Join(tmp, "layer.tar")
	diffID, err := writeLayer(layerPath, rootfs, adds)
	if err != nil {
		return err
	}
	cfgJSON, err := imageConfig(diffID, envs, entry, cmd)
	if err != nil {
		return err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	err = writeArchive(f, tag, diffID, layerPath, cfgJSON)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}

// imageConfig is the image's configuration JSON: one layer, the
// environment, entrypoint and command, fixed timestamps.
func imageConfig(diffID string, envs []string, entry, cmd string) ([]byte, error) {
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, envs...)
	return json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Env":        env,
			"Entrypoint": split(entry),
			"Cmd":        split(cmd),
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "xvs hack/image"}},
	})
}

// writeArchive writes a `docker save` archive (what `ctr images import`
// reads) to w: the layer, the configuration, manifest.json and
// repositories, tagged tag.
func writeArchive(w io.Writer, tag, diffID, layerPath string, cfgJSON []byte) error {
	sum := sha256.Sum256(cfgJSON)
	cfgName := hex.EncodeToString(sum[:]) + ".json"
	manifest, _ := json.Marshal([]map[string]any{{
		"Config":   cfgName,
		"RepoTags": []string{tag},
		"Layers":   []string{diffID + "/layer.tar"},
	}})
	i := strings.LastIndex(tag, ":")
	repos, _ := json.Marshal(map[string]map[string]string{tag[:i]: {tag[i+1:]: diffID}})

	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: diffID + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
		return err
	}
	lf, err := os.Open(layerPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	st, err := lf.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: diffID + "/layer.tar", Mode: 0o644, Size: st.Size(), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, lf); err != nil {
		return err
	}
	for _, file := range []struct {
		name string
		b    []byte
	}{{cfgName, cfgJSON}, {"manifest.json", manifest}, {"repositories", repos}} {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(file.b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// writeLayer writes the layer tar and returns its sha256 (the diff ID).
func writeLayer(p, rootfs string, adds []string) (string, error) {
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(f, h))
	seen := map[string]bool{}
	if rootfs != "" {
		err := filepath.WalkDir(rootfs, func(full string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(rootfs, full)
			if rel == "." {
				return nil
			}
			seen[rel] = true
			return addPath(tw, full, filepath.ToSlash(rel))
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(adds)
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok {
			return "", fmt.Errorf("-add %q: want SRC=DST", a)
		}
		dst = strings.TrimPrefix(path.Clean("/"+dst), "/")
		// Parent directories the rootfs lacks.
		var parents []string
		for d := path.Dir(dst); d != "." && d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if !seen[d] {
				seen[d] = true
				if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
					return "", err
				}
			}
		}
		if err := addPath(tw, src, dst); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func addPath(tw *tar.Writer, full, name string) error {
	fi, err := os.Lstat(full)
	if err != nil {
		return err
	}
	var link string
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		if link, err = os.Readlink(full); err != nil {
			return err
		}
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return nil // devices, sockets, FIFOs: not in an image
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if fi.Mode().IsRegular() {
		r, err := os.Open(full)
		if err != nil {
			return err
		}
		defer r.Close()
		if _, err := io.Copy(tw, r); err != nil {
			return err
		}
	}
	return nil
}
