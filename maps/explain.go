package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	xbpf "github.com/xvs-lb/xvs/bpf"
	"github.com/xvs-lb/xvs/model"
)

// Explaining a packet: what the live datapath would do with it and why.
// The answer comes from the datapath's own program, never from a second
// implementation: the tc ingress program is loaded over private copies of
// the pinned maps (the Services, backends, scheduler state and node
// settings as they are now, and the client's own conntrack and affinity
// entries) and runs once on the packet (BPF_PROG_TEST_RUN). The live maps
// are only read: the run's conntrack entry, counters and scheduler cursor
// stay in the copies.

// tcActions are linux/pkt_cls.h's TC_ACT_* the program returns.
var tcActions = map[uint32]string{0: "pass", 2: "drop", 7: "redirect"}

// Explain runs the tc ingress program on p over copies of the maps pinned
// at pinPath.
func Explain(pinPath string, p model.ExplainPacket) (*model.Explanation, error) {
	x, err := NewExplainer(pinPath)
	if err != nil {
		return nil, err
	}
	defer x.Close()
	return x.Explain(p)
}

// An Explainer is the program loaded over copies of the pinned maps, taken
// when it is made and again at each Refresh. Each Explain starts from the
// live flows (seed) and leaves its run's scheduler state (round-robin
// cursors, least-connection counts) in the copies, so that a sequence of
// packets is explained as the datapath would meet it.
type Explainer struct {
	prog *ebpf.Program
	// host runs the socket hooks' decision (xvs_explain_sock), loaded
	// from spec on the first FromHost packet.
	host   *ebpf.Program
	spec   *ebpf.CollectionSpec
	clones map[string]*ebpf.Map
	// live are the pinned maps a packet's own entries are read from.
	live map[string]*ebpf.Map
}

// NewExplainer loads the program over copies of the maps pinned at
// pinPath.
func NewExplainer(pinPath string) (_ *Explainer, err error) {
	spec, err := xbpf.LoadXvs()
	if err != nil {
		return nil, err
	}
	for name := range spec.Programs {
		if name != "xvs_tc_ingress" && name != hostProgram {
			delete(spec.Programs, name)
		}
	}
	x := &Explainer{clones: map[string]*ebpf.Map{}, live: map[string]*ebpf.Map{}}
	defer func() {
		if err != nil {
			x.Close()
		}
	}()
	for name, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
		if name == ".bss" || name == ".rodata" || name == ".data" {
			continue // the program's own variables: as built
		}
		m, err := cloneMap(pinPath, name, ms)
		if err != nil {
			return nil, fmt.Errorf("explain: copy %s: %w", name, err)
		}
		x.clones[name] = m
	}
	// The program reaches the conntrack copies through the table slots,
	// as the datapath reaches the live ones.
	for slot, name := range map[uint32]string{
		uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_ESTABLISHED): xbpf.XvsMapXvsConntrack,
		uint32(xbpf.XvsXvsCtSlotXVS_CT_TABLE_UNREPLIED):   xbpf.XvsMapXvsCtUnreplied,
	} {
		if err := x.clones[xbpf.XvsMapXvsCtTables].Update(slot, x.clones[name], ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("explain: slot of %s: %w", name, err)
		}
	}
	x.spec = spec
	if x.prog, err = x.load("xvs_tc_ingress"); err != nil {
		return nil, err
	}
	if err := x.Refresh(pinPath); err != nil {
		return nil, err
	}
	return x, nil
}

// hostProgram is the socket hooks' decision as a program that can be
// test-run (bpf/xvs.c).
const hostProgram = "xvs_explain_sock"

// load loads one of spec's programs over the copies.
func (x *Explainer) load(name string) (*ebpf.Program, error) {
	s := x.spec.Copy()
	for n := range s.Programs {
		if n != name {
			delete(s.Programs, n)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(s, ebpf.CollectionOptions{MapReplacements: x.clones})
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("explain: load %s: %+v", name, verr)
		}
		return nil, fmt.Errorf("explain: load %s: %w", name, err)
	}
	defer coll.Close()
	return coll.DetachProgram(name), nil
}

