package lab

// Real traffic for the datapath: megabytes each way, half-closed streams,
// large and fragmented UDP datagrams, long-lived connections. A 16-byte
// probe proves a SYN was answered; these prove the flow survives what
// real clients do to a load balancer (tracker issue 13).
//
// # The bulk protocol
//
// A BulkServer is an EchoServer first: every TCP connection starts with the
// Greeting line (so DialTCP, EchoCheck and the conformance greeting work
// against it unchanged, and every bulk client learns which backend served
// it and the peer address that backend saw). A connection whose first bytes
// are "xvs-bulk " carries one request line; any other connection is echoed.
//
//	xvs-bulk transfer down=N up=M seed=S
//	    The server sends N bytes of the download stream and, at the same
//	    time, reads M bytes of the upload stream (the client sends them
//	    right after the request); then it sends
//	        xvs-done up=M sha256=HEX local=ADDR:PORT peer=ADDR:PORT
//	    (what it received, hashed) and closes first, so a client with a
//	    fixed source port leaves no TIME_WAIT socket behind.
//	xvs-bulk stream half=client chunks=K interval=D size=B seed=S
//	    The client shuts its write side after the request. The server sends
//	    K chunks, one every D (the first at once), each
//	        xvs-chunk seq=I eof=0|1
//	    followed by B bytes of the download stream; eof says whether the
//	    client's FIN had arrived when the chunk left. Then
//	        xvs-end chunks=K eof=0|1
//	    and it closes. The client checks every chunk, in order, intact.
//	xvs-bulk stream half=server chunks=K interval=D size=B seed=S
//	    The server shuts its write side at once and reads K chunks of the
//	    same shape from the client (eof=0), one every D, then the client's
//	    FIN. It cannot answer any more, so the acknowledgement is TCP's
//	    own: the client waits, after every chunk, until the server's kernel
//	    has acknowledged every byte (SIOCOUTQ is 0), and at the end until
//	    its FIN is acknowledged (the socket reaches CLOSE). What the server
//	    application saw is checked too, and kept in BulkServer.Errors.
//
// Data streams are ChaCha8 keystreams keyed by (seed, direction), so both
// ends generate the same bytes and a receiver names the first wrong byte's
// offset, not just a digest mismatch.
//
// UDP: a datagram starting with "xvs-udp " is
//
//	xvs-udp seq=I size=N seed=S\n + padding (the "udp" stream of seq I) to N bytes
//
// answered by a datagram of the same size
//
//	xvs-udp-reply seq=I size=N ok=1|0 local=ADDR:PORT peer=ADDR:PORT\n + padding ("udp-reply")
//
// where ok says the request arrived whole and intact. Any other datagram
// gets the Greeting, as from an EchoServer. Sizes up to MaxDatagram, so both
// directions are fragmented when the size passes the path MTU.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	bulkMagic = "xvs-bulk "
	udpMagic  = "xvs-udp "
	// MaxDatagram is the largest UDP datagram the bulk protocol carries:
	// IPv4's 65535-byte limit less headers, rounded down.
	MaxDatagram = 65000
	maxLine     = 512
)

// Stream directions: each keys its own keystream.
const (
	dirDown     = "down"
	dirUp       = "up"
	dirHeld     = "held"
	dirUDP      = "udp"
	dirUDPReply = "udp-reply"
)

// newStream returns the deterministic byte stream for (seed, dir, n); n
// separates the datagrams of one seed.
func newStream(seed uint64, dir string, n uint64) *rand.ChaCha8 {
	return rand.NewChaCha8(sha256.Sum256(fmt.Appendf(nil, "xvs-bulk/%d/%s/%d", seed, dir, n)))
}

// verifier compares received bytes with the stream they must equal and
// hashes them.
type verifier struct {
	want *rand.ChaCha8
	buf  []byte
	n    int64 // bytes checked
	bad  int64 // offset of the first wrong byte, -1 if none
	sum  hashWriter
}

func newVerifier(seed uint64, dir string) *verifier {
	return &verifier{want: newStream(seed, dir, 0), bad: -1, sum: hashWriter{sha256.New()}}
}

