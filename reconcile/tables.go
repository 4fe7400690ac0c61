package reconcile

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/big"
	"slices"

	"github.com/xvs-lb/xvs/maps"
)

// DefaultMaglevSize is the Maglev lookup table size, a prime as the
// algorithm requires; IPVS's mh uses 65521, Cilium 16381.
const DefaultMaglevSize = 16381

// maxWRRSequence bounds a wrr sequence; weights are scaled down (keeping
// their ratios as closely as integers allow) when one cycle would be longer.
const maxWRRSequence = 1 << 16

// tableBackend is one entry of a slot set as the table builders see it.
type tableBackend struct {
	id     uint32
	weight uint16
	// name is stable across agents and restarts (the backend's
	// address:port), so that every node builds the same Maglev table.
	// The datapath fills it from key only for services that have a table.
	name string
	key  maps.BackendKey
}

// ValidMaglevSize checks that m is a usable Maglev table size: a prime
// large enough to spread backends evenly.
func ValidMaglevSize(m uint32) error {
	if m < 251 || m > 1<<20 {
		return fmt.Errorf("maglev table size %d: must be a prime between 251 and %d", m, 1<<20)
	}
	if !big.NewInt(int64(m)).ProbablyPrime(0) {
		return fmt.Errorf("maglev table size %d is not a prime", m)
	}
	return nil
}

// maglevTable builds the Maglev lookup table (Eisenbud et al., NSDI 2016,
// section 3.4) of size m over the backends: each backend walks its own
// permutation of the table (offset and skip from two hashes of its name)
// and claims the next free entry when its turn comes; a backend of weight w
// gets w turns per round. The result depends only on the set of backends,
// never on their order, so removing one of N backends moves about 1/N of
// the entries.
func maglevTable(backends []tableBackend, m uint32) ([]uint32, error) {
	if len(backends) == 0 {
		return nil, errors.New("maglev: no backends")
	}
	bs := slices.Clone(backends)
	slices.SortFunc(bs, func(a, b tableBackend) int { return cmpString(a.name, b.name) })
	offset := make([]uint32, len(bs))
	skip := make([]uint32, len(bs))
	next := make([]uint32, len(bs))
	for i, b := range bs {
		h1, h2 := maglevHashes(b.name)
		offset[i] = uint32(h1 % uint64(m))
		skip[i] = uint32(h2%uint64(m-1)) + 1
	}
	const empty = ^uint32(0)
	table := make([]uint32, m)
	for i := range table {
		table[i] = empty
	}
	filled := uint32(0)
	for filled < m {
		for i, b := range bs {
			for range max(b.weight, 1) {
				// Next free entry of backend i's permutation.
				for {
					c := (offset[i] + next[i]*skip[i]) % m
					next[i]++
					if table[c] == empty {
						table[c] = b.id
						filled++
						break
					}
				}
				if filled == m {
					return table, nil
				}
			}
		}
	}
	return table, nil
}

func maglevHashes(name string) (uint64, uint64) {
	h := fnv.New64a()
	h.Write([]byte(name))
	a := h.Sum64()
	h.Write([]byte{0x9e, 0x37, 0x79, 0xb9})
	return a, h.Sum64()
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// wrrSequence is one cycle of IPVS's weighted round robin
// (ip_vs_wrr.c): the current weight steps down from the largest weight by
// the weights' gcd, and each step takes, in order, every backend whose
// weight is at least the current weight. A backend of weight w appears w/gcd
// times per cycle, interleaved with the others.
//
// Between two of the weights that occur the steps take the same backends,
// so the sequence is built one distinct weight at a time: O(n) per
// distinct weight plus the sequence's length, which is at least half the
// square of the distinct weights' count (they are distinct integers); so
// linear in its length (not in the largest weight times n, 65M steps for
// one weight of 65535 among 1000).
func wrrSequence(backends []tableBackend) []uint32 {
	ws := make([]int, len(backends))
	total := 0
	for i, b := range backends {
		ws[i] = int(max(b.weight, 1))
		total += ws[i]
	}
	g := 0
	for _, w := range ws {
		g = gcd(g, w)
	}
	for i := range ws {
		ws[i] /= g
	}
	total /= g
	if total > maxWRRSequence {
		scale := float64(maxWRRSequence) / float64(total)
		for i := range ws {
			ws[i] = max(1, int(float64(ws[i])*scale))
		}
	}
	levels := slices.Clone(ws)
	slices.Sort(levels)
	levels = slices.Compact(levels)
	slices.Reverse(levels)
	length := 0
	for _, w := range ws {
		length += w
	}
	seq := make([]uint32, 0, length)
	active := make([]uint32, 0, len(backends))
	for li, lw := range levels {
		// Every step cw in (next, lw] takes the backends weighing lw or
		// more, in slot order.
		active = active[:0]
		for i, b := range backends {
			if ws[i] >= lw {
				active = append(active, b.id)
			}
		}
		next := 0
		if li+1 < len(levels) {
			next = levels[li+1]
		}
		for range lw - next {
			seq = append(seq, active...)
		}
	}
	return seq
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// MaglevTable builds the mh lookup table of size m for backends known by
// their names (weight 1 each, IDs 0..n-1): the agent's own builder, for
// benchmarks and tools.
func MaglevTable(names []string, m uint32) ([]uint32, error) {
	if err := ValidMaglevSize(m); err != nil {
		return nil, err
	}
	bs := make([]tableBackend, len(names))
	for i, n := range names {
		bs[i] = tableBackend{id: uint32(i), weight: 1, name: n}
	}
	return maglevTable(bs, m)
}