// Close releases the programs and the copies.
func (x *Explainer) Close() {
	for _, p := range []*ebpf.Program{x.prog, x.host} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range x.clones {
		m.Close()
	}
	for _, m := range x.live {
		m.Close()
	}
}

// Forget closes the live maps Refresh opened (the agent's flows and
// affinity), until the next Refresh: an Explainer kept between agents holds
// none of theirs.
func (x *Explainer) Forget() {
	for _, m := range x.live {
		m.Close()
	}
	x.live = map[string]*ebpf.Map{}
}

// Explain runs the program once on p.
func (x *Explainer) Explain(p model.ExplainPacket) (*model.Explanation, error) {
	e, err := x.explain(p)
	if e == nil {
		return nil, err
	}
	e.Why = VerdictReason(e.Verdict)
	if e.Action == "translate" && !e.Tracked && err == nil {
		err = x.candidates(e)
	}
	return e, err
}

// candidates names the frontend's scheduler and, for random (the program
// draws a slot, 1..count, at random: this run's draw is one of many), every
// backend it may draw, read as lb_slot_backend reads them. A ClientIP
// affinity's client keeps its backend: its draw is only the first.
func (x *Explainer) candidates(e *model.Explanation) error {
	sc, err := readScratch(x.clones)
	if err != nil || sc == nil {
		return err
	}
	k := sc.Res.Key
	k.Slot = 0
	var svc xbpf.SvcValue
	if err := x.clones[xbpf.XvsMapXvsServices].Lookup(&k, &svc); err != nil {
		return nil // not a frontend's flow (a reply)
	}
	e.Scheduler = SchedulerName(xbpf.Sched(svc.Sched))
	if xbpf.Sched(svc.Sched) != xbpf.XvsXvsSchedXVS_SCHED_RANDOM || svc.Flags&uint16(xbpf.XvsXvsSvcFlagsXVS_SVC_F_AFFINITY) != 0 {
		return nil
	}
	for slot := uint16(1); slot <= svc.Count; slot++ {
		k.Slot = slot
		var member xbpf.SvcValue
		var be xbpf.Backend
		if err := x.clones[xbpf.XvsMapXvsServices].Lookup(&k, &member); err != nil {
			return fmt.Errorf("explain: slot %d of %s: %w", slot, e.Frontend, err)
		}
		if err := x.clones[xbpf.XvsMapXvsBackends].Lookup(member.BackendId, &be); err != nil {
			return fmt.Errorf("explain: backend %d: %w", member.BackendId, err)
		}
		e.Candidates = append(e.Candidates, netip.AddrPortFrom(DecodeAddr(be.Addr, be.Family), Ntohs(be.Port)))
	}
	slices.SortFunc(e.Candidates, netip.AddrPort.Compare)
	e.Candidates = slices.Compact(e.Candidates)
	return nil
}

func (x *Explainer) explain(p model.ExplainPacket) (*model.Explanation, error) {
	if p.FromHost {
		return x.explainHost(p)
	}
	if p.From.Addr().Unmap().Is4() != p.To.Addr().Unmap().Is4() {
		return nil, errors.New("explain: source and destination are of different families")
	}
	pkt, err := explainFrame(p)
	if err != nil {
		return nil, err
	}
	if err := x.seed(p); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	// Only this run's verdict and decision count (the run may take
	// another CPU than the last).
	verdicts := x.clones[xbpf.XvsMapXvsVerdicts]
	if err := ZeroPerCPU[xbpf.Stats](verdicts, indices(verdicts.MaxEntries())); err != nil {
		return nil, err
	}
	if err := ZeroPerCPU[xbpf.XvsFlowScratch](x.clones[xbpf.XvsMapXvsScratch], []uint32{0}); err != nil {
		return nil, err
	}
	ret, err := x.run(x.prog, pkt, p.Ifindex)
	if err != nil {
		return nil, err
	}
	return readExplanation(x.clones, ret, p)
}

