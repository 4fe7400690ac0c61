package reconcile

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func backendsN(n int, weight uint16) []tableBackend {
	bs := make([]tableBackend, n)
	for i := range bs {
		bs[i] = tableBackend{id: uint32(100 + i), weight: weight, name: fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250)}
	}
	return bs
}

func TestMaglevEvenAndStable(t *testing.T) {
	const m = DefaultMaglevSize
	bs := backendsN(10, 1)
	table, err := maglevTable(bs, m)
	if err != nil {
		t.Fatal(err)
	}
	count := map[uint32]int{}
	for _, id := range table {
		count[id]++
	}
	if len(count) != 10 {
		t.Fatalf("%d backends in the table, want 10", len(count))
	}
	for id, c := range count {
		// Maglev's guarantee: entries per backend differ by at most
		// about N/M in share; at M=16381, N=10 each gets 1638 +- 1.
		if c < m/10-1 || c > m/10+1 {
			t.Errorf("backend %d has %d entries, want %d +- 1", id, c, m/10)
		}
	}
	// Order of the input does not matter.
	rev := append([]tableBackend(nil), bs...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	again, _ := maglevTable(rev, m)
	for i := range table {
		if table[i] != again[i] {
			t.Fatalf("entry %d differs with the input reversed", i)
		}
	}
	// Removing one of 10 backends moves its own ~1/10 and little else.
	fewer, _ := maglevTable(bs[1:], m)
	moved := 0
	for i := range table {
		if table[i] != fewer[i] && table[i] != bs[0].id {
			moved++
		}
	}
	if frac := float64(moved) / m; frac > 0.03 {
		t.Errorf("%.1f%% of the entries of surviving backends moved, want under 3%%", 100*frac)
	}
}

func TestMaglevWeights(t *testing.T) {
	bs := backendsN(2, 1)
	bs[0].weight = 3
	table, _ := maglevTable(bs, DefaultMaglevSize)
	n := 0
	for _, id := range table {
		if id == bs[0].id {
			n++
		}
	}
	if share := float64(n) / DefaultMaglevSize; share < 0.74 || share > 0.76 {
		t.Fatalf("weight 3 of 4 got %.3f of the table", share)
	}
}

func TestValidMaglevSize(t *testing.T) {
	for m, ok := range map[uint32]bool{16381: true, 65521: true, 251: true, 16384: false, 100: false, 1 << 21: false} {
		if err := ValidMaglevSize(m); (err == nil) != ok {
			t.Errorf("ValidMaglevSize(%d) = %v", m, err)
		}
	}
}

func TestWRRSequence(t *testing.T) {
	bs := backendsN(3, 1)
	bs[0].weight, bs[1].weight, bs[2].weight = 4, 2, 2
	seq := wrrSequence(bs)
	// gcd 2: weights 2,1,1; cycle: cw=2 -> a; cw=1 -> a b c.
	want := []uint32{100, 100, 101, 102}
	if fmt.Sprint(seq) != fmt.Sprint(want) {
		t.Fatalf("sequence %v, want %v", seq, want)
	}
	big := backendsN(1000, 1000)
	big[0].weight = 65535
	if n := len(wrrSequence(big)); n > maxWRRSequence+1000 {
		t.Fatalf("sequence of %d entries", n)
	}
}

// wrrStepwise is the IPVS cycle step by step, as ip_vs_wrr.c walks it: the
// reference wrrSequence must build the same sequence as.
func wrrStepwise(backends []tableBackend) []uint32 {
	ws := make([]int, len(backends))
	g := 0
	for i, b := range backends {
		ws[i] = int(max(b.weight, 1))
		g = gcd(g, ws[i])
	}
	mw := 0
	for i := range ws {
		ws[i] /= g
		mw = max(mw, ws[i])
	}
	var seq []uint32
	for cw := mw; cw > 0; cw-- {
		for i, b := range backends {
			if ws[i] >= cw {
				seq = append(seq, b.id)
			}
		}
	}
	return seq
}

// TestWRRSequenceMatchesStepwise: random weight sets (small, repeated, one
// large among small ones) give the stepwise cycle's sequence.
func TestWRRSequenceMatchesStepwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 500 {
		n := 1 + rng.IntN(40)
		bs := backendsN(n, 1)
		for i := range bs {
			switch round % 3 {
			case 0:
				bs[i].weight = uint16(1 + rng.IntN(10))
			case 1:
				bs[i].weight = uint16(1 + rng.IntN(300))
			default:
				bs[i].weight = uint16([]int{1, 2, 4, 100}[rng.IntN(4)])
			}
		}
		if got, want := wrrSequence(bs), wrrStepwise(bs); !slices.Equal(got, want) {
			t.Fatalf("weights %v: sequence of %d, want the stepwise %d", weightsOf(bs), len(got), len(want))
		}
	}
}

func weightsOf(bs []tableBackend) []uint16 {
	var ws []uint16
	for _, b := range bs {
		ws = append(ws, b.weight)
	}
	return ws
}

// BenchmarkWRRSkewed: one weight of 65535 among 1000 of weight 1 (the
// stepwise build walked 65M steps, 99 ms).
func BenchmarkWRRSkewed(b *testing.B) {
	bs := backendsN(1000, 1)
	bs[0].weight = 65535
	for b.Loop() {
		wrrSequence(bs)
	}
}

func BenchmarkWRRSkewedStepwise(b *testing.B) {
	bs := backendsN(1000, 1)
	bs[0].weight = 65535
	for b.Loop() {
		wrrStepwise(bs)
	}
}

func BenchmarkMaglev1000(b *testing.B) {
	bs := backendsN(1000, 1)
	for b.Loop() {
		if _, err := maglevTable(bs, DefaultMaglevSize); err != nil {
			b.Fatal(err)
		}
	}
}
