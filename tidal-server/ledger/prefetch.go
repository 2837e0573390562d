package ledger

import "hash/maphash"

// Touching a batch's memory ahead of use.
//
// Profiles of 100-event batches on 3 nodes put apply at 30% of the
// leader's CPU and 60% of a follower's, nearly all of it waiting on
// memory: each event's id is looked up in two id-memory indexes (8 MB
// each at the default generation size) and its fold walks entity table →
// cell → bucket slices → bucket arrays, each a likely miss over 100,000
// random entities. Within one event those loads depend on each other, so
// the core waits for them one after another; across the events of a batch
// they do not. So before classifying and folding a batch, apply walks it
// in stages, each stage loading one level of every event's chain (the
// loads of a stage are independent, so the core overlaps their misses)
// and the real work then finds the lines in cache. Go has no prefetch
// instruction; a plain load whose value is summed into a sink does the
// same here, at the price of a few instructions per event and level.
//
// Nothing here changes state or results: the stages only read, and the
// work after them is the same code as before.

// prefetchMin is the smallest batch worth the staged walk: with a handful
// of events there is little to overlap.
var prefetchMin = 8 // a variable so tests can compare with the plain path

// idHashes computes every event's id hash into hashes (reused scratch)
// and loads the home slot of each in both id-memory generations.
func (l *Ledger) idHashes(events []Event, hashes []uint64) []uint64 {
	hashes = hashes[:0]
	var sink uint64
	for i := range events {
		h := maphash.String(idSeed, events[i].ID)
		hashes = append(hashes, h)
		tag := h >> 32
		if l.cur.n > 0 {
			sink += l.cur.index[home(tag, l.cur.mask)]
		}
		if l.old.n > 0 {
			sink += l.old.index[home(tag, l.old.mask)]
		}
	}
	keep(sink)
	return hashes
}

// prefetchFold loads, level by level, what fold will read for every event
// classify did not mark a duplicate: the entity table slot, the cell, its
// window records (and the bucket arrays of spilled windows). slots is
// reused scratch.
func (l *Ledger) prefetchFold(events []Event, class []int8, slots []int32) []int32 {
	var sink uint64
	t := &l.index
	for i := range events {
		if class[i] != isDuplicate {
			sink += t.slots[entityHome(events[i].Entity, t.mask)].id
		}
	}
	slots = slots[:0]
	for i := range events {
		s := int32(-1)
		if si := class[i]; si != isDuplicate {
			if slot, ok := t.find(events[i].Entity); ok {
				s = int32(slot)
				sink += l.cellAt(int(slot), int(si)).count
			}
		}
		slots = append(slots, s)
	}
	for i, s := range slots {
		if s < 0 {
			continue
		}
		if c := l.cellAt(int(s), int(class[i])); c.count > 0 {
			ws := l.cellWins(c, &l.sigs[class[i]])
			for j := range ws {
				sink += uint64(ws[j].n)
			}
		}
	}
	// Spilled windows only: their bucket arrays are one more level.
	for i, s := range slots {
		if s < 0 {
			continue
		}
		c := l.cellAt(int(s), int(class[i]))
		if c.count == 0 {
			continue
		}
		ws := l.cellWins(c, &l.sigs[class[i]])
		for j := range ws {
			if r := &ws[j]; r.spill != 0 && r.n > 0 {
				sink += l.winBuckets(r)[r.n-1].n
			}
		}
	}
	keep(sink)
	return slots
}

// keep uses the sum of the prefetching loads, so the compiler cannot drop
// them as dead. It writes nothing: Check prefetches under a shared lock.
//
//go:noinline
func keep(uint64) {}
