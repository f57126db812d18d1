package pool

import (
	"encoding/base32"
	"encoding/binary"
	"math"
	"time"
)

// How Store holds its leases. A crawler that names a session per account
// or page holds one lease per name, and the store keeps every lease for
// the report window after it ends (Cooldown.Max, an hour by default), so
// a lease's bytes are paid many times over: an entry is 40 bytes in a
// chunked slab, with no per-lease allocation, map entry or string. Its
// lease ID carries its slot, so a lookup needs no map; the expiry heap
// holds 4-byte slots; its target is an index into a table of the targets
// held; its end is nanoseconds on the store's own time base.

// leaseChunk is the slab's unit of growth (10 KiB of entries): the slab
// grows without copying and gives trailing chunks back once they empty.
const leaseChunk = 256

// leaseEntry is one lease as the store holds it. A free slot has ms nil.
type leaseEntry struct {
	nonce [2]uint64    // the lease ID's 128 random bits
	ms    *memberState // nil when the slot is free
	end   int64        // ExpiresAt, or the release time if released earlier (Store.rel)
	pos   int32        // position in Store.live; -1 when not in it
	bits  uint32       // the targets index (leaseTarget), leaseReleased, leaseIdem
}

const (
	leaseReleased uint32 = 1 << 31            // released before its end
	leaseIdem     uint32 = 1 << 30            // has an entry in Store.idem
	leaseTarget   uint32 = leaseIdem - 1      // the bits of the targets index
	leaseIDRaw           = 20                 // 16 random bytes, then the slot (big-endian)
	leaseIDLen           = leaseIDRaw / 5 * 8 // base32 without padding: 32 characters
)

func (e *leaseEntry) released() bool { return e.bits&leaseReleased != 0 }
func (e *leaseEntry) target() uint32 { return e.bits & leaseTarget }

// leaseID is the ID of the lease in slot with nonce: base32 of the nonce
// then the slot, 32 characters (the 32-byte allocation class, as
// crypto/rand.Text's 26 were).
func leaseID(nonce [2]uint64, slot uint32) string {
	var raw [leaseIDRaw]byte
	binary.BigEndian.PutUint64(raw[0:], nonce[0])
	binary.BigEndian.PutUint64(raw[8:], nonce[1])
	binary.BigEndian.PutUint32(raw[16:], slot)
	var b [leaseIDLen]byte
	base32.StdEncoding.Encode(b[:], raw[:])
	return string(b[:])
}

// parseLeaseID is leaseID's inverse; ok is false for anything leaseID
// cannot have made.
func parseLeaseID(id string) (nonce [2]uint64, slot uint32, ok bool) {
	if len(id) != leaseIDLen {
		return nonce, 0, false
	}
	var b [leaseIDLen]byte
	copy(b[:], id)
	var raw [leaseIDRaw]byte
	// Decode skips newlines, so a full decode also rules them out.
	if n, err := base32.StdEncoding.Decode(raw[:], b[:]); err != nil || n != leaseIDRaw {
		return nonce, 0, false
	}
	nonce[0] = binary.BigEndian.Uint64(raw[0:])
	nonce[1] = binary.BigEndian.Uint64(raw[8:])
	return nonce, binary.BigEndian.Uint32(raw[16:]), true
}

// leaseSlab holds the entries in chunks. Slots below hw have been used;
// freed ones wait in free for reuse.
type leaseSlab struct {
	chunks []*[leaseChunk]leaseEntry
	free   []uint32
	hw     uint32 // slots at or above it were never handed out in these chunks
	n      int    // slots in use
}

func (l *leaseSlab) at(slot uint32) *leaseEntry {
	return &l.chunks[slot/leaseChunk][slot%leaseChunk]
}

// alloc hands out a free slot, reusing freed ones first.
func (l *leaseSlab) alloc() uint32 {
	l.n++
	if k := len(l.free); k > 0 {
		slot := l.free[k-1]
		l.free = l.free[:k-1]
		return slot
	}
	if int(l.hw) == len(l.chunks)*leaseChunk {
		l.chunks = append(l.chunks, new([leaseChunk]leaseEntry))
	}
	l.hw++
	return l.hw - 1
}

// lookup is the entry of slot if it is in use with nonce, else nil.
func (l *leaseSlab) lookup(slot uint32, nonce [2]uint64) *leaseEntry {
	if slot >= l.hw {
		return nil
	}
	if e := l.at(slot); e.ms != nil && e.nonce == nonce {
		return e
	}
	return nil
}

// put frees slot (its entry already cleared).
func (l *leaseSlab) put(slot uint32) {
	l.n--
	l.free = append(l.free, slot)
}

// shrink gives back the chunks past the last slot in use and, when at
// most a quarter of the slots are in use, rebuilds the free list lowest
// slot last, so that new leases fill the low chunks and the high ones can
// empty and go at a later sweep. It runs in Store.sweep.
func (l *leaseSlab) shrink() {
	if int(l.hw) <= leaseChunk || l.n*4 > int(l.hw) {
		return
	}
	top := uint32(0) // one past the last slot in use
	for s := l.hw; s > 0; s-- {
		if l.at(s-1).ms != nil {
			top = s
			break
		}
	}
	keep := max(1, (int(top)+leaseChunk-1)/leaseChunk)
	clear(l.chunks[keep:])
	l.chunks = l.chunks[:keep]
	l.hw = top
	free := make([]uint32, 0, int(top)-l.n)
	for s := top; s > 0; s-- {
		if l.at(s-1).ms == nil {
			free = append(free, s-1)
		}
	}
	l.free = free
}