// run runs prog once on pkt, with only this run's verdict and decision in
// the copies afterwards (the run may take another CPU than the last).
func (x *Explainer) run(prog *ebpf.Program, pkt []byte, ifindex uint32) (uint32, error) {
	verdicts := x.clones[xbpf.XvsMapXvsVerdicts]
	if err := ZeroPerCPU[xbpf.Stats](verdicts, indices(verdicts.MaxEntries())); err != nil {
		return 0, err
	}
	if err := ZeroPerCPU[xbpf.XvsFlowScratch](x.clones[xbpf.XvsMapXvsScratch], []uint32{0}); err != nil {
		return 0, err
	}
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbContext{IngressIfindex: ifindex}, Repeat: 1}
	ret, err := prog.Run(opts)
	if err != nil {
		return 0, fmt.Errorf("explain: run program: %w", err)
	}
	return ret, nil
}

// explainHost runs the socket hooks' decision for a socket of the node
// addressing p.To, over the copies with the node's own affinity entries
// (the hooks' client is the node's address).
func (x *Explainer) explainHost(p model.ExplainPacket) (*model.Explanation, error) {
	if x.host == nil {
		prog, err := x.load(hostProgram)
		if err != nil {
			return nil, err
		}
		x.host = prog
	}
	var cfg xbpf.NodeConf
	if err := x.clones[xbpf.XvsMapXvsNodeConfig].Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("explain: node settings: %w", err)
	}
	node := cfg.SnatAddr4
	if !p.To.Addr().Unmap().Is4() {
		node = cfg.SnatAddr6
	}
	fam := uint8(xbpf.FamilyIPv4)
	if !p.To.Addr().Unmap().Is4() {
		fam = xbpf.FamilyIPv6
	}
	from := netip.AddrPortFrom(DecodeAddr(node, fam), 0)
	if err := x.seed(model.ExplainPacket{From: from, To: p.To, Proto: p.Proto}); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	pkt, err := explainFrame(model.ExplainPacket{From: from, To: p.To, Proto: p.Proto})
	if err != nil {
		return nil, err
	}
	if _, err := x.run(x.host, pkt, 0); err != nil {
		return nil, err
	}
	e := &model.Explanation{Host: true, Source: from}
	if err := readVerdict(x.clones, e); err != nil {
		return nil, err
	}
	switch e.Verdict {
	case VerdictName(xbpf.XvsXvsVerdictXVS_V_SOCK_CONNECT):
		e.Action = "translate"
	case VerdictName(xbpf.XvsXvsVerdictXVS_V_SOCK_REFUSED):
		e.Action = "reject"
	case VerdictName(xbpf.XvsXvsVerdictXVS_V_SOCK_DROPPED):
		e.Action = "drop"
	default:
		e.Action = "pass"
	}
	if cfg.NetnsCookie == 0 {
		// The hooks serve no network namespace (sock_config): every
		// socket is left to the packet path.
		e.Action, e.Verdict = "pass", VerdictName(xbpf.XvsXvsVerdictXVS_V_PASS)
		return e, nil
	}
	sc, err := readScratch(x.clones)
	if err != nil || sc == nil || e.Action == "pass" {
		return e, err // pass: the key was looked up and not found
	}
	e.Frontend, e.Scope = frontendOf(sc.Res.Key)
	switch e.Action {
	case "translate":
		e.Backend = netip.AddrPortFrom(DecodeAddr(sc.Res.Rw.Daddr, fam), Ntohs(sc.Res.Rw.Dport))
		e.BackendID = sc.Entry.BackendId
	case "reject", "drop":
		e.Cause = VerdictName(xbpf.Verdict(sc.Res.Verdict))
	}
	return e, nil
}

