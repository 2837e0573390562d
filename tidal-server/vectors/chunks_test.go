package vectors

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// Vectors spread over several chunks (the store
// grows by chunks, never by copying) read back, replace in place, rank and
// survive a snapshot exactly as in one arena. At MaxDim a chunk holds 16
// vectors, so 40 entities span three chunks.
func TestChunkBoundaries(t *testing.T) {
	const dim = MaxDim
	s := New(dim)
	if s.perChunk != 16 {
		t.Fatalf("expected 16 vectors per chunk at dim %d, found %d", dim, s.perChunk)
	}
	r := rand.New(rand.NewPCG(8, 9))
	want := map[uint64][]float32{}
	for e := range uint64(40) {
		v := randVec(r, dim)
		if err := s.Put(e, v); err != nil {
			t.Fatal(err)
		}
		want[e] = v
	}
	for _, e := range []uint64{0, 15, 16, 31, 32, 39} { // replace across boundaries
		v := randVec(r, dim)
		if err := s.Put(e, v); err != nil {
			t.Fatal(err)
		}
		want[e] = v
	}
	if len(s.chunks) != 3 {
		t.Fatalf("expected 3 chunks, found %d", len(s.chunks))
	}
	for e, v := range want {
		got, ok := s.Get(e)
		if !ok || !slices.Equal(got, v) {
			t.Fatalf("entity %d: read back differs from what was put", e)
		}
	}
	// Nearest scans every chunk; once per chunk's edges is enough (each
	// scan is 40 × 64 Ki products, slow under -race).
	for _, e := range []uint64{0, 16, 39} {
		m, err := s.Nearest(want[e], 1)
		if err != nil || len(m) != 1 || m[0].Entity != e {
			t.Fatalf("entity %d: nearest to its own vector is %v (%v)", e, m, err)
		}
	}
	var buf bytes.Buffer
	if err := s.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	r2 := New(dim)
	if err := r2.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if r2.Digest() != s.Digest() {
		t.Fatal("restored store's digest differs")
	}
}
