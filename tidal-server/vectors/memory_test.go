package vectors

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestMemoryMovesWithPutsAndOverwrites checks each figure of Memory
// against what the store holds: raw vector bytes grow with new entities
// and not with overwrites, chunk slack shrinks as a chunk fills, undo
// bytes appear while a pinned view needs old vectors and vanish at its
// release, and a chunk copied on write under a View is counted until the
// View is gone and collected.
func TestMemoryMovesWithPutsAndOverwrites(t *testing.T) {
	const dim = 1024 // 1024 slots per 4 MiB chunk
	r := rand.New(rand.NewPCG(1, 2))
	s := New(dim)
	if m := s.Memory(); m != (Memory{}) {
		t.Fatalf("empty store: expected all zero, found %+v", m)
	}
	for e := uint64(0); e < 10; e++ {
		s.Put(e, randVec(r, dim))
	}
	m10 := s.Memory()
	if want := int64(10 * dim * 4); m10.Vectors != want {
		t.Fatalf("10 vectors: expected %d vector bytes, found %d", want, m10.Vectors)
	}
	if want := int64(chunkFloats*4) - m10.Vectors; m10.ChunkSlack != want {
		t.Fatalf("10 vectors in one chunk: expected slack %d, found %d", want, m10.ChunkSlack)
	}
	if m10.Slots <= 0 || m10.Overhead != m10.ChunkSlack+m10.Slots+m10.Undo+m10.Frozen {
		t.Fatalf("10 vectors: expected positive slot bytes and overhead = sum of parts, found %+v", m10)
	}

	// Overwrites: the payload does not grow.
	s.Put(3, randVec(r, dim))
	if m := s.Memory(); m.Vectors != m10.Vectors || m.Undo != 0 {
		t.Fatalf("overwrite with no view: expected %d vector bytes and no undo, found %+v", m10.Vectors, m)
	}

	// A pinned query view makes an overwrite save the old vector.
	v := s.PinQuery()
	s.Put(4, randVec(r, dim))
	mu := s.Memory()
	if mu.Undo < dim*4 {
		t.Fatalf("overwrite under a pinned view: expected at least %d undo bytes, found %d", dim*4, mu.Undo)
	}
	if mu.Overhead != m10.Overhead+mu.Undo+(mu.Slots-m10.Slots) {
		t.Fatalf("overhead must grow by the undo record: before %+v, after %+v", m10, mu)
	}
	v.Release()
	if m := s.Memory(); m.Undo != 0 {
		t.Fatalf("after Release: expected no undo bytes, found %d", m.Undo)
	}

	// A frozen View makes an overwrite copy its chunk; the original is
	// counted while the View keeps it.
	fv := s.Freeze()
	s.Put(5, randVec(r, dim))
	if m := s.Memory(); m.Frozen != chunkFloats*4 {
		t.Fatalf("overwrite under a frozen view: expected %d frozen bytes, found %d", chunkFloats*4, m.Frozen)
	}
	runtime.KeepAlive(fv)
	fv = nil
	var m Memory
	for range 10 {
		runtime.GC()
		if m = s.Memory(); m.Frozen == 0 {
			break
		}
	}
	if m.Frozen != 0 {
		t.Fatalf("after the view is dropped and collected: expected no frozen bytes, found %d", m.Frozen)
	}

	// New entities past a chunk: a second chunk, payload and slack follow.
	for e := uint64(10); e < 1100; e++ {
		s.Put(e, randVec(r, dim))
	}
	m = s.Memory()
	if want := int64(1100 * dim * 4); m.Vectors != want {
		t.Fatalf("1100 vectors: expected %d vector bytes, found %d", want, m.Vectors)
	}
	if want := int64(2*chunkFloats*4) - m.Vectors; m.ChunkSlack != want {
		t.Fatalf("1100 vectors in two chunks: expected slack %d, found %d", want, m.ChunkSlack)
	}
}

// TestMapBytes checks the map estimate grows with the table's
// doublings and is zero only for an empty map.
func TestMapBytes(t *testing.T) {
	if mapBytes(0, 16) != 0 {
		t.Fatalf("empty map: expected 0")
	}
	if a, b := mapBytes(7, 16), mapBytes(8, 16); b <= a {
		t.Fatalf("8 entries need a second group: expected more than %d bytes, found %d", a, b)
	}
	if n := mapBytes(100000, 16); n < 100000*16 {
		t.Fatalf("100000 entries of 16 bytes: expected at least %d bytes, found %d", 100000*16, n)
	}
}