func (v *verifier) Write(p []byte) (int, error) {
	if cap(v.buf) < len(p) {
		v.buf = make([]byte, len(p))
	}
	w := v.buf[:len(p)]
	v.want.Read(w)
	if v.bad < 0 {
		for i := range p {
			if p[i] != w[i] {
				v.bad = v.n + int64(i)
				break
			}
		}
	}
	v.sum.Write(p)
	v.n += int64(len(p))
	return len(p), nil
}

// hashWriter is a SHA-256 that prints as hex.
type hashWriter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
}

func (h hashWriter) Write(p []byte) (int, error) { return h.h.Write(p) }
func (h hashWriter) hex() string                 { return hex.EncodeToString(h.h.Sum(nil)) }

// request is a parsed "xvs-bulk" line.
type request struct {
	op       string // "transfer" or "stream"
	down, up int64
	half     HalfClose
	chunks   int
	interval time.Duration
	size     int
	seed     uint64
}

func (r request) String() string {
	if r.op == "transfer" {
		return fmt.Sprintf("%stransfer down=%d up=%d seed=%d\n", bulkMagic, r.down, r.up, r.seed)
	}
	return fmt.Sprintf("%sstream half=%s chunks=%d interval=%s size=%d seed=%d\n", bulkMagic, r.half, r.chunks, r.interval, r.size, r.seed)
}

// fields parses "k=v" words after skip leading words.
func fields(line string, skip int) (map[string]string, []string) {
	f := strings.Fields(line)
	kv := map[string]string{}
	if len(f) < skip {
		return kv, f
	}
	for _, w := range f[skip:] {
		k, v, _ := strings.Cut(w, "=")
		kv[k] = v
	}
	return kv, f
}

