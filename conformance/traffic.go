package conformance

// Format version 2: real traffic (FORMAT.md "Version 2"). A probe can move
// megabytes each way, half-close and stream, keep a fixed client port,
// send large UDP datagrams; a hold can carry bulk data; a UDP session
// keeps one client port across steps and awaits the backend that must
// answer it. Every listener the runner starts is a lab.BulkServer, which
// answers version 1 probes exactly as the echo servers did.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/xvs-lb/xvs/lab"
)

// Versions of the format this runner reads.
const (
	Version1 = 1
	Version2 = 2
	// Version3 adds ServiceCIDR objects; every version 2 field stays.
	Version3 = 3
	// Version4 adds external clients behind a router and a link of a
	// given MTU (from.router, from.mtu) and endpoint ports with no
	// listener (closed); everything of version 3 stays.
	Version4 = 4
)

// Transfer is a probe's bulk data: each try moves Download bytes from the
// backend and Upload bytes to it (both at once when both are set), checked
// byte by byte and by SHA-256.
type Transfer struct {
	Download ByteSize `json:"download"`
	Upload   ByteSize `json:"upload"`
	Stall    Duration `json:"stall"` // no byte moving for this long fails the try (default 3s)
}

// Stream is a half-close probe: one side shuts its write side and the
// other keeps sending one chunk every interval for duration.
type Stream struct {
	HalfClose string   `json:"halfClose"` // client | server
	Duration  Duration `json:"duration"`
	Interval  Duration `json:"interval"` // default 1s
	Chunk     ByteSize `json:"chunk"`    // default 1KiB
	Stall     Duration `json:"stall"`    // default 3s
}

// HeldBulk makes a hold carry data both ways all the time.
type HeldBulk struct {
	Rate ByteSize `json:"rate"` // bytes per second each way (default 1MiB)
}

// Session is a UDP client with a fixed source port that sends a datagram
// every interval until the scenario ends, recording who answers.
type Session struct {
	Name       string   `json:"name"`
	From       From     `json:"from"`
	To         string   `json:"to"`
	SourcePort uint16   `json:"sourcePort"`
	Datagram   ByteSize `json:"datagram"` // default 64
	Interval   Duration `json:"interval"` // default 100ms
	Expect     Expect   `json:"expect"`   // members the first replies must come from
	Within     Duration `json:"within"`   // default 1s

	to netip.AddrPort
}

// Await asserts that a session's datagrams sent since the last change (the
// previous apply or delete, once the agent applied it; or the session's
// start) are answered by Expect within Within, and stay there.
type Await struct {
	Session string   `json:"session"`
	Expect  Expect   `json:"expect"`
	Within  Duration `json:"within"` // default 1s
}

// DefaultWithin is how long a session waits for the expected backend.
const DefaultWithin = time.Second

// ByteSize is a byte count: a number, or a string with a unit ("20MiB",
// "64KiB", "1500", "2000B"; Ki/Mi/Gi as Kubernetes writes them too).
type ByteSize int64

var sizeRe = regexp.MustCompile(`^\s*(\d+)\s*([KMG]i?B?|B)?\s*$`)

// MaxByteSize bounds every size in a scenario.
const MaxByteSize = 1 << 30

func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n float64
	if err := json.Unmarshal(data, &n); err == nil {
		if n < 0 || n != math.Trunc(n) || n > MaxByteSize {
			return fmt.Errorf("size %v: want a whole number of bytes up to 1GiB", n)
		}
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return errors.New("size: want a number of bytes or e.g. 20MiB")
	}
	m := sizeRe.FindStringSubmatch(s)
	if m == nil {
		return fmt.Errorf("size %q: want e.g. 1500, 64KiB or 20MiB", s)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	switch strings.TrimSuffix(strings.TrimSuffix(m[2], "B"), "i") {
	case "K":
		v <<= 10
	case "M":
		v <<= 20
	case "G":
		v <<= 30
	}
	if v > MaxByteSize {
		return fmt.Errorf("size %q: over 1GiB", s)
	}
	*b = ByteSize(v)
	return nil
}

func (b ByteSize) String() string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", int64(b))
}

func (b ByteSize) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// usesV2 names the version 2 fields a probe sets.
func (p *Probe) usesV2() []string {
	var f []string
	if p.SourcePort != 0 {
		f = append(f, "sourcePort")
	}
	if p.Transfer != nil {
		f = append(f, "transfer")
	}
	if p.Stream != nil {
		f = append(f, "stream")
	}
	if p.Datagram != 0 {
		f = append(f, "datagram")
	}
	return f
}

