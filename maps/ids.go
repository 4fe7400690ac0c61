package maps

import "fmt"

// idAlloc hands out small integer IDs (they index per-CPU counter arrays)
// and keeps them stable for as long as their key lives, including across
// agent restarts: the datapath seeds it from the pinned maps.
type idAlloc[K comparable] struct {
	max  uint32 // IDs are 1..max-1; 0 means "none"
	next uint32
	ids  map[K]uint32
	used map[uint32]K
}

func newIDAlloc[K comparable](max uint32) *idAlloc[K] {
	return &idAlloc[K]{max: max, next: 1, ids: map[K]uint32{}, used: map[uint32]K{}}
}

// get returns k's ID, allocating one when k has none; fresh reports a new
// allocation (whose counters the caller must reset).
func (a *idAlloc[K]) get(k K) (id uint32, fresh bool, err error) {
	if id, ok := a.ids[k]; ok {
		return id, false, nil
	}
	for range a.max {
		id := a.next
		a.next++
		if a.next >= a.max {
			a.next = 1
		}
		if _, taken := a.used[id]; !taken {
			a.ids[k], a.used[id] = id, k
			return id, true, nil
		}
	}
	return 0, false, fmt.Errorf("all %d IDs in use", a.max-1)
}

// restore records an ID found in the pinned maps.
func (a *idAlloc[K]) restore(k K, id uint32) {
	if id == 0 || id >= a.max {
		return
	}
	a.ids[k], a.used[id] = id, k
	if id >= a.next {
		a.next = id + 1
		if a.next >= a.max {
			a.next = 1
		}
	}
}

func (a *idAlloc[K]) lookup(k K) (uint32, bool) {
	id, ok := a.ids[k]
	return id, ok
}

func (a *idAlloc[K]) release(k K) {
	if id, ok := a.ids[k]; ok {
		delete(a.ids, k)
		delete(a.used, id)
	}
}

func (a *idAlloc[K]) len() int { return len(a.ids) }