// seed empties the copies of the flows' and affinity tables and puts in
// p's own conntrack entries (its flow, if conntrack has it) and its
// client's affinity entries from the live maps: each packet is explained
// against the live flows, not against what earlier explanations left.
func (x *Explainer) seed(p model.ExplainPacket) error {
	for name := range seeded {
		if err := copiers[name].clear(x.clones[name]); err != nil {
			return err
		}
	}
	// Every flow of the packet's client port, both entries: its own flow,
	// and any other that reaches the same backend (a clash the decision
	// resolves with another port).
	k := explainCtKey(p)
	for _, t := range []string{xbpf.XvsMapXvsConntrack, xbpf.XvsMapXvsCtUnreplied} {
		live := x.live[t]
		if live == nil {
			continue
		}
		var keys []xbpf.CtKey
		var vals []xbpf.CtEntry
		err := Walk(live, func(ck *xbpf.CtKey, e *xbpf.CtEntry) {
			if ck.Proto == k.Proto && ck.Family == k.Family &&
				((ck.Saddr == k.Saddr && ck.Sport == k.Sport) || (ck.Daddr == k.Saddr && ck.Dport == k.Sport)) {
				keys, vals = append(keys, *ck), append(vals, *e)
			}
		})
		if err == nil {
			err = UpdateMany(x.clones[t], keys, vals)
		}
		if err != nil {
			return err
		}
	}
	live := x.live[xbpf.XvsMapXvsAffinity]
	if live == nil {
		return nil
	}
	client, _ := EncodeAddr(p.From.Addr())
	var perr error
	err := Walk(live, func(k *xbpf.AffKey, v *xbpf.AffValue) {
		if k.Addr == client && perr == nil {
			perr = x.clones[xbpf.XvsMapXvsAffinity].Put(k, v)
		}
	})
	return errors.Join(err, perr)
}

func indices(n uint32) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(i)
	}
	return ids
}

// skbContext is the head of struct __sk_buff that BPF_PROG_TEST_RUN takes
// as the skb's context (the fields before mark must be zero).
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex                                                               uint32
}

// cloneMap makes the private copy of one map: the maps the decision
// reads (copiers) sized as pinned and filled by Refresh, the flows' and
// affinity tables small and seeded per packet, the rest empty.
func cloneMap(pinPath, name string, ms *ebpf.MapSpec) (*ebpf.Map, error) {
	small := ms.Type == ebpf.Hash || ms.Type == ebpf.LRUHash || ms.Type == ebpf.PerCPUHash || ms.Type == ebpf.LRUCPUHash
	switch {
	case seeded[name]:
		ms.MaxEntries = 4096
	case copiers[name] != nil:
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, err
		}
		ms.MaxEntries = pinned.MaxEntries()
		pinned.Close()
	case small:
		ms.MaxEntries = min(ms.MaxEntries, 4096) // written by the runs: a few entries each
	}
	return ebpf.NewMap(ms)
}

// ErrExplainerStale: the maps pinned now are sized unlike the copies the
// Explainer's program runs over; a new Explainer is needed.
var ErrExplainerStale = errors.New("explain: the pinned maps changed size")

// Refresh copies the maps pinned at pinPath (another agent's, or the same
// agent's after a change) into the copies, replacing what they held; the
// program stays loaded.
func (x *Explainer) Refresh(pinPath string) error {
	for name, c := range copiers {
		if seeded[name] {
			continue
		}
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return fmt.Errorf("explain: %s: %w", name, err)
		}
		dst := x.clones[name]
		if pinned.MaxEntries() != dst.MaxEntries() {
			pinned.Close()
			return ErrExplainerStale
		}
		err = c.clear(dst)
		if err == nil {
			err = c.copy(pinned, dst)
		}
		pinned.Close()
		if err != nil {
			return fmt.Errorf("explain: copy %s: %w", name, err)
		}
	}
	x.Forget()
	for name := range seeded {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue // an agent older than the table
		}
		if err != nil {
			return fmt.Errorf("explain: %s: %w", name, err)
		}
		x.live[name] = m
	}
	return nil
}

