package maps

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BatchChunk bounds one batch syscall, so that a full sync of 100k
// services does not build one enormous kernel copy.
const BatchChunk = 4096

// enomemPatience is how long a batch update waits, without progress, for
// the kernel to refill its element caches. A map created without
// preallocation (the per-CPU counters, the affinity table) takes each new
// element from per-CPU caches that the kernel refills asynchronously; a
// batch of thousands of inserts can empty them first, most readily when
// the CPUs are busy, and the update then stops with ENOMEM after the
// elements it did insert. Measured on a 2-CPU machine: 2M per-CPU
// counters inserted in batches of 4096 met ENOMEM 18 times.
const enomemPatience = 5 * time.Second

// batchUpdate writes keys[i] -> vals[i*per:(i+1)*per] (per: values per
// key, the CPUs of a per-CPU map) in one batch syscall, resuming after the
// elements the kernel inserted when it runs out of memory for a moment.
func batchUpdate[K, V any](m *ebpf.Map, keys []K, vals []V, per int) error {
	wait, stalled := time.Millisecond, time.Duration(0)
	for len(keys) > 0 {
		n, err := m.BatchUpdate(keys, vals[:len(keys)*per], nil)
		if !errors.Is(err, unix.ENOMEM) {
			return err
		}
		if n > 0 {
			wait, stalled = time.Millisecond, 0
		}
		if stalled >= enomemPatience {
			return fmt.Errorf("%w (no progress for %v)", err, stalled)
		}
		keys, vals = keys[n:], vals[n*per:]
		time.Sleep(wait)
		stalled += wait
		wait = min(2*wait, 100*time.Millisecond)
	}
	return nil
}

// updateMany writes keys[i] -> vals[i] with batch syscalls where the
// kernel has them and one update per element where it does not.
func UpdateMany[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for len(keys) > 0 {
		n := min(len(keys), BatchChunk)
		err := batchUpdate(m, keys[:n], vals[:n], 1)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for i := range n {
				if err := m.Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
					return fmt.Errorf("update %s: %w", m, err)
				}
			}
		} else if err != nil {
			return fmt.Errorf("batch update %s: %w", m, err)
		}
		keys, vals = keys[n:], vals[n:]
	}
	return nil
}

// deleteMany removes keys; keys already gone are not an error.
func DeleteMany[K any](m *ebpf.Map, keys []K) error {
	for len(keys) > 0 {
		n := min(len(keys), BatchChunk)
		_, err := m.BatchDelete(keys[:n], nil)
		if err != nil {
			// A batch stops at the first missing key: finish one by one.
			for i := range n {
				if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("delete from %s: %w", m, err)
				}
			}
		}
		keys = keys[n:]
	}
	return nil
}

// DeletePerCPU deletes the entries ids have in a per-CPU map keyed by ID,
// where they exist. A long list (a full sync's fresh IDs) is matched
// against the map's keys first: most such IDs have no entry, and a batch
// delete stops at each missing key.
func DeletePerCPU[V any](m *ebpf.Map, ids []uint32) error {
	if len(ids) > BatchChunk {
		have, err := PerCPUKeys[V](m)
		if err != nil {
			return err
		}
		ids = slices.DeleteFunc(slices.Clone(ids), func(id uint32) bool { return !have[id] })
	}
	return DeleteMany(m, ids)
}

// ZeroPerCPU zeroes (creating where missing) every CPU's value of keys in
// a per-CPU map, with batch syscalls where the kernel has them.
func ZeroPerCPU[V any](m *ebpf.Map, keys []uint32) error {
	if len(keys) == 0 {
		return nil
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("possible cpus: %w", err)
	}
	zero := make([]V, min(len(keys), BatchChunk)*ncpu)
	for len(keys) > 0 {
		n := min(len(keys), BatchChunk)
		err := batchUpdate(m, keys[:n], zero[:n*ncpu], ncpu)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for i := range n {
				if err := m.Update(&keys[i], zero[:ncpu], ebpf.UpdateAny); err != nil {
					return fmt.Errorf("reset %d in %s: %w", keys[i], m, err)
				}
			}
		} else if err != nil {
			return fmt.Errorf("batch reset %s: %w", m, err)
		}
		keys = keys[n:]
	}
	return nil
}

// walk calls fn with every entry of a hash map, read BatchChunk entries
// per syscall where the kernel has batch lookups (the per-key iterator
// costs two syscalls an entry: the conntrack reaper walks half a million
// entries every pass). fn must not keep pointers into its arguments. The
// kernel reads a bucket at a time, so a concurrently changing map is seen
// as by the iterator: an entry added or removed meanwhile may or may not
// appear.
func Walk[K, V any](m *ebpf.Map, fn func(k *K, v *V)) error {
	return walkBatches(m, 1, func(keys []K, vals []V) {
		for i := range keys {
			fn(&keys[i], &vals[i])
		}
	}, func() error { return WalkOneByOne(m, fn) })
}

// walkOneByOne is walk with the per-key iterator.
func WalkOneByOne[K, V any](m *ebpf.Map, fn func(k *K, v *V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	return it.Err()
}

// perCPUKeys is the set of keys of a per-CPU hash map with uint32 keys and
// V values, read in batches.
func PerCPUKeys[V any](m *ebpf.Map) (map[uint32]bool, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible cpus: %w", err)
	}
	out := map[uint32]bool{}
	err = walkBatches(m, ncpu, func(keys []uint32, _ []V) {
		for _, k := range keys {
			out[k] = true
		}
	}, func() error {
		var k uint32
		per := make([]V, ncpu)
		it := m.Iterate()
		for it.Next(&k, &per) {
			out[k] = true
		}
		return it.Err()
	})
	return out, err
}

// walkBatches hands each batch of m's entries to batch (perKey values per
// key: the CPU count for per-CPU maps), or calls oneByOne instead on
// kernels without batch lookups.
func walkBatches[K, V any](m *ebpf.Map, perKey int, batch func(keys []K, vals []V), oneByOne func() error) error {
	keys := make([]K, BatchChunk)
	vals := make([]V, BatchChunk*perKey)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			if err := oneByOne(); err != nil {
				return fmt.Errorf("read %s: %w", m, err)
			}
			return nil
		}
		if errors.Is(err, unix.ENOSPC) && n == 0 {
			// One bucket holds more than a batch: a bigger batch.
			keys, vals = make([]K, 2*len(keys)), make([]V, 2*len(vals))
			continue
		}
		batch(keys[:n], vals[:n*perKey])
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", m, err)
		}
	}
}
