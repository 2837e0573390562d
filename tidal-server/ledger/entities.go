package ledger

import "fmt"

// The entity state's layout. Before, a fold
// followed five dependent pointers — entity map → entityState → cells
// slice → cell → buckets — each a likely cache miss over 100,000 random
// entities, and every new entity or key allocated two to three objects
// the garbage collector then scanned for ever. Now:
//
//   - entityTable maps an entity id to its slot: open addressing with
//     linear probing over one flat array of (id, slot) pairs, so a lookup
//     is usually one cache line and an insert allocates nothing (the
//     array doubles at half full);
//   - the cells of slot s are cells[s·signals : (s+1)·signals], inline and
//     adjacent, so one entity's signals share cache lines; a cell whose
//     count is 0 is absent (a present cell has count ≥ 1);
//   - a present cell's windows are the records
//     wins[cell.bkt : cell.bkt+bucketed] (chunked, see winRec), allocated
//     when the cell first gets an event.
//
// What is stored is exactly what the old layout stored, so the canonical
// encoding (snapshots, digests) is unchanged; TestStateBytesUnchangedByLayout
// pins it.

type entityTable struct {
	slots []entitySlot
	mask  uint64
	n     int
}

type entitySlot struct {
	id   uint64
	slot uint32 // slot + 1; 0 marks an empty table entry
}

func newEntityTable() entityTable {
	return entityTable{slots: make([]entitySlot, 1024), mask: 1023}
}

func entityHome(id, mask uint64) uint64 {
	// Fibonacci hashing: entity ids are often sequential or strided, which
	// the multiplication spreads over the table.
	return (id * 0x9E3779B97F4A7C15 >> 20) & mask
}

// find returns the slot of entity id.
func (t *entityTable) find(id uint64) (uint32, bool) {
	for i := entityHome(id, t.mask); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.slot == 0 {
			return 0, false
		}
		if s.id == id {
			return s.slot - 1, true
		}
	}
}

// insert records that entity id lives in slot; id must be absent.
func (t *entityTable) insert(id uint64, slot uint32) {
	if 2*(t.n+1) > len(t.slots) {
		old := t.slots
		t.slots = make([]entitySlot, 2*len(old))
		t.mask = uint64(len(t.slots) - 1)
		for _, s := range old {
			if s.slot != 0 {
				t.put(s)
			}
		}
	}
	t.put(entitySlot{id: id, slot: slot + 1})
	t.n++
}

func (t *entityTable) put(e entitySlot) {
	for i := entityHome(e.id, t.mask); ; i = (i + 1) & t.mask {
		if t.slots[i].slot == 0 {
			t.slots[i] = e
			return
		}
	}
}

// entitySlot returns the slot of entity id, or -1.
func (l *Ledger) entitySlot(id uint64) int {
	s, ok := l.index.find(id)
	if !ok {
		return -1
	}
	return int(s)
}

// Cells and window records live in fixed-size chunks:
// one growing slice of every cell was copied whole each time it grew
// (append's 1.25× steps past 256 elements), and while a node met new
// entities that copying — memmove and the page faults of each new array —
// was a quarter of a follower's CPU under 100-event batches. A chunk is
// never copied; a cell or record keeps its address for the ledger's life.
const (
	cellChunkShift = 10 // entities per cell chunk: 1 << cellChunkShift
	cellChunkMask  = 1<<cellChunkShift - 1
	winChunkLen    = 4096 // window records per chunk
)

// addEntity gives entity id a slot with every cell absent.
func (l *Ledger) addEntity(id uint64) int {
	s := len(l.ids)
	l.ids = append(l.ids, id)
	if s&cellChunkMask == 0 {
		l.cells = append(l.cells, make([]cell, (cellChunkMask+1)*len(l.sigs)))
	}
	l.index.insert(id, uint32(s))
	return s
}

// cellAt returns the cell of (slot, signal index); absent when count is 0.
func (l *Ledger) cellAt(slot, si int) *cell {
	return &l.cells[slot>>cellChunkShift][(slot&cellChunkMask)*len(l.sigs)+si]
}