// copiers copy the other maps the decision reads, each read and written in
// batches (an array of a quarter million entries costs a few syscalls, not
// a quarter million).
var copiers = map[string]copier{
	xbpf.XvsMapXvsServices:     typedCopier[xbpf.SvcKey, xbpf.SvcValue]{},
	xbpf.XvsMapXvsBackends:     typedCopier[uint32, xbpf.Backend]{},
	xbpf.XvsMapXvsMembers:      typedCopier[xbpf.MemberKey, uint32]{},
	xbpf.XvsMapXvsRrCursors:    typedCopier[uint32, uint32]{},
	xbpf.XvsMapXvsBackendHeld:  typedCopier[uint32, xbpf.Conns]{},
	xbpf.XvsMapXvsNodeConfig:   typedCopier[uint32, xbpf.NodeConf]{},
	xbpf.XvsMapXvsPodCidrs:     typedCopier[xbpf.LPMKey, uint32]{},
	xbpf.XvsMapXvsServiceCidrs: typedCopier[xbpf.LPMKey, uint32]{},
	xbpf.XvsMapXvsSourceRanges: typedCopier[xbpf.LPMKey, uint32]{},
	xbpf.XvsMapXvsClusterIps:   typedCopier[xbpf.VIPKey, uint32]{},
	xbpf.XvsMapXvsIfSnat:       typedCopier[uint32, xbpf.IfAddrs]{},
	xbpf.XvsMapXvsSchedTables:  tablesCopier{},
	xbpf.XvsMapXvsConntrack:    typedCopier[xbpf.CtKey, xbpf.CtEntry]{},
	xbpf.XvsMapXvsCtUnreplied:  typedCopier[xbpf.CtKey, xbpf.CtEntry]{},
	xbpf.XvsMapXvsAffinity:     typedCopier[xbpf.AffKey, xbpf.AffValue]{},
}

// seeded are the copies that start empty: the packet's own entries are
// put in by seed.
var seeded = map[string]bool{xbpf.XvsMapXvsConntrack: true, xbpf.XvsMapXvsCtUnreplied: true, xbpf.XvsMapXvsAffinity: true}

// A copier fills a copy from its map and empties it again.
type copier interface {
	copy(src, dst *ebpf.Map) error
	clear(m *ebpf.Map) error
}

type typedCopier[K, V comparable] struct{}

// copy copies src's entries into dst; an array's zero values are left out
// (the new array holds them already).
func (typedCopier[K, V]) copy(src, dst *ebpf.Map) error {
	var keys []K
	var vals []V
	var zero V
	err := Walk(src, func(k *K, v *V) {
		if *v == zero && src.Type() == ebpf.Array {
			return
		}
		keys, vals = append(keys, *k), append(vals, *v)
	})
	if err != nil {
		return err
	}
	return UpdateMany(dst, keys, vals)
}

// clear deletes every entry (an array's: zeroes the ones that are not).
func (typedCopier[K, V]) clear(m *ebpf.Map) error {
	var keys []K
	var zero V
	err := Walk(m, func(k *K, v *V) {
		if *v != zero || m.Type() != ebpf.Array {
			keys = append(keys, *k)
		}
	})
	if err != nil {
		return err
	}
	if m.Type() == ebpf.Array {
		return UpdateMany(m, keys, make([]V, len(keys)))
	}
	return DeleteMany(m, keys)
}

type tablesCopier struct{}

func (tablesCopier) copy(src, dst *ebpf.Map) error { return cloneTables(src, dst) }

func (tablesCopier) clear(m *ebpf.Map) error {
	var keys []xbpf.SchedKey
	var k xbpf.SchedKey
	var id ebpf.MapID
	it := m.Iterate()
	for it.Next(&k, &id) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return err
	}
	return DeleteMany(m, keys)
}

// cloneTables copies the scheduler tables: each inner table into a new
// array, put under its key in dst.
func cloneTables(src, dst *ebpf.Map) error {
	var k xbpf.SchedKey
	var id ebpf.MapID
	it := src.Iterate()
	for it.Next(&k, &id) {
		inner, err := ebpf.NewMapFromID(id)
		if err != nil {
			return fmt.Errorf("scheduler table of service %d: %w", k.SvcId, err)
		}
		cp, err := ebpf.NewMap(&ebpf.MapSpec{
			Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: inner.MaxEntries(), Flags: unix.BPF_F_INNER_MAP,
		})
		if err == nil {
			err = typedCopier[uint32, uint32]{}.copy(inner, cp)
		}
		inner.Close()
		if err == nil {
			err = dst.Put(&k, uint32(cp.FD()))
		}
		if cp != nil {
			cp.Close()
		}
		if err != nil {
			return err
		}
	}
	return it.Err()
}