// validateV2 checks a probe's version 2 fields (p.proto is set).
func (p *Probe) validateV2() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.Transfer != nil && p.Stream != nil {
		bad("transfer and stream: one or the other")
	}
	if (p.Transfer != nil || p.Stream != nil) && p.proto != "TCP" {
		bad("transfer and stream are TCP (protocol is %s)", p.proto)
	}
	if p.Datagram != 0 && p.proto != "UDP" {
		bad("datagram is a UDP size (protocol is %s)", p.proto)
	}
	if p.Datagram > lab.MaxDatagram {
		bad("datagram %d: at most %d bytes", p.Datagram, lab.MaxDatagram)
	}
	if p.SourcePort != 0 && p.proto == "SCTP" {
		bad("sourcePort: TCP and UDP only")
	}
	if t := p.Transfer; t != nil {
		if t.Download == 0 && t.Upload == 0 {
			bad("transfer: download, upload or both")
		}
		errs = append(errs, checkStall("transfer", t.Stall)...)
	}
	if s := p.Stream; s != nil {
		if s.HalfClose != "client" && s.HalfClose != "server" {
			bad("stream.halfClose %q: want client or server", s.HalfClose)
		}
		if s.Duration <= 0 || time.Duration(s.Duration) > 5*time.Minute {
			bad("stream.duration %v: want 0 < duration <= 5m", time.Duration(s.Duration))
		}
		if s.Interval < 0 || s.Interval > s.Duration {
			bad("stream.interval %v: want 0 < interval <= duration", time.Duration(s.Interval))
		}
		if s.Chunk > 1<<20 {
			bad("stream.chunk %s: at most 1MiB", s.Chunk)
		}
		errs = append(errs, checkStall("stream", s.Stall)...)
	}
	return errs
}

func checkStall(where string, d Duration) []error {
	if d < 0 || time.Duration(d) > time.Minute {
		return []error{fmt.Errorf("%s.stall %v: want at most 1m", where, time.Duration(d))}
	}
	return nil
}

func (s *Session) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Name == "" {
		bad("name is required")
	}
	if !s.From.IP.IsValid() {
		bad("from is required")
	}
	var err error
	if s.to, err = parseTo(s.To); err != nil {
		errs = append(errs, err)
	} else if s.From.IP.IsValid() && s.From.IP.Is4() != s.to.Addr().Is4() {
		bad("from %s and to %s are of different families", s.From.IP, s.to)
	}
	if s.SourcePort == 0 {
		bad("sourcePort is required (a session is one client port)")
	}
	if s.Datagram > lab.MaxDatagram {
		bad("datagram %d: at most %d bytes", s.Datagram, lab.MaxDatagram)
	}
	if s.Interval < 0 || (s.Interval > 0 && time.Duration(s.Interval) < 10*time.Millisecond) || time.Duration(s.Interval) > 10*time.Second {
		bad("interval %v: want 10ms..10s", time.Duration(s.Interval))
	}
	errs = append(errs, checkAwait(s.Expect, s.Within)...)
	return errs
}

func checkAwait(e Expect, within Duration) []error {
	var errs []error
	if len(e.Members) == 0 {
		errs = append(errs, errors.New("expect: a list of ip:port (the backends that must answer)"))
	}
	if within < 0 || time.Duration(within) > time.Minute {
		errs = append(errs, fmt.Errorf("within %v: want at most 1m", time.Duration(within)))
	}
	return errs
}

