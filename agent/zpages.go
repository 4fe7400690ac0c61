package agent

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"mime"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	flagzv1beta1 "k8s.io/apiserver/pkg/server/flagz/api/v1beta1"
	statuszv1beta1 "k8s.io/apiserver/pkg/server/statusz/api/v1beta1"
	baseversion "k8s.io/component-base/version"
)

// The z-pages of kube-proxy's metrics server (KEP-4827, KEP-4828): /flagz,
// the command line as parsed, and /statusz, what the process is. Plain
// text by default, for people; with an Accept of
// application/json;as=Flagz;g=config.k8s.io;v=v1beta1 (Statusz for
// /statusz) the v1beta1 object of k8s.io/apiserver's z-page API, for
// tools. The handlers are xvs's own: k8s.io/apiserver's would double the
// binary (its response writers bring the API server's admission and
// tracing along); the objects are the library's.

// zpageWarning heads the text form, as component-base's z-pages do: the
// text is for reading. Its separator is chosen at random per response, as
// there, so that no one parses it.
const zpageWarning = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."

var zpageSeparators = []string{":", ": ", "=", " "}

// zpageStructured says whether r asks for the structured form of kind (and
// in which version), and whether it accepts any form at all: a bare
// application/json is refused, as the API server's z-pages refuse it,
// since the object's version must be chosen by the client.
func zpageStructured(r *http.Request, kind string) (version string, structured, acceptable bool) {
	accept := strings.TrimSpace(r.Header.Get("Accept"))
	if accept == "" {
		return "", false, true
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "text/plain", "text/*", "*/*":
			return "", false, true
		case "application/json":
			if params["as"] == kind && params["g"] == "config.k8s.io" && (params["v"] == "v1beta1" || params["v"] == "v1alpha1") {
				return params["v"], true, true
			}
		}
	}
	return "", false, false
}

// serveZpage writes obj (its TypeMeta set to version) as JSON, or text
// as the text form, or 406.
func serveZpage(w http.ResponseWriter, r *http.Request, kind string, obj func(apiVersion string) any, text func(sep string) string) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	v, structured, ok := zpageStructured(r, kind)
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("406 Not Acceptable: text/plain, or application/json;as=%s;g=config.k8s.io;v=v1beta1", kind), http.StatusNotAcceptable)
	case structured:
		if v == "v1alpha1" {
			w.Header().Set("Warning", `299 - "This version of the `+strings.ToLower(kind)+` endpoint is deprecated. Please use a newer version."`)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(obj("config.k8s.io/" + v))
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, text(zpageSeparators[rand.IntN(len(zpageSeparators))]))
	}
}

// flagValues is what /flagz shows: every flag of fs with its value, given
// or default. Flags annotated "classified" show as CLASSIFIED, as
// component-base's reader does.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		v := f.Value.String()
		if len(f.Annotations["classified"]) > 0 {
			v = "CLASSIFIED"
		}
		out[f.Name] = v
	})
	return out
}

func flagzHandler(fs *pflag.FlagSet) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		flags := flagValues(fs)
		serveZpage(w, r, "Flagz", func(apiVersion string) any {
			return &flagzv1beta1.Flagz{
				TypeMeta:   metav1.TypeMeta{Kind: "Flagz", APIVersion: apiVersion},
				ObjectMeta: metav1.ObjectMeta{Name: componentName},
				Flags:      flags,
			}
		}, func(sep string) string {
			var b strings.Builder
			fmt.Fprintf(&b, "\n%s flagz\n%s\n", componentName, zpageWarning)
			for _, name := range slices.Sorted(maps.Keys(flags)) {
				fmt.Fprintf(&b, "%s%s%s\n", name, sep, flags[name])
			}
			return b.String()
		})
	}
}

// statuszHandler serves /statusz: start time, uptime, Go and binary
// version (xvs's, as stamped into component-base by the build), and the
// metrics server's paths.
func statuszHandler(started time.Time, paths []string) http.HandlerFunc {
	paths = slices.Sorted(slices.Values(paths))
	return func(w http.ResponseWriter, r *http.Request) {
		up := max(0, int64(time.Since(started).Seconds()))
		binary := baseversion.Get().GitVersion
		serveZpage(w, r, "Statusz", func(apiVersion string) any {
			return &statuszv1beta1.Statusz{
				TypeMeta:      metav1.TypeMeta{Kind: "Statusz", APIVersion: apiVersion},
				ObjectMeta:    metav1.ObjectMeta{Name: componentName},
				StartTime:     metav1.Time{Time: started},
				UptimeSeconds: up,
				GoVersion:     runtime.Version(),
				BinaryVersion: binary,
				Paths:         paths,
			}
		}, func(sep string) string {
			var b strings.Builder
			fmt.Fprintf(&b, "\n%s statusz\n%s\n\n", componentName, zpageWarning)
			for _, kv := range [][2]string{
				{"Started", started.Format(time.UnixDate)},
				{"Up", fmt.Sprintf("%d hr %02d min %02d sec", up/3600, up/60%60, up%60)},
				{"Go version", runtime.Version()},
				{"Binary version", binary},
				{"Paths", strings.Join(paths, " ")},
			} {
				fmt.Fprintf(&b, "%s%s %s\n", kv[0], sep, kv[1])
			}
			return b.String()
		})
	}
}
