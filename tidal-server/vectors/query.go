package vectors

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
)

// QueryView is the store as it was at one moment, for nearest-neighbour
// queries that must not hold any lock for a whole scan. PinQuery costs a
// few slice headers (one per 4 MiB chunk) under the store's lock; Nearest
// then takes the store's read lock one chunk at a time, so a Put waits
// for at most one chunk's scoring, never a whole scan; and the answer is
// exactly the one Store.Nearest would have given at the pin.
//
// How the pin is kept (unlike Freeze, no chunk is ever copied for it):
// appends are invisible because a view reads only the n slots it pinned;
// an overwrite of one of those slots while the view is pinned saves the
// slot's previous vector and norm in the store's undo record (see Store,
// putLocked), and the view scores that saved copy for any slot whose
// putSeq is past its own seq. Every other slot has not been written since
// the pin, so its bytes are read where they lie:
//
//   - chunks: the view keeps the chunk headers it pinned. A Freeze
//     copy-on-write after the pin moves the live chunk to a copy and
//     leaves the pinned array as it was when copied; every slot written
//     after that copy is past the view's seq and read from undo, so the
//     pinned array is exact for every slot the view reads from it.
//     Appends to the last chunk write only past the pinned length (the
//     chunk never reallocates: it is made at full capacity).
//   - norms and entities: the view keeps the headers it pinned. An append
//     that reallocates them leaves the old array behind, no longer
//     written; as with chunks, a slot overwritten since the pin is read
//     from undo, and entities are never overwritten.
//   - Restore replaces every array; the views pinned before it are
//     detached: each keeps the putSeq array and undo map as they were at
//     the Restore (both replaced then, so never written again) and reads
//     on from its own headers.
//
// All reads of live store memory happen under the store's read lock, all
// writes under its write lock, so the race detector sees no conflict.
//
// A QueryView must be released (Release) once the query is done: until
// then every overwrite of a slot it pinned copies the old vector. Nearest
// may be called any number of times, from any goroutines, before Release.
type QueryView struct {
	s        *Store
	seq      uint64
	restores uint64 // the store's Restore count at the pin
	n        int
	entities []uint64
	norms    []float64
	chunks   [][]float32
	hook     func(chunk int)
	// afterBatch runs after each batch of records Digest copies, with
	// the store's lock released (tests only: Store.afterDigestBatch).
	afterBatch func(batch int)

	// Written under the store's write lock, read under its read lock.
	released bool
	detached *undoBook // set by Restore: the bookkeeping as of then
}

// undoEntry is slot contents saved before an overwrite: the Put with seq
// replaced vec (and its norm).
type undoEntry struct {
	seq  uint64
	vec  []float32
	norm float64
}

// undoBook is a view's bookkeeping once a Restore detached it.
type undoBook struct {
	putSeq []uint64
	undo   map[int][]undoEntry
}

// PinQuery returns a QueryView of the store as it is now (see QueryView).
// The caller must Release it.
func (s *Store) PinQuery() *QueryView {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.entities)
	v := &QueryView{s: s, seq: s.seq, restores: s.restores, n: n,
		entities: s.entities[:n:n], norms: s.norms[:n:n],
		chunks: slices.Clone(s.chunks), hook: s.afterChunk, afterBatch: s.afterDigestBatch}
	if s.views == nil {
		s.views = make(map[*QueryView]struct{})
	}
	s.views[v] = struct{}{}
	s.maxPinned = s.seq // seq never decreases, so the newest view has the largest
	return v
}

// Len is the number of entities the view holds.
func (v *QueryView) Len() int { return v.n }

// Release ends the view: undo entries that no remaining view needs are
// dropped (an entry saved by the Put with seq P is needed only by views
// pinned before it, seq < P), and with no view left the undo record is
// empty. Release is idempotent; the view must not be queried after it.
func (v *QueryView) Release() {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.released {
		return
	}
	v.released = true
	if v.detached != nil {
		return // no longer in s.views; its book is garbage once v is
	}
	delete(s.views, v)
	if len(s.views) == 0 {
		s.undo, s.maxPinned = nil, 0
		return
	}
	oldest, newest := uint64(math.MaxUint64), uint64(0)
	for w := range s.views {
		oldest, newest = min(oldest, w.seq), max(newest, w.seq)
	}
	s.maxPinned = newest
	for i, es := range s.undo {
		k := 0
		for k < len(es) && es[k].seq <= oldest {
			k++
		}
		switch {
		case k == len(es):
			delete(s.undo, i)
		case k > 0:
			s.undo[i] = slices.Clone(es[k:])
		}
	}
}

// detachViewsLocked hands every pinned view the current putSeq and undo
// (about to be replaced by Restore) and forgets them; the store's undo
// is then empty. Called with the write lock held.
func (s *Store) detachViewsLocked() {
	if len(s.views) > 0 {
		book := &undoBook{putSeq: s.putSeq, undo: s.undo}
		for v := range s.views {
			v.detached = book
		}
	}
	s.views, s.undo, s.maxPinned = nil, nil, 0
}

// prepareQuery validates k and q and returns q scaled to unit norm.
// Normalising the query once makes every partial dot product bounded by
// the stored vector's norm (see MinNorm/MaxNorm), and leaves one division
// per candidate.
func (s *Store) prepareQuery(q []float32, k int) ([]float32, error) {
	if k <= 0 {
		return nil, &FieldError{Field: "k", Message: fmt.Sprintf("expected a positive number of results, found %d", k)}
	}
	qnorm, ferr := s.check(q)
	if ferr != nil {
		return nil, ferr
	}
	unit := make([]float32, len(q))
	for i, x := range q {
		unit[i] = float32(float64(x) / qnorm)
	}
	return unit, nil
}

