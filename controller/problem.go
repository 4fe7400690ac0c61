package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Problem describes input that was skipped or only partly used: a bad
// manifest, an EndpointSlice endpoint that does not parse, a Service field
// out of range. Problems never stop the rest of the State from being built;
// they exist so that the agent (or `xvs` CLI) can tell the user why
// something they wrote has no effect.
type Problem struct {
	// Kind is the object kind ("Service", "EndpointSlice", "Node"), "Config"
	// for configuration, or "File" for a manifest that could not be read.
	Kind string
	// Object is "namespace/name" (just "name" for Nodes), "" when unknown.
	Object string
	// File and Doc locate the manifest (file source only; Doc counts YAML
	// documents from 1).
	File string
	Doc  int
	// Reason says what was wrong and what was done about it.
	Reason string
}

func (p Problem) String() string {
	s := ""
	if p.File != "" {
		s = p.File
		if p.Doc > 0 {
			s += fmt.Sprintf("#%d", p.Doc)
		}
		s += ": "
	}
	if what := strings.TrimSpace(p.Kind + " " + p.Object); what != "" {
		s += what + ": "
	}
	return s + p.Reason
}

func configProblem(format string, args ...any) Problem {
	return Problem{Kind: "Config", Reason: fmt.Sprintf(format, args...)}
}

// sortProblems orders problems deterministically so that callers can diff
// successive lists and log only new ones.
func sortProblems(ps []Problem) {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(
			cmp.Compare(a.File, b.File),
			cmp.Compare(a.Doc, b.Doc),
			cmp.Compare(a.Kind, b.Kind),
			cmp.Compare(a.Object, b.Object),
			cmp.Compare(a.Reason, b.Reason),
		)
	})
}

// maxQuoted is how much of a tenant's text (an annotation, a field value)
// a Problem quotes: enough to recognise it, never enough to carry a
// 256 KB annotation into every node's logs and Events.
const maxQuoted = 64

// quoteInput quotes s for a Problem's reason, cut to maxQuoted bytes
// (at a rune boundary) with its full length said.
func quoteInput(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
