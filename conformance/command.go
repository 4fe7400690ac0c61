package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"
)

// RunCommand is `xvs conformance run|report`.
func RunCommand(args []string) error {
	usage := errors.New("usage: xvs conformance run DIR --mode ebpf|ipvs [--json FILE] [--run REGEX] [--report FILE]\n" +
		"       xvs conformance report [-o FILE] RESULTS.json...")
	if len(args) == 0 {
		return usage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:])
	case "report":
		return cmdReport(args[1:])
	}
	return usage
}

// cmdRun is `xvs conformance run`: it runs a corpus. It fails (exit 1)
// when any probe fails or any scenario is malformed.
func cmdRun(args []string) error {
	rf, err := parseRunFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, runErr := Run(ctx, rf.dir, rf.opts)
	if res != nil {
		if err := rf.write(res); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	if res.Failed > 0 {
		return fmt.Errorf("%d failed", res.Failed)
	}
	return nil
}

// runFlags is what `conformance run`'s command line asks for.
type runFlags struct {
	dir  string
	opts Options
	// output is stdout's format; jsonOut and report name the files the
	// results also go to ("": none).
	output, jsonOut, report string
}

func parseRunFlags(args []string) (*runFlags, error) {
	fs := flag.NewFlagSet("conformance run", flag.ContinueOnError)
	mode := fs.String("mode", ModeEBPF, "datapath under test: ebpf or ipvs")
	jsonOut := fs.String("json", "", "also write machine-readable results to FILE")
	output := fs.String("o", "text", "stdout format: text (one line per probe) or json (results only)")
	filter := fs.String("run", "", "only scenarios whose name matches this regular expression")
	skip := fs.String("skip", "", "leave out (and list as skipped) scenarios whose name matches this regular expression")
	report := fs.String("report", "", "also write a Markdown report (this run only) to FILE")
	logDir := fs.String("log-dir", "", "keep every agent log in DIR (default: kept only when something fails)")
	nfMode := fs.String("netfilter-mode", "", "ebpf mode only: the agent's --netfilter-mode (pass or bypass; default: the agent's)")
	noAgentChecks := fs.Bool("no-agent-checks", false, "leave out the checks of the agent's /healthz, /livez, /proxyMode and /metrics after each scenario")
	// Flags may follow the directory: `run DIR --mode ipvs`.
	rf := &runFlags{}
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		if rf.dir != "" {
			return nil, fmt.Errorf("one corpus directory, got %q and %q", rf.dir, fs.Arg(0))
		}
		rf.dir, rest = fs.Arg(0), fs.Args()[1:]
	}
	if rf.dir == "" {
		return nil, errors.New("usage: xvs conformance run DIR --mode ebpf|ipvs")
	}
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rf.output, rf.jsonOut, rf.report = *output, *jsonOut, *report
	rf.opts = Options{Mode: *mode, Bin: bin, Out: os.Stdout, LogDir: *logDir, NoAgentChecks: *noAgentChecks, NetfilterMode: *nfMode}
	switch {
	case *nfMode == "":
	case *mode != ModeEBPF:
		return nil, fmt.Errorf("--netfilter-mode: ebpf mode only (mode %s)", *mode)
	case *nfMode != "pass" && *nfMode != "bypass":
		return nil, fmt.Errorf("--netfilter-mode %q: want pass or bypass", *nfMode)
	}
	if rf.output == "json" {
		rf.opts.Out = os.Stderr
	} else if rf.output != "text" {
		return nil, fmt.Errorf("-o %q: want text or json", rf.output)
	}
	if *filter != "" {
		if rf.opts.Filter, err = regexp.Compile(*filter); err != nil {
			return nil, fmt.Errorf("--run: %w", err)
		}
	}
	if *skip != "" {
		if rf.opts.Skip, err = regexp.Compile(*skip); err != nil {
			return nil, fmt.Errorf("--skip: %w", err)
		}
	}
	return rf, nil
}

// write puts a run's results where the flags asked: stdout (-o json), the
// --json file, the --report file.
func (rf *runFlags) write(res *Results) error {
	if rf.output == "json" {
		if err := writeJSON(os.Stdout, res); err != nil {
			return err
		}
	}
	if rf.jsonOut != "" {
		f, err := os.Create(rf.jsonOut)
		if err != nil {
			return err
		}
		err = writeJSON(f, res)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	if rf.report != "" {
		return os.WriteFile(rf.report, Report([]*Results{res}, "", nil), 0o644)
	}
	return nil
}

func writeJSON(f *os.File, v any) error {
	enc := json.NewEncoder(f)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// cmdReport renders results of one or more runs (one per mode) as
// the Markdown of docs/CONFORMANCE.md.
func cmdReport(args []string) error {
	fs := flag.NewFlagSet("conformance report", flag.ContinueOnError)
	out := fs.String("o", "docs/CONFORMANCE.md", "output file (- for stdout)")
	semantics := fs.String("semantics", "", "the semantics document (docs/semantics.md), to list sections the corpus does not cover (optional)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: xvs conformance report [-o FILE] RESULTS.json...")
	}
	var runs []*Results
	for _, p := range fs.Args() {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var r Results
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		runs = append(runs, &r)
	}
	var sections []byte
	if *semantics != "" {
		var err error
		if sections, err = os.ReadFile(*semantics); err != nil {
			return err
		}
	}
	md := Report(runs, "", sections)
	if *out == "-" {
		_, err := os.Stdout.Write(md)
		return err
	}
	return os.WriteFile(*out, md, 0o644)
}