func explainCtKey(p model.ExplainPacket) xbpf.CtKey {
	s, fam := EncodeAddr(p.From.Addr())
	d, _ := EncodeAddr(p.To.Addr())
	return xbpf.CtKey{Saddr: s, Daddr: d, Sport: Htons(p.From.Port()), Dport: Htons(p.To.Port()), Proto: uint8(p.Proto), Family: fam}
}

// readExplanation reads the run's outcome back from the copies: the
// verdict counted, the decision left in the scratch space, and the flow's
// conntrack entry.
func readExplanation(clones map[string]*ebpf.Map, ret uint32, p model.ExplainPacket) (*model.Explanation, error) {
	x := &model.Explanation{}
	if err := readVerdict(clones, x); err != nil {
		return nil, err
	}
	x.Action = tcActions[ret]
	switch {
	case x.Action == "redirect" && isReject(x.Verdict):
		x.Action = "reject"
	case x.Action == "pass" || x.Action == "redirect":
		if isTranslation(x.Verdict) {
			x.Action = "translate"
		} else {
			x.Action = "pass"
		}
	}
	x.Tracked = x.Verdict == VerdictName(xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED)

	sc, err := readScratch(clones)
	if err != nil {
		return nil, err
	}
	if sc != nil {
		x.Frontend, x.Scope = frontendOf(sc.Res.Key)
		if x.Action == "translate" {
			fam := sc.Pkt.Family
			x.Backend = netip.AddrPortFrom(DecodeAddr(sc.Res.Rw.Daddr, fam), Ntohs(sc.Res.Rw.Dport))
			x.Source = netip.AddrPortFrom(DecodeAddr(sc.Res.Rw.Saddr, fam), Ntohs(sc.Res.Rw.Sport))
		}
	}
	if x.Action != "translate" {
		return x, nil
	}
	// The flow's forward entry: its backend and how it leaves.
	k := explainCtKey(p)
	var e xbpf.CtEntry
	for _, t := range []string{xbpf.XvsMapXvsCtUnreplied, xbpf.XvsMapXvsConntrack} {
		if err := clones[t].Lookup(&k, &e); err == nil {
			break
		}
	}
	x.BackendID = e.BackendId
	flag := func(f xbpf.CtFlags) bool { return e.Flags&uint16(f) != 0 }
	switch {
	case flag(xbpf.XvsXvsCtFlagsXVS_CT_F_CLASH):
		x.Masquerade = "remap"
	case flag(xbpf.XvsXvsCtFlagsXVS_CT_F_SNAT):
		x.Masquerade = "xvs"
	case flag(xbpf.XvsXvsCtFlagsXVS_CT_F_NF_MASQ):
		x.Masquerade = "netfilter"
	}
	x.LocalDelivery = flag(xbpf.XvsXvsCtFlagsXVS_CT_F_HOST)
	return x, nil
}

// readVerdict sets x.Verdict to the verdict the run counted.
func readVerdict(clones map[string]*ebpf.Map, x *model.Explanation) error {
	per := []xbpf.Stats{}
	var v uint32
	it := clones[xbpf.XvsMapXvsVerdicts].Iterate()
	for it.Next(&v, &per) {
		for _, s := range per {
			if s.PacketsIn > 0 {
				x.Verdict = VerdictName(xbpf.Verdict(v))
			}
		}
	}
	return it.Err()
}

// readScratch returns the run's scratch space (the CPU's that ran it: the
// only one with a packet), or nil.
func readScratch(clones map[string]*ebpf.Map) (*xbpf.XvsFlowScratch, error) {
	var scratch []xbpf.XvsFlowScratch
	if err := clones[xbpf.XvsMapXvsScratch].Lookup(uint32(0), &scratch); err != nil {
		return nil, fmt.Errorf("read the decision: %w", err)
	}
	for i := range scratch {
		if scratch[i].Pkt.Family != 0 {
			return &scratch[i], nil
		}
	}
	return nil, nil
}