// leaseHeap is a min-heap of slots by their entry's end, each entry
// knowing its position so a release removes it in O(log n);
// Store.advance pops what expired. Its own sift functions, not
// container/heap's, whose Pop boxes every slot it hands back.
type leaseHeap struct {
	slab  *leaseSlab
	slots []uint32
}

func (h *leaseHeap) less(i, j int) bool {
	return h.slab.at(h.slots[i]).end < h.slab.at(h.slots[j]).end
}

func (h *leaseHeap) swap(i, j int) {
	h.slots[i], h.slots[j] = h.slots[j], h.slots[i]
	h.slab.at(h.slots[i]).pos = int32(i)
	h.slab.at(h.slots[j]).pos = int32(j)
}

func (h *leaseHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		j = i
	}
}

func (h *leaseHeap) down(i int) {
	n := len(h.slots)
	for {
		j := 2*i + 1
		if j >= n {
			return
		}
		if r := j + 1; r < n && h.less(r, j) {
			j = r
		}
		if !h.less(j, i) {
			return
		}
		h.swap(i, j)
		i = j
	}
}

func (h *leaseHeap) push(slot uint32) {
	h.slots = append(h.slots, slot)
	h.slab.at(slot).pos = int32(len(h.slots) - 1)
	h.up(len(h.slots) - 1)
}

// remove takes the slot at position i out of the heap.
func (h *leaseHeap) remove(i int) {
	last := len(h.slots) - 1
	if i != last {
		h.swap(i, last)
	}
	h.slab.at(h.slots[last]).pos = -1
	h.slots = h.slots[:last]
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// shrink gives back the heap's array when it holds a quarter of it or less.
func (h *leaseHeap) shrink() {
	if cap(h.slots) >= 1024 && len(h.slots)*4 <= cap(h.slots) {
		h.slots = append(make([]uint32, 0, 2*len(h.slots)), h.slots...)
	}
}

// targetTable interns the targets the store's leases name, so a lease
// holds a 4-byte index rather than a string (and the caller's copy of it)
// for the hour it stays reportable. A target goes when its last lease does.
type targetTable struct {
	index map[string]uint32
	names []string
	refs  []uint32 // leases holding each index; 0 for a free one
	free  []uint32
	peak  int // index's largest size since it was made
}

// ref returns target's index, counting one more lease on it.
func (t *targetTable) ref(target string) uint32 {
	if i, ok := t.index[target]; ok {
		t.refs[i]++
		return i
	}
	var i uint32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
		t.names[i], t.refs[i] = target, 1
	} else {
		i = uint32(len(t.names))
		t.names = append(t.names, target)
		t.refs = append(t.refs, 1)
	}
	t.index[target] = i
	t.peak = max(t.peak, len(t.index))
	return i
}

// unref counts one lease less on index i, dropping the target at none.
func (t *targetTable) unref(i uint32) {
	if t.refs[i]--; t.refs[i] == 0 {
		delete(t.index, t.names[i])
		t.names[i] = ""
		t.free = append(t.free, i)
	}
}

// shrink rebuilds the index map once it holds a quarter of its peak
// (Go maps never shrink), as the affinity table does.
func (t *targetTable) shrink() {
	if t.peak >= 64 && len(t.index)*4 <= t.peak {
		fresh := make(map[string]uint32, len(t.index))
		for k, v := range t.index {
			fresh[k] = v
		}
		t.index, t.peak = fresh, len(fresh)
	}
}

// releasedRef names a released lease in Store.released: its slot and
// nonce, so a slot reused since is not mistaken for it.
type releasedRef struct {
	nonce [2]uint64
	slot  uint32
}

// idemLease is an acquire's answer kept for its idempotency key, to be
// given again on a retry.
type idemLease struct {
	slot  uint32
	lease Lease
}

// rel is t on the store's time base: nanoseconds since NewStore, by the
// monotonic clock when t and the base carry one (as time.Time's own
// comparisons go).
func (s *Store) rel(t time.Time) int64 { return int64(t.Sub(s.base)) }

// addSat is a + d, saturating instead of overflowing.
func addSat(a int64, d time.Duration) int64 {
	b := a + int64(d)
	switch {
	case d > 0 && b < a:
		return math.MaxInt64
	case d < 0 && b > a:
		return math.MinInt64
	}
	return b
}

// lookup is the live or still reportable lease of id, with its slot.
func (s *Store) lookup(id string) (uint32, *leaseEntry) {
	nonce, slot, ok := parseLeaseID(id)
	if !ok {
		return 0, nil
	}
	return slot, s.slab.lookup(slot, nonce)
}

// leaseCount is the number of leases the store holds, ended ones not yet
// forgotten included.
func (s *Store) leaseCount() int { return s.slab.n }
