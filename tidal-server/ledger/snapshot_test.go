package ledger

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func snapshotBytes(t *testing.T, l *Ledger) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := l.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	s := DefaultSchema()
	l := New(s, Options{IDsPerGeneration: 40})
	index, maxTS := randomHistory(t, rng, l, newRef(s, 40), 500)

	// Through a real file, as the snapshot store will.
	path := filepath.Join(t.TempDir(), "ledger.snap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Snapshot(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	restored := New(s, Options{IDsPerGeneration: 40})
	if err := restored.Restore(f); err != nil {
		t.Fatal(err)
	}

	if restored.Digest() != l.Digest() {
		t.Fatal("digest differs after restore")
	}
	orig, _ := os.ReadFile(path)
	if !bytes.Equal(snapshotBytes(t, restored), orig) {
		t.Fatal("snapshot of the restored ledger differs from the snapshot it was restored from")
	}
	if want := fmt.Sprintf("%x", orig[len(orig)-32:]); l.Digest() != want {
		t.Fatalf("Digest %s is not the snapshot's checksum %s", l.Digest(), want)
	}
	if restored.Stats() != l.Stats() {
		t.Fatalf("stats: restored %+v, original %+v", restored.Stats(), l.Stats())
	}
	for entity := range uint64(15) {
		a, b := l.Get(entity, maxTS), restored.Get(entity, maxTS)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("entity %d: original %v, restored %v", entity, a, b)
		}
	}
	// The restored ledger must keep evolving exactly like the original
	// (bucket pruning, id rotation and decay anchors are all in the state).
	for i := range 300 {
		index++
		batch := []Event{ev(fmt.Sprintf("n%d", i), uint64(i%15), "view", 1, maxTS-int64(rng.IntN(3600000))),
			ev(fmt.Sprintf("e%d", rng.IntN(400)), uint64(i%13), "like", 2, maxTS)}
		_, errA := l.Apply(index, 2, batch)
		_, errB := restored.Apply(index, 2, batch)
		if fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Fatalf("entry %d: original %v, restored %v", index, errA, errB)
		}
		if errA != nil {
			l.SetApplied(index)
			restored.SetApplied(index)
		}
	}
	if restored.Digest() != l.Digest() {
		t.Fatal("digests diverged after applying the same entries")
	}
}

