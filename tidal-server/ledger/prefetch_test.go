package ledger

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// The staged prefetch of large batches only
// reads, and the hash table that finds a large batch's in-batch duplicates
// finds what a linear scan finds: a history of batches with retries,
// in-batch duplicates, conflicts and invalid events, applied with both and
// with neither, gives the same results, the same errors and the same
// state, across id-memory rotations.
func TestPrefetchedApplyMatchesPlain(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	signals := []string{"view", "like", "share", "skip"}
	fast := New(DefaultSchema(), Options{IDsPerGeneration: 300})
	plain := New(DefaultSchema(), Options{IDsPerGeneration: 300})
	var refused int
	for index := uint64(1); index <= 400; index++ {
		batch := make([]Event, 1+rng.IntN(40))
		for i := range batch {
			id := rng.IntN(2000)
			batch[i] = Event{ID: fmt.Sprintf("e%d", id), Entity: uint64(id % 331), Signal: signals[id%4], Weight: float64(1 + id%3), TS: t0 + rng.Int64N(1e9)}
			switch rng.IntN(60) {
			case 0: // the id again with another payload: a conflict
				batch[i].Weight += 1
			case 1: // an invalid event
				batch[i].Weight = math.NaN()
			}
		}
		if len(batch) > 2 && rng.IntN(4) == 0 {
			batch[len(batch)-1] = batch[0] // an in-batch duplicate
		}
		if len(batch) > 20 && rng.IntN(8) == 0 {
			batch[len(batch)-2] = batch[1] // an in-batch conflict
			batch[len(batch)-2].Entity++
		}
		got, gotErr := fast.Apply(index, 1, batch)
		func() {
			defer func(p, s int) { prefetchMin, linearSeenMax = p, s }(prefetchMin, linearSeenMax)
			prefetchMin, linearSeenMax = math.MaxInt, math.MaxInt
			want, wantErr := plain.Apply(index, 1, batch)
			if got != want || !reflect.DeepEqual(gotErr, wantErr) {
				t.Fatalf("entry %d: prefetched %+v, %v; plain %+v, %v", index, got, gotErr, want, wantErr)
			}
			if gotErr != nil {
				refused++
				fast.SetApplied(index)
				plain.SetApplied(index)
			}
		}()
		if fast.Check(batch) == nil != (plain.Check(batch) == nil) {
			t.Fatalf("entry %d: Check disagrees", index)
		}
	}
	if fast.Digest() != plain.Digest() {
		t.Fatalf("digests differ: prefetched %s, plain %s", fast.Digest(), plain.Digest())
	}
	if refused == 0 || fast.Stats() != plain.Stats() {
		t.Fatalf("refused %d entries (want some); stats %+v vs %+v", refused, fast.Stats(), plain.Stats())
	}
}
