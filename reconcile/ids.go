package reconcile

import (
	"fmt"
	"math/bits"
)

// idSpace hands out small integer IDs (they key the per-CPU counters
// and the backends map) from 1..max-1; 0 means "none". A bitmap records
// which are taken: at a million backends it is 128 KiB, where a map from
// ID to owner cost tens of megabytes.
type idSpace struct {
	max   uint32
	next  uint32
	taken []uint64
}

func newIDSpace(max uint32) idSpace {
	return idSpace{max: max, next: 1, taken: make([]uint64, (uint64(max)+63)/64)}
}

func (s *idSpace) isTaken(id uint32) bool {
	return id < s.max && s.taken[id/64]&(1<<(id%64)) != 0
}

// alloc takes the next free ID after the last one handed out, so that a
// released ID (whose counters may still be read) is reused as late as
// possible.
func (s *idSpace) alloc() (uint32, error) {
	for scanned := uint32(0); scanned < s.max; {
		w := s.next / 64
		free := ^s.taken[w] &^ (1<<(s.next%64) - 1) // free IDs >= next in this word
		if w == 0 {
			free &^= 1 // ID 0 is never handed out
		}
		if free != 0 {
			id := w*64 + uint32(bits.TrailingZeros64(free))
			if id < s.max {
				s.taken[w] |= 1 << (id % 64)
				s.next = id + 1
				if s.next >= s.max {
					s.next = 1
				}
				return id, nil
			}
		}
		scanned += 64 - s.next%64
		s.next = (w + 1) * 64
		if s.next >= s.max {
			s.next = 1
		}
	}
	return 0, fmt.Errorf("all %d IDs in use", s.max-1)
}

// claim marks an ID found in the pinned maps as taken.
func (s *idSpace) claim(id uint32) bool {
	if id == 0 || id >= s.max {
		return false
	}
	s.taken[id/64] |= 1 << (id % 64)
	if id >= s.next {
		s.next = id + 1
		if s.next >= s.max {
			s.next = 1
		}
	}
	return true
}

func (s *idSpace) free(id uint32) {
	if id != 0 && id < s.max {
		s.taken[id/64] &^= 1 << (id % 64)
	}
}

// idAlloc is an idSpace whose IDs belong to keys, and stay with their key
// for as long as it lives, including across agent restarts: the datapath
// seeds it from the pinned maps.
type idAlloc[K comparable] struct {
	idSpace
	ids map[K]uint32
}

func newIDAlloc[K comparable](max uint32) *idAlloc[K] {
	return &idAlloc[K]{idSpace: newIDSpace(max), ids: map[K]uint32{}}
}

// get returns k's ID, allocating one when k has none; fresh reports a new
// allocation (whose counters the caller must reset).
func (a *idAlloc[K]) get(k K) (id uint32, fresh bool, err error) {
	if id, ok := a.ids[k]; ok {
		return id, false, nil
	}
	id, err = a.alloc()
	if err != nil {
		return 0, false, err
	}
	a.ids[k] = id
	return id, true, nil
}

// restore records an ID found in the pinned maps.
func (a *idAlloc[K]) restore(k K, id uint32) {
	if a.claim(id) {
		a.ids[k] = id
	}
}

func (a *idAlloc[K]) lookup(k K) (uint32, bool) {
	id, ok := a.ids[k]
	return id, ok
}

func (a *idAlloc[K]) release(k K) {
	if id, ok := a.ids[k]; ok {
		delete(a.ids, k)
		a.free(id)
	}
}

func (a *idAlloc[K]) len() int { return len(a.ids) }
