package vectors

import (
	"unsafe"
	"weak"
)

// Memory is what a Store holds, in bytes, as it stands when asked.
//
// Vectors is the raw payload: Len × Dim × 4 bytes of float32. Every other
// figure is what the store holds beyond it, and Overhead is their sum:
//
//   - ChunkSlack: chunk capacity not (yet) holding a vector. Chunks are
//     allocated whole (4 MiB), so the last one is mostly empty.
//   - Slots: the per-slot arrays (entities, norms, putSeq, shared) by
//     their capacity, and the entity → slot map.
//   - Undo: vectors saved for pinned QueryViews (query.go), with their
//     bookkeeping.
//   - Frozen: chunks copied on write while a View (an unfinished snapshot)
//     held the original: the original stays allocated until the View is
//     dropped and the garbage collector has run.
//
// Every figure but the map's is the capacity of an allocation the store
// holds (cap, not len, so append's spare room counts). Go offers no way
// to ask a map how much it allocated; its figure is its layout (Go's
// swiss tables: 8-slot groups of key, value and one control byte each,
// at most 7/8 full, group count a power of two) applied to its length,
// so it may be off by the tables' growth, never by the data.
type Memory struct {
	Vectors    int64 `json:"vector_bytes"`
	Overhead   int64 `json:"index_overhead_bytes"`
	ChunkSlack int64 `json:"chunk_slack_bytes"`
	Slots      int64 `json:"slot_bytes"`
	Undo       int64 `json:"undo_bytes"`
	Frozen     int64 `json:"frozen_chunk_bytes"`
}

// frozenChunk is a chunk a copy-on-write replaced while a View held it:
// weak, so that recording it does not keep it alive.
type frozenChunk struct {
	p     weak.Pointer[float32]
	bytes int64
}

// noteFrozenLocked records old, a chunk just replaced by its copy, as held
// by Views until the collector frees it. Called with the write lock held.
func (s *Store) noteFrozenLocked(old []float32) {
	if cap(old) == 0 {
		return
	}
	s.frozen = append(s.frozen, frozenChunk{p: weak.Make(&old[:1][0]), bytes: int64(cap(old)) * 4})
}

// Memory reports what the store holds now (see Memory). It costs one pass
// over the chunk headers and the undo record, under the write lock
// (it forgets the frozen chunks the collector has freed).
func (s *Store) Memory() Memory {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m Memory
	m.Vectors = int64(len(s.entities)) * int64(s.dim) * 4
	var chunkBytes int64
	for _, c := range s.chunks {
		chunkBytes += int64(cap(c)) * 4
	}
	m.ChunkSlack = chunkBytes - m.Vectors
	m.Slots = int64(cap(s.entities))*8 + int64(cap(s.norms))*8 + int64(cap(s.putSeq))*8 +
		int64(cap(s.shared)) + int64(cap(s.chunks))*int64(unsafe.Sizeof([]float32(nil))) +
		mapBytes(len(s.slot), 8+8)
	for _, es := range s.undo {
		m.Undo += int64(cap(es)) * int64(unsafe.Sizeof(undoEntry{}))
		for _, e := range es {
			m.Undo += int64(cap(e.vec)) * 4
		}
	}
	m.Undo += mapBytes(len(s.undo), 8+int64(unsafe.Sizeof([]undoEntry(nil))))
	live := s.frozen[:0]
	for _, f := range s.frozen {
		if f.p.Value() != nil {
			live = append(live, f)
			m.Frozen += f.bytes
		}
	}
	clear(s.frozen[len(live):])
	s.frozen = live
	m.Overhead = m.ChunkSlack + m.Slots + m.Undo + m.Frozen
	return m
}

// mapBytes is the size of a Go map of n entries of slotBytes (key and
// value) each, by the layout of its swiss tables: groups of 8 slots and 8
// control bytes, at most 7/8 full, the group count a power of two.
func mapBytes(n int, slotBytes int64) int64 {
	if n == 0 {
		return 0
	}
	slots := int64(8)
	for slots*7/8 < int64(n) {
		slots *= 2
	}
	return slots/8*(8+8*slotBytes) + 48 // groups, and the map header
}
