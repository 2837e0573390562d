package vectors

import (
	"bytes"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// newSmall returns a store of dim-wide vectors with perChunk slots per
// chunk, so a few dozen small vectors span several chunks (the real size
// needs MaxDim for that, and such scans are slow under -race).
func newSmall(dim, perChunk int) *Store {
	s := New(dim)
	s.perChunk = perChunk
	return s
}

// bruteNearest is the reference answer over a plain map: every entity
// scored the way the store scores (float32 dot of the unit query, divided
// by the float64 norm, clamped), all sorted, the first k kept. It shares
// no code with the scan, the heap or the undo record.
func bruteNearest(t *testing.T, dim int, model map[uint64][]float32, q []float32, k int) []Match {
	t.Helper()
	ref := New(dim)
	unit, err := ref.prepareQuery(q, k)
	if err != nil {
		t.Fatal(err)
	}
	all := make([]Match, 0, len(model))
	for e, v := range model {
		norm, ferr := ref.check(v)
		if ferr != nil {
			t.Fatal(ferr)
		}
		score := float32(float64(dot(unit, v)) / norm)
		score = float32(math.Max(-1, math.Min(1, float64(score))))
		all = append(all, Match{Entity: e, Score: score})
	}
	slices.SortFunc(all, func(a, b Match) int {
		switch {
		case worse(b, a):
			return -1
		case worse(a, b):
			return 1
		}
		return 0
	})
	return all[:min(k, len(all))]
}

// undoLen counts the entries in the store's undo record.
func (s *Store) undoLen() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, es := range s.undo {
		n += len(es)
	}
	return n
}

func putModel(t *testing.T, s *Store, model map[uint64][]float32, e uint64, v []float32) {
	t.Helper()
	if err := s.Put(e, v); err != nil {
		t.Fatal(err)
	}
	model[e] = slices.Clone(v)
}

func scaled(v []float32, f float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = x * f
	}
	return out
}

// A QueryView answers as of its pin: overwrites after it (which change
// the true top-k), appends, a Freeze copy-on-write and a slot put twice
// with a second view pinned between the two puts leave each view's
// answer equal to the brute-force answer over the state at its pin.
func TestQueryViewIsPointInTime(t *testing.T) {
	const dim, perChunk = 8, 4
	s := newSmall(dim, perChunk)
	r := rand.New(rand.NewPCG(21, 22))
	model := map[uint64][]float32{}
	for e := range uint64(22) { // five full chunks and a half one
		putModel(t, s, model, 100+e, randVec(r, dim))
	}
	q := randVec(r, dim)
	ks := []int{1, 3, 7, 22, 40}
	wantAt := func(m map[uint64][]float32) map[int][]Match {
		out := map[int][]Match{}
		for _, k := range ks {
			out[k] = bruteNearest(t, dim, m, q, k)
		}
		return out
	}
	want1 := wantAt(model)
	v1 := s.PinQuery()
	defer v1.Release()

	// The old best becomes the worst, a middle one becomes the best, the
	// last slot of a chunk and one in the half chunk change, and new
	// entities arrive (one into the half chunk, then a new chunk) with one
	// of them the best of all.
	best := want1[1][0].Entity
	putModel(t, s, model, best, scaled(q, -1))
	putModel(t, s, model, 110, scaled(q, 3))
	putModel(t, s, model, 103, randVec(r, dim))
	putModel(t, s, model, 121, randVec(r, dim))
	putModel(t, s, model, 500, scaled(q, 0.5))
	for e := range uint64(6) {
		putModel(t, s, model, 600+e, randVec(r, dim))
	}
	// A snapshot View makes the next overwrite in a chunk copy it: the
	// views must read the right bytes on either side of the copy.
	s.Freeze()
	putModel(t, s, model, 105, scaled(q, 2)) // first put of slot 5, chunk 1 copied
	putModel(t, s, model, 104, randVec(r, dim))

	want2 := wantAt(model)
	v2 := s.PinQuery()
	defer v2.Release()
	putModel(t, s, model, 105, scaled(q, -2)) // second put of slot 5, after v2
	putModel(t, s, model, 102, scaled(q, 5))
	putModel(t, s, model, 700, randVec(r, dim))
	wantNow := wantAt(model)

	if slices.Equal(want1[3], wantNow[3]) || slices.Equal(want2[3], wantNow[3]) || slices.Equal(want1[3], want2[3]) {
		t.Fatal("test setup: expected the puts to change the true top 3 between the pins and now")
	}
	if got := len(s.undo[5]); got != 2 {
		t.Fatalf("expected two undo entries for slot 5 (put once before and once after the second pin), found %d", got)
	}
	for _, k := range ks {
		for _, c := range []struct {
			name string
			v    *QueryView
			want []Match
		}{{"first view", v1, want1[k]}, {"second view", v2, want2[k]}} {
			got, err := c.v.Nearest(q, k)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("%s, k=%d: expected the answer at its pin %v, found %v", c.name, k, c.want, got)
			}
		}
		got, err := s.Nearest(q, k)
		if err != nil || !slices.Equal(got, wantNow[k]) {
			t.Fatalf("Store.Nearest, k=%d: expected the live answer %v, found %v (%v)", k, wantNow[k], got, err)
		}
	}
}

