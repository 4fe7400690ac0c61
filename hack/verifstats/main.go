// Command verifstats loads each xvs program on its own (maps unpinned, at
// the build's default sizes) and prints what the kernel's verifier spent on
// it: instructions processed (the 1M limit is what fails a load), states,
// and the wall time of the load. With -by-func it also asks for the full
// verifier log and attributes every processed instruction to the
// subprogram it belongs to: a static subprogram is verified once per caller
// state the verifier cannot prune, and this is where that shows.
//
// Run it on every kernel the datapath must load on; in the VM rig:
//
//	CGO_ENABLED=0 go build -o bin/verifstats ./hack/verifstats
//	./hack/vm/vm.sh run 6.1 -- /host/bin/verifstats -by-func -prog xvs_tc_ingress
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	xbpf "github.com/xvs-lb/xvs/bpf"
)

var (
	statsLine = regexp.MustCompile(`processed (\d+) insns \(limit \d+\) max_states_per_insn (\d+) total_states (\d+) peak_states (\d+)`)
	insnLine  = regexp.MustCompile(`^(\d+): \(`)
	funcLine  = regexp.MustCompile(`^func#(\d+) @(\d+)$`)
)

func main() {
	prog := flag.String("prog", "", "only this program (default: every program)")
	byFunc := flag.Bool("by-func", false, "attribute processed instructions to subprograms (full verifier log: slow)")
	flag.Parse()
	if err := run(*prog, *byFunc); err != nil {
		fmt.Fprintln(os.Stderr, "verifstats:", err)
		os.Exit(1)
	}
}

func run(only string, byFunc bool) error {
	spec, err := xbpf.LoadXvs()
	if err != nil {
		return err
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	names := make([]string, 0, len(spec.Programs))
	for n := range spec.Programs {
		if only == "" || n == only {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("no program %q", only)
	}
	slices.Sort(names)
	fmt.Printf("%-24s %10s %8s %8s %8s\n", "program", "processed", "states", "peak", "load")
	failed := false
	for _, n := range names {
		if err := report(spec, n, byFunc); err != nil {
			fmt.Printf("%-24s load failed: %v\n", n, err)
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				fmt.Println(strings.Join(ve.Log[max(0, len(ve.Log)-20):], "\n"))
			}
			failed = true
		}
	}
	if failed {
		return errors.New("some programs did not load")
	}
	return nil
}

func report(spec *ebpf.CollectionSpec, name string, byFunc bool) error {
	s := spec.Copy()
	for o := range s.Programs {
		if o != name {
			delete(s.Programs, o)
		}
	}
	level := ebpf.LogLevelStats
	if byFunc {
		level |= ebpf.LogLevelInstruction
	}
	start := time.Now()
	coll, err := ebpf.NewCollectionWithOptions(s, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: level, LogSizeStart: 1 << 20},
	})
	took := time.Since(start)
	if err != nil {
		return err
	}
	defer coll.Close()
	p := coll.Programs[name]
	m := statsLine.FindStringSubmatch(p.VerifierLog)
	if m == nil {
		return fmt.Errorf("no statistics in the verifier log")
	}
	fmt.Printf("%-24s %10s %8s %8s %8v\n", name, m[1], m[3], m[4], took.Round(time.Millisecond))
	if byFunc {
		return perFunc(p)
	}
	return nil
}

// perFunc prints how many processed instructions fell in each subprogram.
// The log names subprograms by number and start ("func#3 @1802"), in the
// order of the program's BTF function records, which give their names.
func perFunc(p *ebpf.Program) error {
	info, err := p.Info()
	if err != nil {
		return err
	}
	funcs, err := info.FuncInfos()
	if err != nil {
		return fmt.Errorf("function records: %w", err)
	}
	var starts []int
	counts := make(map[int]int)
	for _, l := range strings.Split(p.VerifierLog, "\n") {
		if m := funcLine.FindStringSubmatch(l); m != nil {
			off, _ := strconv.Atoi(m[2])
			starts = append(starts, off)
		} else if m := insnLine.FindStringSubmatch(l); m != nil && len(starts) > 0 {
			i, _ := strconv.Atoi(m[1])
			counts[sort.SearchInts(starts, i+1)-1]++
		}
	}
	if len(starts) != len(funcs) {
		return fmt.Errorf("%d subprograms in the log, %d function records", len(starts), len(funcs))
	}
	order := make([]int, 0, len(counts))
	total := 0
	for f, c := range counts {
		order = append(order, f)
		total += c
	}
	sort.Slice(order, func(a, b int) bool { return counts[order[a]] > counts[order[b]] })
	for _, f := range order {
		fmt.Printf("    %-28s %10d %5.1f%%\n", funcs[f].Func.Name, counts[f], 100*float64(counts[f])/float64(total))
	}
	return nil
}
