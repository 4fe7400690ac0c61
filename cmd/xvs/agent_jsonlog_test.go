package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xvs-lb/xvs/lab"
	"github.com/xvs-lb/xvs/lab/harness"
)

// jsonLine is one line of component-base's JSON log format, as an
// operator's log pipeline reads it: ts (Unix milliseconds), caller, msg,
// v on an info line (a line without v is an error line), then the
// line's own key/value pairs.
type jsonLine map[string]any

func (l jsonLine) msg() string { s, _ := l["msg"].(string); return s }

// parseJSONLog checks that every line of out is one JSON object with the
// keys every line of the format has, and returns them; a line that is not
// (a klog header, a std log line, a fmt.Print) is an error naming it.
func parseJSONLog(out []byte, from, to time.Time) ([]jsonLine, error) {
	var lines []jsonLine
	var bad []string
	for i, raw := range bytes.Split(bytes.TrimRight(out, "\n"), []byte("\n")) {
		var l jsonLine
		if err := json.Unmarshal(raw, &l); err != nil {
			bad = append(bad, fmt.Sprintf("line %d is not one JSON object (%v): %s", i+1, err, raw))
			continue
		}
		ts, ok := l["ts"].(float64)
		at := time.UnixMilli(int64(ts))
		_, caller := l["caller"].(string)
		_, v := l["v"].(float64)
		_, hasV := l["v"]
		switch {
		case !ok || at.Before(from.Add(-time.Second)) || at.After(to.Add(time.Second)):
			bad = append(bad, fmt.Sprintf("line %d: ts %v is not Unix milliseconds between the agent's start and end (%s, %s): %s", i+1, l["ts"], from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano), raw))
		case l.msg() == "" || !caller:
			bad = append(bad, fmt.Sprintf("line %d lacks msg or caller: %s", i+1, raw))
		case hasV && !v:
			bad = append(bad, fmt.Sprintf("line %d: v is not a number: %s", i+1, raw))
		}
		lines = append(lines, l)
	}
	if len(bad) > 0 {
		return lines, fmt.Errorf("%d of %d lines are not component-base's JSON:\n%s", len(bad), len(lines), strings.Join(bad, "\n"))
	}
	return lines, nil
}

// findLine returns the first line with msg whose key/values include want
// (compared as JSON values: numbers as float64); v < 0: an error line
// (no v), else its verbosity.
func findLine(lines []jsonLine, msg string, v int, want map[string]any) jsonLine {
	for _, l := range lines {
		if l.msg() != msg {
			continue
		}
		got, hasV := l["v"].(float64)
		if (v < 0) == hasV || (hasV && int(got) != v) {
			continue
		}
		match := true
		for k, w := range want {
			if fmt.Sprint(l[k]) != fmt.Sprint(w) {
				match = false
			}
		}
		if match {
			return l
		}
	}
	return nil
}