// A QueryView validates exactly as Store.Nearest does.
func TestQueryViewValidates(t *testing.T) {
	s := newSmall(4, 2)
	if err := s.Put(1, []float32{1, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	v := s.PinQuery()
	defer v.Release()
	for _, c := range []struct {
		q     []float32
		k     int
		field string
	}{
		{[]float32{1, 0, 0, 0}, 0, "k"},
		{[]float32{1, 0, 0}, 1, "vector"},
		{[]float32{0, 0, 0, 0}, 1, "vector"},
		{[]float32{1, float32(math.NaN()), 0, 0}, 1, "vector[1]"},
	} {
		_, verr := v.Nearest(c.q, c.k)
		_, serr := s.Nearest(c.q, c.k)
		fe, ok := verr.(*FieldError)
		if !ok || fe.Field != c.field || serr == nil || serr.Error() != verr.Error() {
			t.Fatalf("q=%v k=%d: expected a *FieldError on %q, the same as Store.Nearest's (%v), found %v", c.q, c.k, c.field, serr, verr)
		}
	}
	if n := s.undoLen(); n != 0 || len(s.views) != 1 {
		t.Fatalf("expected invalid Store.Nearest calls to pin nothing (1 view, no undo), found %d views, %d entries", len(s.views), n)
	}
}

// The regression (issue: a nearest scan held the store's lock, and the
// state machine's, for the whole scan): with a scan parked between two
// chunks, a Put — an overwrite and an append — completes, and the parked
// scan still answers as of its start.
func TestPutCompletesWhileScanIsParked(t *testing.T) {
	const dim, perChunk = 8, 4
	s := newSmall(dim, perChunk)
	r := rand.New(rand.NewPCG(31, 32))
	model := map[uint64][]float32{}
	for e := range uint64(16) {
		putModel(t, s, model, e, randVec(r, dim))
	}
	q := randVec(r, dim)
	want := bruteNearest(t, dim, model, q, 3)

	parked, resume := make(chan struct{}), make(chan struct{})
	s.afterChunk = func(c int) { // set before any view is pinned: no lock needed
		if c == 1 {
			close(parked)
			<-resume
		}
	}
	type result struct {
		m   []Match
		err error
	}
	scan := make(chan result, 1)
	go func() {
		m, err := s.Nearest(q, 3)
		scan <- result{m, err}
	}()
	<-parked
	put := make(chan error, 1)
	go func() {
		err := s.Put(want[0].Entity, scaled(q, -1)) // overwrite the best
		if err == nil {
			err = s.Put(3, scaled(q, 1)) // overwrite in chunk 0, already scanned
		}
		if err == nil {
			err = s.Put(99, scaled(q, 1)) // append
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
		t.Fatal("expected Puts to complete while a nearest scan is parked between chunks; they were still blocked after a minute (the scan holds the store's lock)")
	}
	close(resume)
	got := <-scan
	if got.err != nil || !slices.Equal(got.m, want) {
		t.Fatalf("expected the parked scan to answer as of its start %v, found %v (%v)", want, got.m, got.err)
	}
	if n := s.undoLen(); n != 0 {
		t.Fatalf("expected no undo entries once the scan released its view, found %d", n)
	}
}

// The undo record holds only what a pinned view needs: nothing without
// views, one entry per slot per overwrite with a view pinned since the
// slot's last write, pruned as soon as no view older than the entry is
// left, and emptied when the last view goes. Release is idempotent.
func TestUndoIsPrunedOnRelease(t *testing.T) {
	const dim = 4
	s := newSmall(dim, 2)
	r := rand.New(rand.NewPCG(41, 42))
	for e := range uint64(6) {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	put := func(e uint64) {
		t.Helper()
		if err := s.Put(e, randVec(r, dim)); err != nil {
			t.Fatal(err)
		}
	}
	put(0) // no view: nothing saved
	if n := s.undoLen(); n != 0 {
		t.Fatalf("expected no undo entries without a pinned view, found %d", n)
	}
	old := s.PinQuery()
	put(1)
	put(1) // no view pinned since the first overwrite: nothing more saved
	put(9) // append: nothing saved
	put(9)
	if n := s.undoLen(); n != 1 {
		t.Fatalf("expected one undo entry (slot 1's first overwrite after the pin), found %d", n)
	}
	young := s.PinQuery()
	put(1) // young needs slot 1 as of its pin
	put(2) // both need it: one entry serves both
	if n := s.undoLen(); n != 3 {
		t.Fatalf("expected three undo entries, found %d", n)
	}
	old.Release()
	// Slot 1's first entry was needed by old only; slot 1's second and
	// slot 2's are younger than young's pin.
	if n, es := s.undoLen(), s.undo[1]; n != 2 || len(es) != 1 || es[0].seq <= young.seq {
		t.Fatalf("expected the entry only the released older view needed to be pruned (2 left, one for slot 1), found %d", n)
	}
	old.Release() // idempotent: young's entries stay
	if n := s.undoLen(); n != 2 || len(s.views) != 1 {
		t.Fatalf("expected a second Release to change nothing, found %d entries, %d views", n, len(s.views))
	}
	young.Release()
	if n := s.undoLen(); n != 0 || len(s.views) != 0 || s.undo != nil {
		t.Fatalf("expected an empty undo record with no view pinned, found %d entries, %d views", n, len(s.views))
	}
	put(3)
	if n := s.undoLen(); n != 0 {
		t.Fatalf("expected nothing saved after every view was released, found %d", n)
	}
}

// A view pinned before a Restore keeps its answer (it reads the arrays
// it pinned, which the Restore replaced, and the bookkeeping as of the
// Restore), including overwrites made before the Restore; a view pinned
// after it sees the restored state, and Puts after it leave both right.
func TestQueryViewAcrossRestore(t *testing.T) {
	const dim, perChunk = 8, 4
	s := newSmall(dim, perChunk)
	r := rand.New(rand.NewPCG(51, 52))
	model := map[uint64][]float32{}
	for e := range uint64(10) {
		putModel(t, s, model, e, randVec(r, dim))
	}
	q := randVec(r, dim)
	want1 := bruteNearest(t, dim, model, q, 4)
	v1 := s.PinQuery()
	defer v1.Release()
	putModel(t, s, model, want1[0].Entity, scaled(q, -1))

	other := New(dim)
	restored := map[uint64][]float32{}
	for e := range uint64(7) {
		putModel(t, other, restored, 50+e, randVec(r, dim))
	}
	var snap bytes.Buffer
	if err := other.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	want2 := bruteNearest(t, dim, restored, q, 4)
	v2 := s.PinQuery()
	defer v2.Release()
	putModel(t, s, restored, want2[0].Entity, scaled(q, -1))
	putModel(t, s, restored, 52, scaled(q, 1))
	putModel(t, s, restored, 90, randVec(r, dim))

	for _, c := range []struct {
		name string
		v    *QueryView
		want []Match
	}{{"pinned before the Restore", v1, want1}, {"pinned after it", v2, want2}} {
		got, err := c.v.Nearest(q, 4)
		if err != nil || !slices.Equal(got, c.want) {
			t.Fatalf("view %s: expected %v, found %v (%v)", c.name, c.want, got, err)
		}
	}
	if got, _ := s.Nearest(q, 4); !slices.Equal(got, bruteNearest(t, dim, restored, q, 4)) {
		t.Fatalf("live answer after Restore: found %v", got)
	}
	v1.Release()
	if n := s.undoLen(); n != 2 {
		t.Fatalf("expected releasing the detached view to leave the live view's 2 entries, found %d", n)
	}
}

// Puts (overwrites and appends), pinned scans and a Restore run at once;
// every scan equals the brute-force answer over the state at its pin, and
// no undo is left at the end. Run with -race.
func TestQueryViewStress(t *testing.T) {
	const dim, perChunk, n0 = 4, 16, 200
	s := newSmall(dim, perChunk)
	r := rand.New(rand.NewPCG(61, 62))
	// The model is updated under mu together with each Put, so a pin
	// taken under mu sees exactly the model's state.
	var mu sync.Mutex
	model := map[uint64][]float32{}
	for e := range uint64(n0) {
		putModel(t, s, model, e, randVec(r, dim))
	}
	var snap bytes.Buffer
	if err := s.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	snapModel := maps.Clone(model)

	const writers, readers, rounds = 2, 3, 150
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(70, uint64(w)))
			for i := range rounds * 4 {
				e := uint64(r.IntN(n0 + 40)) // mostly overwrites, some appends
				v := randVec(r, dim)
				mu.Lock()
				if err := s.Put(e, v); err != nil {
					mu.Unlock()
					t.Error(err)
					return
				}
				model[e] = v
				if w == 0 && i == rounds*2 {
					// A view pinned across the Restore, with overwrites
					// between its pin and the Restore, besides whatever
					// the readers hold pinned now.
					vr, at := s.PinQuery(), maps.Clone(model)
					for e := range uint64(n0) {
						if err := s.Put(e, randVec(r, dim)); err != nil {
							mu.Unlock()
							t.Error(err)
							return
						}
					}
					if err := s.Restore(bytes.NewReader(snap.Bytes())); err != nil {
						mu.Unlock()
						t.Error(err)
						return
					}
					model = maps.Clone(snapModel)
					mu.Unlock()
					q := randVec(r, dim)
					got, err := vr.Nearest(q, 5)
					vr.Release()
					if want := bruteNearest(t, dim, at, q, 5); err != nil || !slices.Equal(got, want) {
						t.Errorf("view pinned across the Restore: expected %v, found %v (%v)", want, got, err)
						return
					}
					continue
				}
				mu.Unlock()
			}
		}()
	}
	for g := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(80, uint64(g)))
			for range rounds {
				q := randVec(r, dim)
				k := 1 + r.IntN(12)
				mu.Lock()
				v := s.PinQuery()
				at := maps.Clone(model)
				mu.Unlock()
				got, err := v.Nearest(q, k)
				v.Release()
				if err != nil {
					t.Error(err)
					return
				}
				if want := bruteNearest(t, dim, at, q, k); !slices.Equal(got, want) {
					t.Errorf("scan k=%d: expected the answer at its pin %v, found %v", k, want, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := s.undoLen(); n != 0 || len(s.views) != 0 {
		t.Fatalf("expected no views and no undo at the end, found %d views, %d entries", len(s.views), n)
	}
}
