// Package vectors holds one embedding per entity and answers exact cosine
// top-k queries over them.
//
// The store is part of the replicated state machine: Put is applied in log
// order on every node, so it depends only on its arguments (no clock, no
// randomness, no goroutines) and the canonical state — every (entity,
// vector) pair, sorted by entity — is what Snapshot writes and Digest
// hashes. Query results are derived data and never enter that state.
//
// Layout: vectors live back to back in fixed-size chunks of []float32,
// slot i at its place in chunk i/perChunk; an entity keeps its slot for
// life, so replacing an embedding overwrites in place and the store never
// fragments. Each slot
// also keeps the vector's Euclidean norm (computed in float64), so a query
// costs one dot product per stored vector and no square roots.
//
// A Store is safe for concurrent use: Put and Restore take a write lock,
// everything else a read lock, so queries run in parallel with each other
// and never observe a half-written vector. A nearest query pins a
// QueryView (query.go) and takes the read lock one chunk at a time, so a
// Put waits for at most one chunk of a scan, never a whole one.
package vectors

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// DefaultDim is the embedding width of the reference deployment, used when
// the schema does not name one.
const DefaultDim = 1536

// MaxDim bounds the dimension a store accepts. It keeps one vector, and one
// snapshot record, within a size that a single allocation handles easily.
const MaxDim = 1 << 16

// MinNorm and MaxNorm bound the Euclidean norm of an accepted vector.
//
// Scoring computes dot(q/|q|, v) in float32 and divides by |v| afterwards.
// The normalised query has norm 1, so every partial sum of the dot product
// is bounded by |v|: with |v| <= 1e18 nothing can overflow float32
// (max ~3.4e38), and with |v| >= 1e-18 the products lost to float32
// underflow (below ~1.4e-45 each) shift a cosine by less than 1e-20.
// Real embeddings have norms near 1; anything outside this range is far
// more likely a unit bug than data.
const (
	MinNorm = 1e-18
	MaxNorm = 1e18
)

// FieldError is a rejected vector: Field names the offending part in the
// request's terms ("vector" or "vector[17]"), Message says what was
// expected and what was found.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Match is one result of a nearest-neighbour query.
type Match struct {
	Entity uint64
	Score  float32 // cosine similarity in [-1, 1]
}

// Store maps entity ids to fixed-dimension embeddings.
type Store struct {
	dim int

	mu sync.RWMutex
	// slot maps an entity to its index in entities, norms and the arena.
	slot     map[uint64]int
	entities []uint64  // slot -> entity
	norms    []float64 // slot -> Euclidean norm of the vector, in [MinNorm, MaxNorm]
	// chunks hold the vectors, perChunk slots each: slot i is
	// chunks[i/perChunk][(i%perChunk)*dim:][:dim]. Fixed-size chunks
	// mean a new entity never copies the vectors
	// already held: one growing arena copied the whole store at every
	// doubling (60 µs per new 1536-dim vector in BenchmarkPut/new).
	chunks   [][]float32
	perChunk int
	// shared[c] is set while a View (an unfinished snapshot) may read
	// chunk c: the next Put that overwrites a vector in it copies the
	// chunk first (copy-on-write), so the View keeps the bytes it froze.
	// Appends need no copy: a View never reads past the length it froze.
	shared []bool
	// frozen records the chunks that copy-on-write replaced, for Memory:
	// a View may still hold each, weakly referenced here.
	frozen []frozenChunk

	// Query views (query.go). seq counts Puts (appends and overwrites)
	// over the store's life, Restore included; putSeq[i] is the seq of the
	// last Put that wrote slot i (0 after Restore). views holds the pinned,
	// not yet released QueryViews, maxPinned the newest one's seq, and
	// undo[i] the contents slot i had before each overwrite that some
	// pinned view may need, oldest first. Invariant: for every view v in
	// views and every slot i < v.n with putSeq[i] > v.seq, undo[i] holds
	// an entry with seq > v.seq, and the first such entry holds slot i as
	// it was at v's pin. With no view pinned, undo is empty.
	seq       uint64
	putSeq    []uint64
	views     map[*QueryView]struct{}
	maxPinned uint64
	undo      map[int][]undoEntry
	// restores counts Restores; with seq it names the state: the store
	// changes only by Put (seq) and Restore, so equal (seq, restores)
	// means equal contents. memo is the digest of the state so named,
	// kept by QueryView.Digest so that a digest of an unchanged store
	// (readers looping on the state machine's digest while only signals
	// are written) hashes nothing again.
	restores uint64
	memo     digestMemo
	// afterChunk, when set (by this package's tests, or by SetAfterChunk
	// in a tidalbugs build), runs after each chunk a query view scans,
	// outside the store's lock.
	afterChunk func(chunk int)
	// afterDigestBatch, when set (by this package's tests only), runs
	// after each batch of records a QueryView's Digest copies, outside
	// the store's lock.
	afterDigestBatch func(batch int)
}