// Nearest answers Store.Nearest(q, k) as of the view's pin: same scores,
// same order, same errors. It holds the store's read lock for one chunk
// at a time.
func (v *QueryView) Nearest(q []float32, k int) ([]Match, error) {
	unit, err := v.s.prepareQuery(q, k)
	if err != nil {
		return nil, err
	}
	return v.scan(unit, k), nil
}

// scan scores the view's slots against the unit query, one chunk per
// hold of the read lock, and returns the k best.
func (v *QueryView) scan(unit []float32, k int) []Match {
	s := v.s
	h := topK{items: make([]Match, 0, min(k, v.n)), k: k}
	for c := 0; c*s.perChunk < v.n; c++ {
		v.scoreChunk(c, unit, &h)
		if v.hook != nil {
			v.hook(c)
		}
	}
	return h.sorted()
}

// scoreChunk offers chunk c's pinned slots to h, under the read lock.
func (v *QueryView) scoreChunk(c int, unit []float32, h *topK) {
	s := v.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	book := v.bookLocked()
	for i := c * s.perChunk; i < min(v.n, (c+1)*s.perChunk); i++ {
		vec, norm := v.slotLocked(i, book)
		d := dot(unit, vec)
		score := float32(float64(d) / norm)
		// Rounding can push a cosine a hair outside [-1, 1].
		score = float32(math.Max(-1, math.Min(1, float64(score))))
		h.offer(Match{Entity: v.entities[i], Score: score})
	}
}

// bookLocked returns the bookkeeping that says which of the view's slots
// were overwritten since its pin: the store's, or the one a Restore
// handed the view. Called with the store's lock held, and panics on a
// released view.
func (v *QueryView) bookLocked() undoBook {
	s := v.s
	if v.released {
		panic("vectors: QueryView read after Release")
	}
	if v.detached != nil {
		return *v.detached
	}
	return undoBook{putSeq: s.putSeq, undo: s.undo}
}

// slotLocked returns slot i's vector and norm as of the view's pin: where
// they lie, or the undo entry saved when the slot was overwritten after
// the pin. The vector aliases store memory, valid while the lock is held.
func (v *QueryView) slotLocked(i int, book undoBook) ([]float32, float64) {
	s := v.s
	if book.putSeq[i] > v.seq {
		e, ok := asOf(book.undo[i], v.seq)
		if !ok {
			panic(fmt.Sprintf("vectors: slot %d written at seq %d after a view pinned at %d, with no undo entry", i, book.putSeq[i], v.seq))
		}
		return e.vec, e.norm
	}
	off := (i % s.perChunk) * s.dim
	return v.chunks[i/s.perChunk][off : off+s.dim : off+s.dim], v.norms[i]
}

// Digest returns the digest Store.Digest returned at the view's pin: the
// SHA-256 of the canonical encoding of every (entity, vector) the view
// holds. It takes the store's read lock only to copy recordBatch records
// at a time, and sorts and hashes without it, so Puts go on while a
// large store is hashed: each waits for at most one batch's copy.
//
// The digest of the newest state hashed is remembered (Store.memo): a
// view of a store that has not changed since returns it without hashing.
func (v *QueryView) Digest() string {
	s := v.s
	s.mu.RLock()
	m := s.memo
	s.mu.RUnlock()
	if m.digest != "" && m.seq == v.seq && m.restores == v.restores {
		return m.digest
	}
	h := sha256.New()
	if err := v.encode(h); err != nil {
		// hash.Hash.Write never fails.
		panic(fmt.Sprintf("vectors: hashing state: %v", err))
	}
	d := hex.EncodeToString(h.Sum(nil))
	s.mu.Lock()
	if v.restores == s.restores && v.seq >= s.memo.seq {
		s.memo = digestMemo{seq: v.seq, restores: v.restores, digest: d}
	}
	s.mu.Unlock()
	return d
}

// digestMemo is the digest of the store's state at (seq, restores);
// empty digest: none.
type digestMemo struct {
	seq, restores uint64
	digest        string
}

// encode writes the canonical encoding (see Store.Snapshot) of the store
// as of the view's pin. The sort reads the pinned entities without the
// lock: an entity's slot entry is written once, by the append that made
// it, before the pin, and never again (a Restore replaces the array).
func (v *QueryView) encode(w io.Writer) error {
	s := v.s
	size := recordSize(s.dim)
	batch := 0
	return encodeSorted(w, s.dim, v.entities, func(slots []int32, buf []byte) {
		if batch > 0 {
			// Hashing is all CPU; yield between batches so that a
			// goroutine on the apply path gets the processor now rather
			// than at the next preemption, up to 10 ms later.
			runtime.Gosched()
		}
		v.copyRecords(slots, buf, size)
		if v.afterBatch != nil {
			v.afterBatch(batch)
		}
		batch++
	})
}

// copyRecords encodes the records of slots, as of the pin, into buf,
// under the store's read lock.
func (v *QueryView) copyRecords(slots []int32, buf []byte, size int) {
	s := v.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	book := v.bookLocked()
	for k, i := range slots {
		vec, _ := v.slotLocked(int(i), book)
		putRecord(buf[k*size:], v.entities[i], vec)
	}
}

// asOf returns the first entry (oldest first) saved by a Put after seq:
// the contents the slot had at seq.
func asOf(es []undoEntry, seq uint64) (undoEntry, bool) {
	for _, e := range es {
		if e.seq > seq {
			return e, true
		}
	}
	return undoEntry{}, false
}
