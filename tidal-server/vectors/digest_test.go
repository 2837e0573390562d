package vectors

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// A QueryView's Digest is Store.Digest at the pin, bit for bit, whatever
// the store does while the view hashes: overwrites of slots already
// hashed and not yet hashed, appends, and a Restore that replaces every
// array. Puts complete while the digest is parked between batches.
func TestQueryViewDigestIsTheDigestAtThePin(t *testing.T) {
	const dim, perChunk = 8, 4
	s := newSmall(dim, perChunk)
	r := rand.New(rand.NewPCG(41, 42))
	// More than two batches, entities out of slot order, so that the
	// sorted walk crosses chunks and batches.
	n := 3*recordBatch + 5
	for i := range n {
		if err := s.Put(uint64((i*7919)%1000003), randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	want := s.Digest()

	parked, resume := make(chan struct{}), make(chan struct{})
	s.afterDigestBatch = func(b int) {
		if b == 1 {
			close(parked)
			<-resume
		}
	}
	v := s.PinQuery()
	got := make(chan string, 1)
	go func() { got <- v.Digest() }()
	<-parked
	put := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < n && err == nil; i += 3 { // hashed and not yet hashed slots
			err = s.Put(uint64((i*7919)%1000003), randVec(r, dim))
		}
		for i := range 10 {
			if err == nil {
				err = s.Put(uint64(2000000+i), randVec(r, dim)) // appends
			}
		}
		put <- err
	}()
	select {
	case err := <-put:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a deadlock detector, not a timing bound
		close(resume)
		t.Fatal("expected Puts to complete while a digest is parked between batches; still blocked after a minute (the digest holds the store's lock)")
	}
	if s.Digest() == want {
		t.Fatal("the store did not change after the pin: the test proves nothing")
	}
	// A Restore detaches the view; it reads on from what it pinned.
	other := newSmall(dim, perChunk)
	if err := other.Put(5, randVec(r, dim)); err != nil {
		t.Fatal(err)
	}
	var osnap bytes.Buffer
	if err := other.Snapshot(&osnap); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(&osnap); err != nil {
		t.Fatal(err)
	}
	close(resume)
	if d := <-got; d != want {
		t.Fatalf("expected the view's digest to be the store's at the pin %s, found %s", want, d)
	}
	v.Release()
	if d := s.Digest(); d != other.Digest() {
		t.Fatalf("after Restore: digest %s, expected the restored store's %s", d, other.Digest())
	}
	// The view can say "different": a view pinned now hashes the new state.
	s.afterDigestBatch = nil
	w := s.PinQuery()
	defer w.Release()
	if d := w.Digest(); d == want || d != s.Digest() {
		t.Fatalf("a view pinned after the Restore: digest %s, expected the store's %s (and not the old %s)", d, s.Digest(), want)
	}
}

// An empty store's view digests like the empty store.
func TestQueryViewDigestEmpty(t *testing.T) {
	s := New(4)
	v := s.PinQuery()
	defer v.Release()
	if got, want := v.Digest(), s.Digest(); got != want {
		t.Fatalf("empty store: view digest %s, store digest %s", got, want)
	}
}

// A view of a store unchanged since the last digest returns the
// remembered digest without hashing; a Put or a Restore (which leaves seq
// where it was) makes the next view hash again, and every answer is
// Store.Digest's.
func TestQueryViewDigestMemo(t *testing.T) {
	const dim = 4
	s := newSmall(dim, 2)
	r := rand.New(rand.NewPCG(51, 52))
	for e := range uint64(10) {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	batches := 0
	s.afterDigestBatch = func(int) { batches++ }
	digest := func(what string, wantHash bool) {
		t.Helper()
		batches = 0
		v := s.PinQuery()
		defer v.Release()
		if got, want := v.Digest(), s.Digest(); got != want {
			t.Fatalf("%s: view digest %s, store digest %s", what, got, want)
		}
		if hashed := batches > 0; hashed != wantHash {
			t.Fatalf("%s: hashed %v (%d batches), expected %v", what, hashed, batches, wantHash)
		}
	}
	digest("first", true)
	digest("unchanged", false)
	if err := s.Put(3, randVec(r, dim)); err != nil {
		t.Fatal(err)
	}
	digest("after a Put", true)
	digest("unchanged again", false)
	other := newSmall(dim, 2)
	if err := other.Put(42, randVec(r, dim)); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	if err := other.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	digest("after a Restore", true)
}