func TestEmptySnapshotRoundTrip(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	r := New(DefaultSchema(), Options{})
	mustApply(t, r, 1, ev("a", 1, "view", 1, t0)) // to be overwritten
	if err := r.Restore(bytes.NewReader(snapshotBytes(t, l))); err != nil {
		t.Fatal(err)
	}
	if r.Digest() != l.Digest() || r.AppliedIndex() != 0 || r.Stats().IDs != 0 {
		t.Fatalf("restoring an empty snapshot left %+v", r.Stats())
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	s := DefaultSchema()
	l := New(s, Options{IDsPerGeneration: 10})
	mustApply(t, l, 1, ev("a", 1, "view", 1, t0), ev("b", 2, "like", 2, t0+5))
	good := snapshotBytes(t, l)

	target := New(s, Options{IDsPerGeneration: 10})
	mustApply(t, target, 1, ev("x", 9, "share", 1, t0))
	digest := target.Digest()

	other := DefaultSchema()
	other.Signals[1].HalfLife = time.Hour
	cases := map[string]struct {
		into *Ledger
		data []byte
		want string
	}{
		"flipped bit":     {target, flip(good, len(good)/2), "checksum mismatch"},
		"truncated":       {target, good[:len(good)-1], "checksum mismatch"},
		"empty":           {target, nil, "expected at least"},
		"trailing":        {target, append(append([]byte{}, good...), 0), "checksum mismatch"},
		"other schema":    {New(other, Options{IDsPerGeneration: 10}), good, `snapshot signals[1] is {like half_life 72h0m0s`},
		"other ids/gen":   {New(s, Options{IDsPerGeneration: 11}), good, "taken with 10 ids per generation, this ledger uses 11"},
		"bad magic":       {target, resum(append([]byte("XXXXXXXX"), good[8:len(good)-32]...)), `expected magic "TIDALLDG"`},
		"trailing inside": {target, resum(append(append([]byte{}, good[:len(good)-32]...), 7)), "1 trailing bytes"},
		"cut inside":      {target, resum(good[:len(good)-40]), "truncated or malformed"},
	}
	for name, c := range cases {
		before := c.into.Digest()
		err := c.into.Restore(bytes.NewReader(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, c.want)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if c.into.Digest() != before {
			t.Errorf("%s: a failed restore changed the state", name)
		}
	}
	if target.Digest() != digest {
		t.Fatal("failed restores changed the state")
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte{}, b...)
	c[i] ^= 0x10
	return c
}

// resum gives a body a valid trailer, to reach the structural checks.
func resum(body []byte) []byte {
	return append(append([]byte{}, body...), sha256Sum(body)...)
}

func TestDigestDeterminism(t *testing.T) {
	history := func(weight float64, lastIndex uint64) *Ledger {
		l := New(DefaultSchema(), Options{IDsPerGeneration: 5})
		for i := range uint64(30) {
			mustApply(t, l, i+1, ev(fmt.Sprint(i), i%4, "view", 1, t0+int64(i*997)%50000),
				ev(fmt.Sprint("w", i), 1, "like", weight, t0+int64(i)))
		}
		l.SetApplied(lastIndex)
		return l
	}
	a, b := history(1, 30), history(1, 30)
	if a.Digest() != b.Digest() || !bytes.Equal(snapshotBytes(t, a), snapshotBytes(t, b)) {
		t.Fatal("equal histories gave different digests or snapshots")
	}
	if c := history(1.5, 30); c.Digest() == a.Digest() {
		t.Fatal("different weights gave equal digests")
	}
	if d := history(1, 31); d.Digest() == a.Digest() {
		t.Fatal("different applied indexes gave equal digests")
	}
	// Same aggregates, different id memory: still a different state.
	e, f := New(DefaultSchema(), Options{}), New(DefaultSchema(), Options{})
	mustApply(t, e, 1, ev("x", 1, "view", 1, t0))
	mustApply(t, f, 1, ev("y", 1, "view", 1, t0))
	if e.Digest() == f.Digest() {
		t.Fatal("different remembered ids gave equal digests")
	}
}

// TestCaptureIsTheStateAtCapture: a capture encodes, later and while
// Apply goes on (concurrently, so the race detector watches the shared id
// memory), exactly the bytes a snapshot taken at the capture would have
// had — through entities added after it, buckets and cells changed in
// place, generations rotating, and ids long enough that a chunk's arena
// outgrows its first allocation and moves (snapshots are
// encoded off the apply path from a capture).
func TestCaptureIsTheStateAtCapture(t *testing.T) {
	for _, idsPerGen := range []int{50, 3000} {
		t.Run(fmt.Sprint("ids-per-generation=", idsPerGen), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(idsPerGen), 7))
			l := New(DefaultSchema(), Options{IDsPerGeneration: idsPerGen})
			signals := []string{"view", "like", "share", "skip"}
			next := 0
			apply := func(from, to uint64, entities int) {
				for index := from; index <= to; index++ {
					batch := make([]Event, 1+rng.IntN(8))
					for i := range batch {
						next++
						batch[i] = Event{
							ID:     fmt.Sprintf("%060d", next), // 60 bytes: arenas outgrow 16 bytes per id
							Entity: uint64(rng.IntN(entities)),
							Signal: signals[rng.IntN(len(signals))],
							Weight: 1,
							TS:     t0 + int64(index)*1000 + rng.Int64N(ms(time.Hour)),
						}
					}
					if _, err := l.Apply(index, 1, batch); err != nil {
						t.Fatal(err)
					}
				}
			}
			apply(1, 300, 40)
			want := snapshotBytes(t, l)
			wantDigest := l.Digest()
			c := l.Capture()
			if c.AppliedIndex() != 300 {
				t.Fatalf("captured applied index %d, expected 300", c.AppliedIndex())
			}
			encoded := make(chan []byte)
			go func() {
				var buf bytes.Buffer
				if err := c.Snapshot(&buf); err != nil {
					t.Error(err)
				}
				encoded <- buf.Bytes()
			}()
			apply(301, 900, 400) // the same entities again, and new ones
			got := <-encoded
			if !bytes.Equal(got, want) {
				t.Fatalf("capture encoded %d bytes differing from the %d of a snapshot at the capture", len(got), len(want))
			}
			var again bytes.Buffer
			if err := c.Snapshot(&again); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Bytes(), want) {
				t.Fatal("a second encoding of the capture differs from the first")
			}
			if bytes.Equal(snapshotBytes(t, l), want) {
				t.Fatal("the ledger did not change after the capture: the test proves nothing")
			}
			restored := New(DefaultSchema(), Options{IDsPerGeneration: idsPerGen})
			if err := restored.Restore(bytes.NewReader(got)); err != nil {
				t.Fatal(err)
			}
			if restored.Digest() != wantDigest {
				t.Fatal("the ledger restored from the capture has another digest than the ledger at the capture")
			}
		})
	}
}

// A capture copies what the ledger uses, not its fixed-size chunks whole:
// Digest captures, and a capture of a few entities that cloned every
// cell, window-record and spill chunk in full (over a megabyte) made the
// reference test 70× slower under -race when the chunked layout and the
// off-apply capture met.
func TestCaptureCopiesOnlyWhatIsUsed(t *testing.T) {
	l := New(DefaultSchema(), Options{IDsPerGeneration: 50})
	ts := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i := range 40 { // enough buckets in one window to spill it
		e := ev(fmt.Sprintf("s%d", i), 1, "view", 1, ts-int64(i)*int64(time.Hour/time.Millisecond))
		if _, err := l.Apply(uint64(i+1), 1, []Event{e}); err != nil {
			t.Fatal(err)
		}
	}
	if l.spills.n == 0 {
		t.Fatal("expected a spilled window: the test would not cover the spill arena")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := l.Capture()
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Fatalf("capturing 1 entity allocated %d bytes, expected under 64 KiB", got)
	}
	var a, b bytes.Buffer
	if err := c.Snapshot(&a); err != nil {
		t.Fatal(err)
	}
	if err := l.Snapshot(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the capture encodes differently from the ledger")
	}
}