// frontendOf names the frontend of a service key ("" when none matched)
// and the scope it was used in.
func frontendOf(k xbpf.SvcKey) (frontend, scope string) {
	if k.Port == 0 {
		return "", ""
	}
	frontend = netip.AddrPortFrom(DecodeAddr(k.Addr, k.Family), Ntohs(k.Port)).String() + "/" + model.Protocol(k.Proto).String()
	if k.Scope == uint8(xbpf.XvsXvsScopeXVS_SCOPE_SHORT_CIRCUIT) {
		return frontend, "short-circuit"
	}
	return frontend, "policy"
}

func isReject(v string) bool {
	switch v {
	case VerdictName(xbpf.XvsXvsVerdictXVS_V_REJECT_NO_ENDPOINTS), VerdictName(xbpf.XvsXvsVerdictXVS_V_REJECT_WRONG_PORT),
		VerdictName(xbpf.XvsXvsVerdictXVS_V_REJECT_FRAG_NEEDED):
		return true
	}
	return false
}

func isTranslation(v string) bool {
	switch v {
	case VerdictName(xbpf.XvsXvsVerdictXVS_V_FWD_NEW), VerdictName(xbpf.XvsXvsVerdictXVS_V_FWD_ESTABLISHED),
		VerdictName(xbpf.XvsXvsVerdictXVS_V_REPLY), VerdictName(xbpf.XvsXvsVerdictXVS_V_REPLY_HOST):
		return true
	}
	return false
}

// verdictReasons say in words what a verdict means, for `xvs explain`.
var verdictReasons = map[string]string{
	"pass":                        "not a Service's address (or not a protocol xvs balances): left to the node",
	"forward_new":                 "a new connection to a frontend: a backend is chosen and the flow recorded",
	"forward_established":         "a packet of a connection conntrack already has: it follows that flow",
	"reply":                       "a reply of a tracked flow: the frontend becomes its source again",
	"reply_host_endpoint":         "a reply of a flow to an endpoint on this node's own address",
	"pass_malformed":              "headers xvs cannot parse: left to the node's stack",
	"pass_fragment":               "a later fragment of a datagram xvs did not see begin: left to the stack",
	"drop_no_local_endpoints":     "externalTrafficPolicy: Local and no ready endpoint on this node: dropped, as kube-proxy drops it",
	"reject_no_endpoints":         "the Service has no ready endpoint anywhere: rejected (TCP RST, ICMP port unreachable)",
	"drop_no_backend":             "no usable backend of the endpoints that apply: dropped",
	"drop_invalid":                "a TCP segment that is neither a SYN nor part of a known flow (conntrack INVALID): dropped",
	"drop_source_range":           "the source is outside the LoadBalancer's loadBalancerSourceRanges: dropped",
	"reject_wrong_port":           "a ClusterIP on a port (or protocol) it does not serve: rejected",
	"drop_unallocated_service_ip": "an address of a service CIDR that no Service has: dropped",
	"drop_snat_ports_exhausted":   "no masquerade port free towards that backend: dropped",
	"reject_frag_needed":          "too big for the path to the backend and may not be fragmented: answered with frag-needed",
	"pass_frag_needed":            "too big for the path to the backend: left to the stack to fragment",
	"pass_draining":               "xvs is draining (xvs cleanup --drain): a new flow is left to the node's netfilter rules",
	"host_socket_balanced":        "a socket of the node to a frontend: the socket hooks connect it straight to a backend (no per-packet NAT, no conntrack entry)",
	"host_socket_refused":         "a socket of the node to a frontend that rejects: connect() or sendmsg() fails at once with ECONNREFUSED",
	"host_socket_dropped":         "a socket of the node to a frontend that drops: connect() or sendmsg() fails at once with ETIMEDOUT",
}

// VerdictReason is a verdict in words.
func VerdictReason(v string) string {
	if r, ok := verdictReasons[v]; ok {
		return r
	}
	return v
}