func orDefault[T ~int64](v T, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// transferSpec is the lab's form of a TCP version 2 probe. A probe with
// only sourcePort moves no data: greeting, empty transfer, server closes.
func (p *Probe) transferSpec() lab.TransferSpec {
	spec := lab.TransferSpec{Connect: p.timeout()}
	switch {
	case p.Transfer != nil:
		spec.Download, spec.Upload = int64(p.Transfer.Download), int64(p.Transfer.Upload)
		spec.Stall = time.Duration(p.Transfer.Stall)
		// Generous (an emulated VM moves 20 MiB in seconds), yet bounded:
		// a broken datapath that trickles by retransmits never trips the
		// stall check, and must not hold the run for minutes.
		spec.Timeout = 20*time.Second + time.Duration(spec.Download+spec.Upload)/(1<<20)*time.Second
	case p.Stream != nil:
		spec.HalfClose = lab.HalfCloseClient
		if p.Stream.HalfClose == "server" {
			spec.HalfClose = lab.HalfCloseServer
		}
		spec.Stream = time.Duration(p.Stream.Duration)
		spec.Interval = time.Duration(p.Stream.Interval)
		spec.ChunkSize = int(p.Stream.Chunk)
		spec.Stall = time.Duration(p.Stream.Stall)
	}
	return spec
}

// v2Try runs one try of a version 2 probe; ok is false when the probe is
// version 1 (the caller dials as before).
func (w *world) v2Try(c client, p *Probe) (try, bool) {
	if len(p.usesV2()) == 0 {
		return try{}, false
	}
	src := netip.AddrPortFrom(c.src, p.SourcePort)
	switch p.proto {
	case "TCP":
		res, err := lab.Transfer(c.ns, src, p.to, p.transferSpec())
		t := try{verdict: lab.Classify(err), reply: res.Server, err: err}
		if err != nil && res.Server.Local.IsValid() {
			// Connected and greeted: whatever failed after that is the
			// datapath losing data, not a REJECT or DROP.
			t.verdict = lab.Failed
		}
		if err == nil {
			t.note = transferNote(res)
		}
		return t, true
	case "UDP":
		r, err := lab.UDPExchange(c.ns, src, p.to, int(orDefault(p.Datagram, 64)), p.timeout())
		return try{verdict: lab.Classify(err), reply: r.Server, err: err}, true
	}
	return try{verdict: lab.Failed, err: fmt.Errorf("%s: no version 2 probe", p.proto)}, true
}

func transferNote(r lab.TransferResult) string {
	var parts []string
	if r.Chunks > 0 {
		parts = append(parts, fmt.Sprintf("%d chunks", r.Chunks))
	} else {
		if r.Downloaded > 0 {
			parts = append(parts, ByteSize(r.Downloaded).String()+" down")
		}
		if r.Uploaded > 0 {
			parts = append(parts, ByteSize(r.Uploaded).String()+" up")
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "connected")
	}
	return strings.Join(parts, " + ") + " in " + r.Duration.Round(time.Millisecond).String()
}

// trafficString describes a version 2 probe's traffic for the expected
// column.
func (p *Probe) trafficString() string {
	var parts []string
	if t := p.Transfer; t != nil {
		if t.Download > 0 {
			parts = append(parts, t.Download.String()+" down")
		}
		if t.Upload > 0 {
			parts = append(parts, t.Upload.String()+" up")
		}
	}
	if s := p.Stream; s != nil {
		parts = append(parts, fmt.Sprintf("%s half-close, %v stream", s.HalfClose, time.Duration(s.Duration)))
	}
	if p.Datagram > 0 {
		parts = append(parts, fmt.Sprintf("%d-byte datagrams", p.Datagram))
	}
	if p.SourcePort > 0 {
		parts = append(parts, fmt.Sprintf("source port %d", p.SourcePort))
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ") + ", intact"
}

// holdBulk opens a held connection with data flowing both ways (a hold
// with only a sourcePort flows too, at the default rate: version 1's echo
// check cannot bind a port).
func (w *world) holdBulk(h *Hold, c client) (string, bool) {
	var rate ByteSize
	if h.Bulk != nil {
		rate = h.Bulk.Rate
	}
	hs, err := lab.StartHeldStream(c.ns, netip.AddrPortFrom(c.src, h.SourcePort), h.to, lab.HeldSpec{Rate: int(rate), Timeout: DefaultTimeout})
	if err != nil {
		t := try{verdict: lab.Classify(err), err: err}
		return fmt.Sprintf("%s (%v)", t.outcome(h.to), err), false
	}
	w.held[h.Name] = hs
	return "connected to " + (try{verdict: lab.OK, reply: hs.Server}).outcome(h.to) + ", data flowing both ways", true
}

// checkBulk waits for everything a bulk hold sent to come back intact.
func checkBulk(hs *lab.HeldStream, want bool) (string, bool) {
	st, err := hs.Check(5 * time.Second)
	if err != nil {
		return fmt.Sprintf("broken (%v)", err), !want
	}
	return fmt.Sprintf("alive, %s each way intact", ByteSize(st.Bytes)), want
}

// startSession opens a UDP session and awaits its first backend.
func (w *world) startSession(s *Session) (string, bool) {
	c, err := w.clientFor(s.From)
	if err != nil {
		return "ERROR: " + err.Error(), false
	}
	spec := lab.UDPSpec{Size: int(orDefault(s.Datagram, 64)), Interval: time.Duration(s.Interval)}
	start := time.Now()
	us, err := lab.StartUDPSession(c.ns, netip.AddrPortFrom(c.src, s.SourcePort), s.to, spec)
	if err != nil {
		return "ERROR: " + err.Error(), false
	}
	w.sessions[s.Name] = &session{us, start}
	return awaitOn(us, start, s.Expect, s.Within)
}

func (w *world) await(a *Await) (string, bool) {
	s, ok := w.sessions[a.Session]
	if !ok {
		return "ERROR: session " + a.Session + " was never started", false
	}
	since := s.start
	if w.changed.After(since) {
		since = w.changed
	}
	return awaitOn(s.us, since, a.Expect, a.Within)
}

// session is a running UDP session and when it started.
type session struct {
	us    *lab.UDPSession
	start time.Time
}

func awaitOn(us *lab.UDPSession, since time.Time, e Expect, within Duration) (string, bool) {
	// within counts from the change, not from this step: a second await
	// after the same change gets no extra time.
	left := max(0, time.Duration(orDefault(within, Duration(DefaultWithin)))-time.Since(since))
	r, err := us.Await(since, left, e.Members...)
	if err != nil {
		return err.Error(), false
	}
	return fmt.Sprintf("%s answered seq %d, sent %v in, peer=%s", r.Server.Local, r.Seq, r.Sent.Sub(since).Round(time.Millisecond), r.Server.Peer), true
}
