package ledger

import "slices"

// The entity state's layout (issue 14, build item 2). Before, a fold
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
//   - a present cell's window buckets are the slices
//     bkts[cell.bkt : cell.bkt+bucketed], allocated when the cell first
//     gets an event.
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

// addEntity gives entity id a slot with every cell absent.
func (l *Ledger) addEntity(id uint64) int {
	s := len(l.ids)
	l.ids = append(l.ids, id)
	n := len(l.cells)
	l.cells = slices.Grow(l.cells, len(l.sigs))[:n+len(l.sigs)]
	clear(l.cells[n:])
	l.index.insert(id, uint32(s))
	return s
}

// cellAt returns the cell of (slot, signal index); absent when count is 0.
func (l *Ledger) cellAt(slot, si int) *cell {
	return &l.cells[slot*len(l.sigs)+si]
}

// cellBuckets returns a present cell's bucket slices, one per bucketed
// window of its signal.
func (l *Ledger) cellBuckets(c *cell, spec *sigSpec) [][]bucket {
	return l.bkts[c.bkt : int(c.bkt)+spec.bucketed : int(c.bkt)+spec.bucketed]
}

// present makes an absent cell present (count still 0: the caller folds).
func (l *Ledger) present(c *cell, spec *sigSpec, anchor int64) {
	c.anchor = anchor
	c.bkt = uint32(len(l.bkts))
	for range spec.bucketed {
		l.bkts = append(l.bkts, nil)
	}
	l.keys++
}