// TestPrivKubeAgentJSONLog: the agent against a real API server with
// --logging-format=json (component-base's JSON logger, as kube-proxy links
// it) and -v=4 writes nothing on stdout and only JSON objects, one a line,
// on stderr, from its start through its first sync and a later partial
// sync, client-go's lines among them, to its stop: each
// with ts, caller, msg and v (or none on an error line), and the key/value
// pairs the text format prints (agent_kube_test.go checks those). A second
// agent on the same --pin-path, which waits and then exits with an error,
// says both in the same format: the reason it exits included.
func TestPrivKubeAgentJSONLog(t *testing.T) {
	w := newKubeWorld(t)
	// A container runtime keeps stderr apart from stdout; lab.Start writes
	// both to one file, so the agent runs through a shell that sends its
	// stderr to a file of its own.
	dir := t.TempDir()
	stderr := filepath.Join(dir, "stderr")
	wrapper := filepath.Join(dir, "xvs")
	if err := os.WriteFile(wrapper, fmt.Appendf(nil, "#!/bin/sh\nexec '%s' \"$@\" 2>'%s'\n", w.Bin, stderr), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := w.Bin
	w.Bin = wrapper
	start := time.Now()
	w.startKubeAgent(t, "--logging-format=json", "-v=4")
	w.Bin = bin
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(stderr)
			t.Logf("agent stderr:\n%s", b)
		}
	})
	w.waitBackends(t, harness.DemoVIP, 80, 3, 60*time.Second)
	// A partial sync.
	w.updateSlice(t, "web", "web-1", harness.DemoPodIPs[:2], "node")
	w.waitBackends(t, harness.DemoVIP, 80, 2, 5*time.Second)

	// A second agent on the same pin path waits for the first, then
	// exits with an error. Its stdout and stderr together: JSON alone.
	second := time.Now()
	out, err := lab.Run(w.Node.NS, "timeout", "30", w.Bin, "agent", "--kubeconfig", w.srv.Kubeconfig, "--hostname-override", "node",
		"--pin-path", w.PinPath, "--pin-lock-wait", "1s", "--logging-format=json", "--healthz-bind-address", "127.0.0.1:10266",
		"--metrics-bind-address", "127.0.0.1:10259")
	if err == nil {
		t.Fatalf("a second agent on %s ran:\n%s", w.PinPath, out)
	}
	lines, perr := parseJSONLog(out, second, time.Now())
	if perr != nil {
		t.Errorf("the second agent's output: %v", perr)
	}
	if l := findLine(lines, "waiting for the process holding the pin path to exit", 0, map[string]any{"pinPath": w.PinPath, "pid": w.agentPID(t)}); l == nil {
		t.Errorf("the second agent does not say, as JSON, which process it waits for:\n%s", out)
	}
	var exit jsonLine
	if len(lines) > 0 {
		exit = lines[len(lines)-1]
	}
	if e, _ := exit["err"].(string); exit["v"] != nil || !strings.Contains(e, "another xvs agent uses this --pin-path") {
		t.Errorf("the second agent's last line is not an error line with the reason it exits (err): %v\n%s", exit, out)
	}

	if err := w.Agent.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	stdout, err := os.ReadFile(w.Agent.Log)
	if err != nil {
		t.Fatal(err)
	}
	if len(stdout) > 0 {
		t.Errorf("the agent wrote on stdout:\n%s", stdout)
	}
	b, err := os.ReadFile(stderr)
	if err != nil {
		t.Fatal(err)
	}
	lines, err = parseJSONLog(b, start, time.Now())
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d JSON lines on stderr", len(lines))
	version := map[string]any{}
	if l := findLine(lines, "xvs version", 0, nil); l != nil {
		for _, k := range []string{"version", "commit", "built"} {
			if s, _ := l[k].(string); s == "" {
				t.Errorf("xvs version line lacks %s: %v", k, l)
			}
		}
		version["version"] = l["version"]
	} else {
		t.Error("no xvs version line")
	}
	for _, c := range []struct {
		msg  string
		v    int
		want map[string]any
	}{
		{"Serving", 0, map[string]any{"server": "healthz", "address": "0.0.0.0:10256"}},
		{"Serving", 0, map[string]any{"server": "metrics", "address": "127.0.0.1:10249"}},
		{"xvs agent running", 0, map[string]any{"node": "node", "source": "kubernetes", "mode": "ebpf", "pinPath": w.PinPath,
			"version": version["version"], "conntrackSize": 524288, "tcAttach": "auto"}},
		{"Informer caches synced", 0, nil},
		// The first sync (the demo Service's two ports), then partial ones.
		{"Synced", 4, map[string]any{"full": true}},
		{"Synced", 4, map[string]any{"full": false}},
		{"xvs agent stopping; the datapath stays in place", 0, nil},
	} {
		l := findLine(lines, c.msg, c.v, c.want)
		if l == nil {
			t.Errorf("no line %q at v=%d with %v", c.msg, c.v, c.want)
			continue
		}
		if k, _ := l["kernel"].(string); c.msg == "xvs agent running" && k == "" {
			t.Errorf("xvs agent running without the kernel: %v", l)
		}
		if n, _ := l["servicePorts"].(float64); c.msg == "Synced" && n < 2 {
			t.Errorf("Synced: servicePorts %v, want a number, the demo Service's two ports at least", l["servicePorts"])
		}
		if d, _ := l["took"].(string); (c.msg == "Synced" || c.msg == "Informer caches synced") && !strings.HasSuffix(d, "s") {
			t.Errorf("%s: took %v, want a duration as the text format prints it", c.msg, l["took"])
		}
	}
	// client-go logs through klog: its lines are in the same stream, in
	// the same format.
	if l := findLine(lines, "Caches populated", 2, map[string]any{"type": "*v1.EndpointSlice"}); l == nil || !strings.HasPrefix(l["caller"].(string), "cache/reflector.go:") {
		t.Errorf("no line from client-go's reflector: %v", l)
	}
}