func parseRequest(line string) (request, error) {
	kv, f := fields(line, 2)
	if len(f) < 2 || f[0]+" " != bulkMagic {
		return request{}, fmt.Errorf("not a bulk request: %q", line)
	}
	r := request{op: f[1]}
	var errs []error
	num := func(k string) int64 {
		n, err := strconv.ParseInt(kv[k], 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%s=%q", k, kv[k]))
		}
		return n
	}
	seed, err := strconv.ParseUint(kv["seed"], 10, 64)
	errs = append(errs, err)
	r.seed = seed
	switch r.op {
	case "transfer":
		r.down, r.up = num("down"), num("up")
	case "stream":
		r.chunks, r.size = int(num("chunks")), int(num("size"))
		r.interval, err = time.ParseDuration(kv["interval"])
		errs = append(errs, err)
		switch kv["half"] {
		case "client":
			r.half = HalfCloseClient
		case "server":
			r.half = HalfCloseServer
		default:
			errs = append(errs, fmt.Errorf("half=%q", kv["half"]))
		}
		if r.size > 1<<20 || r.chunks > 1<<20 {
			errs = append(errs, errors.New("chunks or size too large"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown op %q", r.op))
	}
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("bad bulk request %q: %w", line, err)
	}
	return r, nil
}

// BulkServer serves the bulk protocol (and the echo greeting) inside one
// namespace, on TCP and UDP.
type BulkServer struct {
	TCPAddr netip.AddrPort // bound TCP address, zero if TCP was not asked for
	UDPAddr netip.AddrPort // bound UDP address, zero if UDP was not asked for

	echo *EchoServer // owns the sockets; its handlers are replaced by ours
	mu   sync.Mutex
	errs []error
}

// StartBulk listens on addr inside ns for the given protocols (TCP and UDP
// when none given), like StartEcho (same port and wildcard rules), and
// serves the bulk protocol. The lab's Close stops it.
func StartBulk(ns *NS, addr netip.AddrPort, protos ...Proto) (*BulkServer, error) {
	s := &BulkServer{}
	e, err := startEcho(ns, addr, protos, s)
	if err != nil {
		return nil, err
	}
	s.echo, s.TCPAddr, s.UDPAddr = e, e.TCPAddr, e.UDPAddr
	return s, nil
}

// Close stops the listeners and tears down open connections.
func (s *BulkServer) Close() error { return s.echo.Close() }

// Errors returns what went wrong in the sessions served so far: requests
// that did not parse, uploads or half-close streams that arrived corrupt
// or incomplete. Transfer sees most of these from the client side too;
// a server half-close stream is only seen here.
func (s *BulkServer) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

func (s *BulkServer) fail(peer netip.AddrPort, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) < 100 {
		s.errs = append(s.errs, fmt.Errorf("session from %s: %w", peer, err))
	}
}

// serveTCP runs after the greeting was sent: bulk request or echo.
func (s *BulkServer) serveTCP(c *net.TCPConn, local, peer netip.AddrPort) {
	br := bufio.NewReaderSize(c, 64<<10)
	if !hasMagic(br) {
		io.Copy(c, br)
		return
	}
	line, err := readLineFrom(br)
	var r request
	if err == nil {
		r, err = parseRequest(line)
	}
	if err != nil {
		s.fail(peer, err)
		return
	}
	switch {
	case r.op == "transfer":
		err = serveTransfer(c, br, r, local, peer)
	case r.half == HalfCloseClient:
		err = serveStreamDown(c, br, r)
	default:
		err = serveStreamUp(c, br, r)
	}
	if err != nil {
		s.fail(peer, err)
	}
}

// hasMagic reads until the first bytes are bulkMagic or cannot become it,
// without consuming them. A client that sends a strict prefix of the magic
// and waits is the only one this stalls.
func hasMagic(br *bufio.Reader) bool {
	for {
		b, _ := br.Peek(br.Buffered())
		if !strings.HasPrefix(bulkMagic, string(b[:min(len(b), len(bulkMagic))])) {
			return false
		}
		if len(b) >= len(bulkMagic) {
			return true
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			return false
		}
	}
}

func readLineFrom(br *bufio.Reader) (string, error) {
	var b []byte
	for len(b) < maxLine {
		c, err := br.ReadByte()
		if err != nil {
			return string(b), err
		}
		if c == '\n' {
			return string(b), nil
		}
		b = append(b, c)
	}
	return string(b), errors.New("line too long")
}

// serveTransfer sends the download while it reads the upload, then the
// digest of the upload, and closes.
func serveTransfer(c *net.TCPConn, br *bufio.Reader, r request, local, peer netip.AddrPort) error {
	sent := make(chan error, 1)
	go func() {
		_, err := io.CopyN(c, newStream(r.seed, dirDown, 0), r.down)
		sent <- err
	}()
	v := newVerifier(r.seed, dirUp)
	_, rerr := io.CopyN(v, br, r.up)
	if err := <-sent; err != nil {
		return fmt.Errorf("download: sent %d bytes: %w", r.down, err)
	}
	if rerr != nil {
		return fmt.Errorf("upload: received %d of %d bytes: %w", v.n, r.up, rerr)
	}
	_, err := fmt.Fprintf(c, "xvs-done up=%d sha256=%s local=%s peer=%s\n", v.n, v.sum.hex(), local, peer)
	if err == nil && v.bad >= 0 {
		err = fmt.Errorf("upload corrupt at byte %d", v.bad)
	}
	return err
}

// serveStreamDown streams chunks to a client that has shut its write side.
func serveStreamDown(c *net.TCPConn, br *bufio.Reader, r request) error {
	eof := make(chan struct{})
	go func() { // the client's FIN, and nothing before it
		io.Copy(io.Discard, br)
		close(eof)
	}()
	seen := func() int {
		select {
		case <-eof:
			return 1
		default:
			return 0
		}
	}
	data := newStream(r.seed, dirDown, 0)
	chunk := make([]byte, r.size)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for i := range r.chunks {
		if i > 0 {
			<-tick.C
		}
		data.Read(chunk)
		if _, err := fmt.Fprintf(c, "xvs-chunk seq=%d eof=%d\n", i, seen()); err != nil {
			return fmt.Errorf("stream: chunk %d: %w", i, err)
		}
		if _, err := c.Write(chunk); err != nil {
			return fmt.Errorf("stream: chunk %d: %w", i, err)
		}
	}
	_, err := fmt.Fprintf(c, "xvs-end chunks=%d eof=%d\n", r.chunks, seen())
	return err
}

// serveStreamUp shuts the write side and reads the client's chunks.
func serveStreamUp(c *net.TCPConn, br *bufio.Reader, r request) error {
	if err := c.CloseWrite(); err != nil {
		return err
	}
	_, err := readChunks(br, r, nil)
	if err != nil {
		return err
	}
	if n, _ := br.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("stream: data after chunk %d", r.chunks-1)
	}
	return nil
}