// A window's buckets are held in its record: up to
// inlineBuckets of them inline, more in a region of the spill arena the
// record names. Before, every window of every present cell had its own
// small bucket array behind a slice header (two dependent cache misses
// per window on each fold, and an object per window for the collector to
// scan); most windows of most cells hold one to three buckets, which now
// sit next to each other in one record, and nothing here holds a pointer.
// What a window holds, and so the canonical encoding, is unchanged.
const inlineBuckets = 3

type winRec struct {
	buf   [inlineBuckets]bucket
	n     uint8  // buckets held (in buf, or in the spill region)
	class uint8  // spilled: the region holds spillMin << class buckets
	spill uint32 // 1 + offset of the region in the arena; 0: buf[:n]
}

// The spill arena: regions of spillMin << class buckets (8 to 64; a
// window holds at most BucketsPerWindow+1 = 61) carved from chunks that
// never move, a free list per class. A region is freed when its window
// needs a larger one.
const (
	spillMin      = 8
	spillClasses  = 4
	spillChunkLen = 1 << 16 // buckets per arena chunk, a multiple of every region
)

type spillArena struct {
	chunks [][]bucket
	n      int // buckets handed out from the chunks
	free   [spillClasses][]uint32
}

func (a *spillArena) region(off uint32, n, class uint8) []bucket {
	c, o := off/spillChunkLen, off%spillChunkLen
	return a.chunks[c][o : o+uint32(n) : o+spillMin<<class]
}

func (a *spillArena) alloc(class uint8) uint32 {
	if f := a.free[class]; len(f) > 0 {
		a.free[class] = f[:len(f)-1]
		return f[len(f)-1]
	}
	size := spillMin << class
	if off := a.n % spillChunkLen; off == 0 || off+size > spillChunkLen {
		a.n += (spillChunkLen - off) % spillChunkLen
		a.chunks = append(a.chunks, make([]bucket, spillChunkLen))
	}
	off := a.n
	a.n += size
	return uint32(off)
}

// cellWins returns a present cell's window records, one per bucketed
// window of its signal (in winSpec.bucket order).
func (l *Ledger) cellWins(c *cell, spec *sigSpec) []winRec {
	if spec.bucketed == 0 {
		return nil
	}
	off := int(c.bkt % winChunkLen)
	return l.wins[c.bkt/winChunkLen][off : off+spec.bucketed : off+spec.bucketed]
}

// winBuckets returns a window's buckets: the record's own array or its
// spill region, with their capacity, so addToBuckets inserts in place
// until it needs more room (and then returns a new slice for
// setWinBuckets to store).
func (l *Ledger) winBuckets(r *winRec) []bucket {
	if r.spill != 0 {
		return l.spills.region(r.spill-1, r.n, r.class)
	}
	return r.buf[:r.n]
}

// setWinBuckets stores bs as the window's buckets: inline while they fit
// and the window never spilled, else in its spill region, moved to a
// larger one when bs outgrew it (a window that spilled stays spilled).
func (l *Ledger) setWinBuckets(r *winRec, bs []bucket) {
	if r.spill == 0 && len(bs) <= inlineBuckets {
		copy(r.buf[:], bs)
		r.n = uint8(len(bs))
		return
	}
	if r.spill == 0 || len(bs) > spillMin<<r.class {
		class := uint8(0)
		for len(bs) > spillMin<<class {
			class++
		}
		if class >= spillClasses {
			panic(fmt.Sprintf("ledger: a window of %d buckets (at most %d are kept)", len(bs), BucketsPerWindow+1))
		}
		if r.spill != 0 {
			l.spills.free[r.class] = append(l.spills.free[r.class], r.spill-1)
		}
		r.spill, r.class = l.spills.alloc(class)+1, class
	}
	r.n = uint8(len(bs))
	copy(l.spills.region(r.spill-1, r.n, r.class), bs)
}

// present makes an absent cell present (count still 0: the caller folds).
func (l *Ledger) present(c *cell, spec *sigSpec, anchor int64) {
	c.anchor = anchor
	if spec.bucketed > 0 {
		// A cell's records never straddle two chunks.
		if off := l.nwins % winChunkLen; off == 0 || off+spec.bucketed > winChunkLen {
			l.nwins += (winChunkLen - off) % winChunkLen
			l.wins = append(l.wins, make([]winRec, winChunkLen))
		}
		c.bkt = uint32(l.nwins)
		l.nwins += spec.bucketed
	}
	l.keys++
}
