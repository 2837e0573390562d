package vectors

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// A View encodes exactly what Snapshot wrote at the moment of Freeze,
// whatever Puts come after it: overwrites in frozen chunks (copy-on-write),
// appends into the frozen last chunk and new chunks (snapshots
// are encoded off the apply goroutine from a View).
func TestViewIsFrozenAgainstLaterPuts(t *testing.T) {
	const dim = MaxDim // 16 vectors per chunk
	s := New(dim)
	r := rand.New(rand.NewPCG(3, 4))
	for e := range uint64(40) { // 2.5 chunks
		if err := s.Put(1000-e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	var want bytes.Buffer
	if err := s.Snapshot(&want); err != nil {
		t.Fatal(err)
	}
	wantDigest := s.Digest()
	v := s.Freeze()
	if v.Size() != int64(want.Len()) {
		t.Fatalf("expected View.Size %d (the encoding's length), found %d", want.Len(), v.Size())
	}
	// Overwrite in every frozen chunk, append to the frozen last chunk,
	// then into new chunks.
	for _, e := range []uint64{1000, 990, 975, 961} {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	for e := range uint64(30) {
		if err := s.Put(2000+e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	var got bytes.Buffer
	n, err := v.WriteTo(&got)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(got.Len()) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("View encoding (%d bytes, reported %d) differs from the snapshot at Freeze (%d bytes)", got.Len(), n, want.Len())
	}
	// It restores to the frozen state, and the live store moved on.
	back := New(dim)
	if err := back.Restore(bytes.NewReader(got.Bytes())); err != nil {
		t.Fatal(err)
	}
	if back.Digest() != wantDigest {
		t.Fatal("restored View differs from the store at Freeze")
	}
	if s.Digest() == wantDigest || s.Len() != 70 {
		t.Fatalf("expected the live store to hold the later Puts (70 entities), found %d", s.Len())
	}
	// A second View taken now sees the new state, and the first is unchanged.
	var now bytes.Buffer
	if _, err := s.Freeze().WriteTo(&now); err != nil {
		t.Fatal(err)
	}
	var live bytes.Buffer
	if err := s.Snapshot(&live); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(now.Bytes(), live.Bytes()) {
		t.Fatal("a fresh View differs from Snapshot")
	}
	got.Reset()
	if _, err := v.WriteTo(&got); err != nil || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatal("the first View changed after a second Freeze")
	}
}

// The copy-on-write copy is taken once per chunk per Freeze: after it the
// store writes in place again (no copy per Put).
func TestFreezeCopiesAChunkOnce(t *testing.T) {
	const dim = MaxDim
	s := New(dim)
	r := rand.New(rand.NewPCG(5, 6))
	for e := range uint64(20) {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	s.Freeze()
	before := &s.chunks[0][0]
	if err := s.Put(3, randVec(r, dim)); err != nil {
		t.Fatal(err)
	}
	copied := &s.chunks[0][0]
	if copied == before {
		t.Fatal("expected an overwrite in a frozen chunk to copy it")
	}
	if err := s.Put(4, randVec(r, dim)); err != nil {
		t.Fatal(err)
	}
	if &s.chunks[0][0] != copied {
		t.Fatal("expected the second overwrite to write in place")
	}
	if &s.chunks[1][0] == nil || s.shared[1] != true {
		t.Fatal("expected chunk 1 to stay shared until written")
	}
}

// A View is encoded on one goroutine while Puts (overwrites and appends)
// go on on another: the encoding is the state at Freeze (run with -race:
// the copy-on-write must leave the View's memory untouched).
func TestViewEncodesWhilePutsGoOn(t *testing.T) {
	const dim = 256 // 4096 vectors per chunk
	s := New(dim)
	r := rand.New(rand.NewPCG(11, 12))
	for e := range uint64(9000) { // three chunks, the last one partly filled
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	var want bytes.Buffer
	if err := s.Snapshot(&want); err != nil {
		t.Fatal(err)
	}
	v := s.Freeze()
	done := make(chan []byte)
	go func() {
		var got bytes.Buffer
		if _, err := v.WriteTo(&got); err != nil {
			t.Error(err)
		}
		done <- got.Bytes()
	}()
	w := rand.New(rand.NewPCG(13, 14))
	for i := range 3000 {
		e := uint64(w.IntN(9000)) // overwrite
		if i%3 == 0 {
			e = 9000 + uint64(i) // append
		}
		if err := s.Put(e, randVec(w, dim)); err != nil {
			t.Fatal(err)
		}
	}
	if got := <-done; !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("a View encoded during Puts differs from the state at Freeze (%d vs %d bytes)", len(got), want.Len())
	}
}