// chunkFloats is the target size of a chunk: 4 MiB of float32s.
const chunkFloats = 1 << 20

// vec returns slot i's vector (aliasing the store).
func (s *Store) vec(i int) []float32 {
	c := s.chunks[i/s.perChunk]
	off := (i % s.perChunk) * s.dim
	return c[off : off+s.dim : off+s.dim]
}

// New returns an empty store of vectors with dim components. It panics if
// dim is not in [1, MaxDim]: the dimension comes from a validated schema,
// so a bad one is a programming error.
func New(dim int) *Store {
	if dim < 1 || dim > MaxDim {
		panic(fmt.Sprintf("vectors: dimension must be in [1, %d], found %d", MaxDim, dim))
	}
	return &Store{dim: dim, slot: make(map[uint64]int), perChunk: max(1, chunkFloats/dim)}
}

// Dim returns the number of components every vector in the store has.
func (s *Store) Dim() int { return s.dim }

// Len returns the number of entities that have an embedding.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.entities)
}

// Validate reports why vec cannot be stored or used as a query, or nil if
// it can: it must have exactly Dim components, all finite, and a norm in
// [MinNorm, MaxNorm] (the zero vector has no direction, so its cosine
// similarity is undefined).
func (s *Store) Validate(vec []float32) *FieldError {
	_, ferr := s.check(vec)
	return ferr
}

// check validates vec and returns its norm.
func (s *Store) check(vec []float32) (float64, *FieldError) {
	if len(vec) != s.dim {
		return 0, &FieldError{Field: "vector",
			Message: fmt.Sprintf("expected %d components, found %d", s.dim, len(vec))}
	}
	var sumSq float64
	for i, x := range vec {
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, &FieldError{Field: fmt.Sprintf("vector[%d]", i),
				Message: fmt.Sprintf("expected a finite number, found %v", f)}
		}
		sumSq += f * f
	}
	if sumSq == 0 {
		return 0, &FieldError{Field: "vector",
			Message: "expected a non-zero vector (cosine similarity is undefined for the zero vector), found all zeros"}
	}
	norm := math.Sqrt(sumSq)
	if norm < MinNorm || norm > MaxNorm {
		return 0, &FieldError{Field: "vector",
			Message: fmt.Sprintf("expected a norm in [%g, %g], found %.3g", MinNorm, MaxNorm, norm)}
	}
	return norm, nil
}

// Put stores a copy of vec as entity's embedding, replacing any earlier
// one. An invalid vector is rejected with a *FieldError and changes
// nothing.
func (s *Store) Put(entity uint64, vec []float32) error {
	norm, ferr := s.check(vec)
	if ferr != nil {
		return ferr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(entity, vec, norm)
	return nil
}

func (s *Store) putLocked(entity uint64, vec []float32, norm float64) {
	s.seq++
	i, ok := s.slot[entity]
	if !ok {
		// An append needs no undo entry: a view never reads past the
		// length it pinned. Its putSeq is above every pinned view's seq,
		// so a later overwrite of this slot records nothing for them.
		i = len(s.entities)
		s.slot[entity] = i
		s.entities = append(s.entities, entity)
		s.norms = append(s.norms, norm)
		s.putSeq = append(s.putSeq, s.seq)
		if i%s.perChunk == 0 {
			s.chunks = append(s.chunks, make([]float32, 0, s.perChunk*s.dim))
			s.shared = append(s.shared, false)
		}
		last := len(s.chunks) - 1
		s.chunks[last] = append(s.chunks[last], vec...)
		return
	}
	// A view pinned since the slot's last write (seq >= putSeq[i]) reads
	// the slot's current contents as of its pin: save them. Views pinned
	// earlier already have an entry from an earlier overwrite (the
	// invariant on undo), so when no view was pinned in between, nothing
	// is saved and a slot put many times during one scan costs one copy.
	if len(s.views) > 0 && s.putSeq[i] <= s.maxPinned {
		if s.undo == nil {
			s.undo = make(map[int][]undoEntry)
		}
		s.undo[i] = append(s.undo[i], undoEntry{seq: s.seq, vec: slices.Clone(s.vec(i)), norm: s.norms[i]})
	}
	s.putSeq[i] = s.seq
	s.norms[i] = norm
	if c := i / s.perChunk; s.shared[c] {
		old := s.chunks[c]
		s.chunks[c] = make([]float32, len(old), cap(old))
		copy(s.chunks[c], old)
		s.shared[c] = false
		s.noteFrozenLocked(old)
	}
	copy(s.vec(i), vec)
}

// Get returns a copy of entity's embedding, exactly as it was put.
func (s *Store) Get(entity uint64) ([]float32, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.slot[entity]
	if !ok {
		return nil, false
	}
	out := make([]float32, s.dim)
	copy(out, s.vec(i))
	return out, true
}
