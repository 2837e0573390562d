package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// goldenHistory applies a seeded history with many entities, every
// signal, retries, conflicts, out-of-order timestamps over days (so window
// buckets are pruned) and id-memory rotations, and returns the ledger.
func goldenHistory(seed uint64) *Ledger {
	rng := rand.New(rand.NewPCG(seed, 7))
	signals := []string{"view", "like", "share", "skip"}
	l := New(DefaultSchema(), Options{IDsPerGeneration: 3000})
	for index := uint64(1); index <= 2000; index++ {
		batch := make([]Event, 1+rng.IntN(8))
		for i := range batch {
			id := rng.IntN(20000)
			batch[i] = Event{
				ID:     fmt.Sprintf("g%d", id),
				Entity: uint64(id%5000) * 7919, // spread over the 64-bit space a little
				Signal: signals[id%len(signals)],
				Weight: float64(1 + id%3),
				TS:     t0 + int64(index)*ms(time.Minute) - rng.Int64N(ms(3*time.Hour)),
			}
			if rng.IntN(50) == 0 {
				batch[i].Entity++ // a conflict with an earlier use of the id, sometimes
			}
		}
		if _, err := l.Apply(index, 1+index/500, batch); err != nil {
			l.SetApplied(index)
		}
	}
	return l
}

// TestStateBytesUnchangedByLayout pins the canonical encoding (snapshot
// bytes and digest) of seeded histories to the values the ledger produced
// before the chunked layout (map of entity pointers, map-indexed id
// memory; commit 023c0e2): the in-memory layout may change, the
// replicated state and its snapshot format must not, or replicas running
// different builds would report different digests for the same log.
func TestStateBytesUnchangedByLayout(t *testing.T) {
	want := map[uint64]string{
		1: "ed83cc9a1a9e7cf195b1cd3fde1b811a722ff0ae4db610f37f71460dd7bc52fc 4978dc8ec9a4692a730178b5d39da8e5fdb27629f8a9450e668ed9fa0000bf3a",
		2: "177077a0eb062dc84813f8e877e9e222518a6b9097ab380ac4abc766c687b1cf ef0ba2e9173c3252cee56baa88eff620480a8fb992cd6d41454b947dea2e46c5",
		3: "c7bd0fa5511c13c0a301ea2c8124858bb4ddad13af273741cf97266ff6a80c99 aa521f91c65a1d5130851ffbc7ef5e6bb3181b8ec630abf35dcb9280ca8147b6",
	}
	for seed, digest := range want {
		l := goldenHistory(seed)
		var buf bytes.Buffer
		if err := l.Snapshot(&buf); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(buf.Bytes())
		got := l.Digest() + " " + hex.EncodeToString(sum[:])
		if got != digest {
			t.Errorf("seed %d: digest and snapshot hash %s, expected %s (stats %+v)", seed, got, digest, l.Stats())
		}
		// A restored copy encodes to the same bytes.
		r := New(DefaultSchema(), Options{IDsPerGeneration: 3000})
		if err := r.Restore(bytes.NewReader(buf.Bytes())); err != nil {
			t.Fatal(err)
		}
		if r.Digest() != l.Digest() {
			t.Errorf("seed %d: restored digest %s, original %s", seed, r.Digest(), l.Digest())
		}
	}
}

// TestCellsKeepTheirAddressAsEntitiesArrive pins the chunked cell storage:
// adding entities never moves the cells already held.
// Before, all cells were one slice that append copied whole as it grew
// (a quarter of a follower's CPU while a node met new entities), and a
// cell's address changed with each copy.
func TestCellsKeepTheirAddressAsEntitiesArrive(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	mustApply(t, l, 1, ev("first", 1, "like", 1, t0))
	c := l.cellAt(l.entitySlot(1), 1)
	for i := range 5000 {
		mustApply(t, l, uint64(i+2), ev(fmt.Sprintf("e%d", i), uint64(i+2), "like", 1, t0))
	}
	if got := l.cellAt(l.entitySlot(1), 1); got != c {
		t.Fatalf("entity 1's cell moved from %p to %p after 5,000 new entities", c, got)
	}
	if c.count != 1 {
		t.Fatalf("entity 1's like count %d, expected 1", c.count)
	}
}

// TestWindowBucketsSpillAndPrune drives one window past its record's
// inline buckets (into a spill slice), prunes it back below, and checks
// every count against a brute-force sum after each event, and that the
// snapshot of the spilled state restores to the same digest.
func TestWindowBucketsSpillAndPrune(t *testing.T) {
	s := Schema{Signals: []SignalType{{Name: "view", HalfLife: time.Hour, Windows: []Window{{"1h", time.Hour}, {"all", 0}}}}, EmbeddingDim: 4}
	l := New(s, Options{})
	width := ms(time.Hour) / BucketsPerWindow
	var tss []int64
	ts := t0
	for i := range 3 * BucketsPerWindow {
		// Mostly a new bucket each event, sometimes the same one, and
		// late events now and then.
		switch {
		case i%7 == 3:
		case i%11 == 5:
			ts -= 5 * width
		default:
			ts += width + int64(i%3)
		}
		tss = append(tss, ts)
		mustApply(t, l, uint64(i+1), ev(fmt.Sprintf("w%d", i), 9, "view", 1, ts))
		at := slices.Max(tss)
		top := at / width
		var want uint64
		for _, x := range tss {
			if k := x / width; k >= top-BucketsPerWindow && k <= top {
				want++
			}
		}
		if got := l.Get(9, at).Signals["view"].Windows["1h"]; got != want {
			t.Fatalf("after event %d: 1h window %d, expected %d", i, got, want)
		}
	}
	c := l.cellAt(l.entitySlot(9), 0)
	if r := &l.cellWins(c, &l.sigs[0])[0]; r.spill == 0 {
		t.Fatalf("a window with %d buckets did not spill past its %d inline ones", len(l.winBuckets(r)), inlineBuckets)
	}
	var buf bytes.Buffer
	if err := l.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	r := New(s, Options{})
	if err := r.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if r.Digest() != l.Digest() {
		t.Fatalf("restored digest %s, original %s", r.Digest(), l.Digest())
	}
}