// chunkHeader parses "xvs-chunk seq=I eof=E".
func chunkHeader(line string) (seq int, eof bool, err error) {
	kv, f := fields(line, 1)
	if len(f) != 3 || f[0] != "xvs-chunk" {
		return 0, false, fmt.Errorf("not a chunk header: %q", line)
	}
	seq, err = strconv.Atoi(kv["seq"])
	return seq, kv["eof"] == "1", err
}

// readChunks reads r.chunks chunks, checking order and content; each
// chunk's eof flag goes to onChunk. It returns how many arrived whole.
func readChunks(br *bufio.Reader, r request, onChunk func(seq int, eof bool)) (int, error) {
	want := newStream(r.seed, dirDown, 0)
	exp, got := make([]byte, r.size), make([]byte, r.size)
	for i := range r.chunks {
		line, err := readLineFrom(br)
		if err != nil {
			return i, fmt.Errorf("chunk %d of %d missing: %w", i, r.chunks, err)
		}
		seq, eof, err := chunkHeader(line)
		if err != nil {
			return i, fmt.Errorf("chunk %d: %w", i, err)
		}
		if seq != i {
			return i, fmt.Errorf("chunk %d missing: got chunk %d", i, seq)
		}
		if _, err := io.ReadFull(br, got); err != nil {
			return i, fmt.Errorf("chunk %d cut short: %w", i, err)
		}
		want.Read(exp)
		if !bytes.Equal(got, exp) {
			return i, fmt.Errorf("chunk %d corrupt", i)
		}
		if onChunk != nil {
			onChunk(i, eof)
		}
	}
	return r.chunks, nil
}

// serveUDPBulk answers one "xvs-udp" datagram; reply is nil when it is not
// one (the caller greets instead).
func serveUDPBulk(dgram []byte, local, peer netip.AddrPort) []byte {
	if !bytes.HasPrefix(dgram, []byte(udpMagic)) {
		return nil
	}
	h, err := parseUDPHeader(dgram, "xvs-udp")
	if err != nil {
		return []byte(Greeting(local, peer)) // not ours after all
	}
	ok := 0
	if len(dgram) == max(h.size, h.len) && udpPaddingOK(dgram, h.seed, dirUDP, h.seq) {
		ok = 1
	}
	return udpDatagram(fmt.Sprintf("xvs-udp-reply seq=%d size=%d ok=%d local=%s peer=%s\n", h.seq, h.size, ok, local, peer), h.size, h.seed, dirUDPReply, h.seq)
}

type udpHeader struct {
	seq, seed uint64
	size      int
	ok        bool
	reply     Reply
	len       int // header length, newline included
}

func parseUDPHeader(d []byte, tag string) (udpHeader, error) {
	var h udpHeader
	i := bytes.IndexByte(d[:min(len(d), maxLine)], '\n')
	if i < 0 {
		return h, errors.New("no header line")
	}
	h.len = i + 1
	kv, f := fields(string(d[:i]), 1)
	if len(f) == 0 || f[0] != tag {
		return h, fmt.Errorf("not %s: %q", tag, d[:i])
	}
	var e1, e2, e3 error
	h.seq, e1 = strconv.ParseUint(kv["seq"], 10, 64)
	h.size, e2 = strconv.Atoi(kv["size"])
	if s, ok := kv["seed"]; ok {
		h.seed, e3 = strconv.ParseUint(s, 10, 64)
	}
	h.ok = kv["ok"] == "1"
	if l, ok := kv["local"]; ok {
		h.reply.Local, e3 = netip.ParseAddrPort(l)
		if e3 == nil {
			h.reply.Peer, e3 = netip.ParseAddrPort(kv["peer"])
		}
	}
	return h, errors.Join(e1, e2, e3)
}

// udpDatagram is header padded to size bytes with the (seed, dir, seq)
// stream; a header longer than size is sent whole.
func udpDatagram(header string, size int, seed uint64, dir string, seq uint64) []byte {
	d := make([]byte, max(size, len(header)))
	copy(d, header)
	newStream(seed, dir, seq).Read(d[len(header):])
	return d
}

func udpPaddingOK(d []byte, seed uint64, dir string, seq uint64) bool {
	i := bytes.IndexByte(d, '\n')
	want := make([]byte, len(d)-i-1)
	newStream(seed, dir, seq).Read(want)
	return bytes.Equal(d[i+1:], want)
}
