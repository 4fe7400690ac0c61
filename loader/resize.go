package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	xbpf "github.com/xvs-lb/xvs/bpf"
)

// Conntrack resize under live traffic. The programs reach the conntrack
// tables only through the array of maps xvs_ct_tables (lib/ct.h), so a
// new --bpf-conntrack-size takes effect without dropping a flow:
//
//  1. Load finds the pinned table of another size, and renames its pin to
//     <name>_resizing (the running programs hold the map, not the path).
//  2. The new table is created and pinned under the name, empty.
//  3. The old table goes into slot t+XVS_CT_OLD, then the new one into
//     slot t. From then on the programs, old and new, write new flows to
//     the new table and find every other flow in either (ct_get copies
//     an old entry over on first use).
//  4. The agent copies every old entry that is not in the new table yet,
//     in batches, then empties the old slot and removes the old pin: the
//     old table is freed with its last reference.
//
// Step 4 runs in Load when the pinned xvs_ct_tables was reused, so every
// attached program reads the slots. A previous build's programs name the
// table itself; when they are still attached (an upgrade), step 4 waits
// until this build's programs replace them (FinishResize, which the
// device attachment calls), and meanwhile new programs read the old table
// through the old slot. An interrupted resize is finished by the next
// Load. Shrinking below the flows in use evicts the least recently used
// ones, as a full table does.

// ctTables are the conntrack tables by slot (enum xvs_ct_slot).
var ctTables = [...]string{
	xbpf.XvsXvsCtSlotXVS_CT_TABLE_ESTABLISHED: xbpf.XvsMapXvsConntrack,
	xbpf.XvsXvsCtSlotXVS_CT_TABLE_UNREPLIED:   xbpf.XvsMapXvsCtUnreplied,
}

// oldTablePin is where a table being resized stays pinned until its
// entries are copied ("." is reserved on bpffs).
func oldTablePin(pinPath, name string) string {
	return filepath.Join(pinPath, name+"_resizing")
}

// Resize reports one conntrack table's resize.
type Resize struct {
	Table    string
	From, To uint32
	// Copied entries; Kept are those the new table had by then (the
	// programs copied them on first use); Took is the copy's time.
	Copied, Kept int
	Took         time.Duration
}

// ErrResizePending is a resize asked for while another, to another size,
// is still to be finished: a configuration to correct, not a kernel that
// cannot run the datapath.
var ErrResizePending = errors.New("conntrack resize pending")

// prepareResize renames the pin of each conntrack table pinned under
// pinPath with another size than spec's (step 1), and reports whether the
// running programs read the slots of a pinned xvs_ct_tables. A table
// whose earlier resize was interrupted resumes it, unless its size
// changed once more: that waits until the pending resize is done.
func prepareResize(pinPath string, spec *ebpf.CollectionSpec) (slotsShared bool, err error) {
	_, err = os.Stat(filepath.Join(pinPath, xbpf.XvsMapXvsCtTables))
	slotsShared = err == nil
	for _, name := range ctTables {
		path := filepath.Join(pinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("open pinned %s: %w", name, err)
		}
		size, want := m.MaxEntries(), spec.Maps[name].MaxEntries
		m.Close()
		if size == want {
			continue
		}
		old := oldTablePin(pinPath, name)
		if _, err := os.Stat(old); err == nil {
			return false, fmt.Errorf("%w: %s: a resize to %d entries is still to be finished (pinned %s): start the agent once with that size, then with %d",
				ErrResizePending, name, size, old, want)
		}
		if err := os.Rename(path, old); err != nil {
			return false, fmt.Errorf("resize %s: %w", name, err)
		}
	}
	return slotsShared, nil
}

// fillCTSlots puts the loaded tables in their slots, with the old ones of
// a resize beside them (step 3), and copies when the programs all read
// the slots (step 4).
func (o *Objects) fillCTSlots(slotsShared bool) error {
	cur := [...]*ebpf.Map{o.XvsConntrack, o.XvsCtUnreplied}
	for slot, name := range ctTables {
		old, err := ebpf.LoadPinnedMap(oldTablePin(o.cfg.PinPath, name), nil)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := o.XvsCtTables.Update(uint32(slot), cur[slot], ebpf.UpdateAny); err != nil {
				return fmt.Errorf("put %s in its slot: %w", name, err)
			}
			if err := o.XvsCtTables.Delete(uint32(slot) + uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("empty the old slot of %s: %w", name, err)
			}
			continue
		case err != nil:
			return fmt.Errorf("open the old %s: %w", name, err)
		}
		// The old table first: a packet between the two updates finds
		// it in both slots, never a table without the old entries.
		if err := o.XvsCtTables.Update(uint32(slot)+uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD), old, ebpf.UpdateAny); err != nil {
			old.Close()
			return fmt.Errorf("put the old %s in its slot: %w", name, err)
		}
		if err := o.XvsCtTables.Update(uint32(slot), cur[slot], ebpf.UpdateAny); err != nil {
			old.Close()
			return fmt.Errorf("put %s in its slot: %w", name, err)
		}
		o.resizing[slot] = old
	}
	if slotsShared {
		return o.FinishResize()
	}
	return nil
}

// FinishResize copies the entries of the tables being resized into the
// new ones and frees the old ones (step 4), and finishes the other maps'
// resizes (regrow.go); a no-op without a resize.
// Call it once every attached program is of this build.
func (o *Objects) FinishResize() error {
	o.lazyMu.Lock()
	defer o.lazyMu.Unlock()
	if err := o.finishRegrow(); err != nil {
		return err
	}
	cur := [...]*ebpf.Map{o.XvsConntrack, o.XvsCtUnreplied}
	for slot, old := range o.resizing {
		if old == nil {
			continue
		}
		r := Resize{Table: ctTables[slot], From: old.MaxEntries(), To: cur[slot].MaxEntries()}
		start := time.Now()
		var err error
		if r.Copied, r.Kept, err = copyTable(cur[slot], old); err != nil {
			return fmt.Errorf("resize %s: copy: %w", r.Table, err)
		}
		r.Took = time.Since(start)
		if err := o.XvsCtTables.Delete(uint32(slot) + uint32(xbpf.XvsXvsCtSlotXVS_CT_OLD)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("resize %s: empty the old slot: %w", r.Table, err)
		}
		if err := os.Remove(oldTablePin(o.cfg.PinPath, r.Table)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("resize %s: unpin the old table: %w", r.Table, err)
		}
		old.Close()
		o.resizing[slot] = nil
		o.resized = append(o.resized, r)
		slog.Info("Conntrack table resized without dropping a flow", "table", r.Table, "from", r.From, "to", r.To,
			"copied", r.Copied, "alreadyThere", r.Kept, "took", r.Took)
	}
	return nil
}

// Resized reports the conntrack resizes done so far.
func (o *Objects) Resized() []Resize { return o.resized }

// copyBatch bounds one batch syscall of copyTable.
const copyBatch = 4096

// copyTable copies every entry of src that dst does not have into dst,
// and counts the copied and the kept ones: src is read in batches.
func copyTable(dst, src *ebpf.Map) (copied, kept int, err error) {
	keys := make([]xbpf.CtKey, copyBatch)
	vals := make([]xbpf.CtEntry, copyBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, lerr := src.BatchLookup(&cursor, keys, vals, nil)
		if errors.Is(lerr, ebpf.ErrNotSupported) {
			return copyOneByOne(dst, src)
		}
		if lerr != nil && !errors.Is(lerr, ebpf.ErrKeyNotExist) {
			return copied, kept, fmt.Errorf("read %s: %w", src, lerr)
		}
		c, k, err := putNew(dst, keys[:n], vals[:n])
		copied, kept = copied+c, kept+k
		if err != nil || lerr != nil {
			return copied, kept, err
		}
	}
}

// putNew inserts keys[i] -> vals[i] into m where m has no entry yet, one
// update each: the kernel's batch update takes no BPF_NOEXIST.
func putNew(m *ebpf.Map, keys []xbpf.CtKey, vals []xbpf.CtEntry) (copied, kept int, err error) {
	for i := range keys {
		switch err := m.Update(&keys[i], &vals[i], ebpf.UpdateNoExist); {
		case errors.Is(err, ebpf.ErrKeyExist):
			kept++
		case err != nil:
			return copied, kept, fmt.Errorf("write %s: %w", m, err)
		default:
			copied++
		}
	}
	return copied, kept, nil
}

// copyOneByOne is copyTable on kernels without batch lookups.
func copyOneByOne(dst, src *ebpf.Map) (copied, kept int, err error) {
	var k xbpf.CtKey
	var v xbpf.CtEntry
	it := src.Iterate()
	for it.Next(&k, &v) {
		c, n, err := putNew(dst, []xbpf.CtKey{k}, []xbpf.CtEntry{v})
		copied, kept = copied+c, kept+n
		if err != nil {
			return copied, kept, err
		}
	}
	if err := it.Err(); err != nil {
		return copied, kept, fmt.Errorf("read %s: %w", src, err)
	}
	return copied, kept, nil
}
