package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// t0 is an arbitrary, readable epoch for test timestamps.
var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

func ms(d time.Duration) int64 { return d.Milliseconds() }

func ev(id string, entity uint64, signal string, weight float64, ts int64) Event {
	return Event{ID: id, Entity: entity, Signal: signal, Weight: weight, TS: ts}
}

func mustApply(t *testing.T, l *Ledger, index uint64, events ...Event) Result {
	t.Helper()
	res, err := l.Apply(index, 1, events)
	if err != nil {
		t.Fatalf("Apply(%d): %v", index, err)
	}
	return res
}

func closeEnough(got, want float64) bool {
	if got == want {
		return true
	}
	if math.IsInf(want, 1) || want > math.MaxFloat64/2 {
		return got == math.MaxFloat64
	}
	return math.Abs(got-want) <= 1e-9*math.Max(math.Abs(want), 1e-300)
}

// randomHistory drives the ledger and the reference with the same random
// batches — out-of-order timestamps over three days, a small id pool so
// retries and conflicts happen, the odd invalid event — and checks each
// outcome matches.
func randomHistory(t *testing.T, rng *rand.Rand, l *Ledger, ref *refLedger, entries int) (index uint64, maxTS int64) {
	t.Helper()
	signals := []string{"view", "like", "share", "skip"}
	for index = 1; index <= uint64(entries); index++ {
		batch := make([]Event, 1+rng.IntN(6))
		for i := range batch {
			id := rng.IntN(400)
			batch[i] = Event{
				ID:     fmt.Sprintf("e%d", id),
				Entity: uint64(id%13) + uint64(rng.IntN(2)), // mostly stable payload per id, sometimes not
				Signal: signals[id%len(signals)],
				Weight: float64(1 + id%3),
				TS:     t0 + rng.Int64N(ms(72*time.Hour)),
			}
			if rng.IntN(200) == 0 {
				batch[i].Weight = math.NaN()
			}
			maxTS = max(maxTS, batch[i].TS)
		}
		before := l.Digest()
		got := outcomeOf(l.Apply(index, 1, batch))
		want := ref.apply(index, batch)
		if got != want {
			t.Fatalf("entry %d %+v: ledger %+v, reference %+v", index, batch, got, want)
		}
		if got.kind != "" {
			if after := l.Digest(); after != before {
				t.Fatalf("entry %d rejected (%s) but the digest changed", index, got.kind)
			}
			l.SetApplied(index)
			ref.applied = index
		}
	}
	return index - 1, maxTS
}

func TestApplyMatchesReference(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			s := DefaultSchema()
			l := New(s, Options{IDsPerGeneration: 50})
			ref := newRef(s, 50)
			_, maxTS := randomHistory(t, rng, l, ref, 800)

			// Reads at or after every event (the documented exactness
			// condition), from right at the newest event to weeks later,
			// including window edges.
			ats := []int64{maxTS, maxTS + 1, maxTS + ms(time.Hour), maxTS + ms(time.Hour) + ms(time.Minute),
				maxTS + ms(24*time.Hour), maxTS + ms(25*time.Hour), maxTS + ms(30*24*time.Hour)}
			for range 20 {
				ats = append(ats, maxTS+rng.Int64N(ms(48*time.Hour)))
			}
			for _, at := range ats {
				for entity := range uint64(15) {
					view := l.Get(entity, at)
					for _, st := range s.Signals {
						got, want := view.Signals[st.Name], ref.get(entity, st.Name, at)
						if got.Count != want.Count || got.WeightSum != want.WeightSum || !closeEnough(got.Score, want.Score) {
							t.Fatalf("entity %d %s at %d: got %+v, want %+v", entity, st.Name, at, got, want.SignalView)
						}
						for name, n := range want.Windows {
							if got.Windows[name] != n {
								t.Fatalf("entity %d %s window %s at %d: got %d, want %d", entity, st.Name, name, at, got.Windows[name], n)
							}
							if name != "all" && (n < want.inner[name] || n > want.outer[name]) {
								t.Fatalf("entity %d %s window %s: %d outside the documented bound [%d, %d]", entity, st.Name, name, n, want.inner[name], want.outer[name])
							}
						}
					}
				}
			}
		})
	}
}

func TestReadsBeforeNewestEventStillExactWithinBucket(t *testing.T) {
	// A read earlier than the key's newest event is exact as long as it
	// falls in the same bucket as that event, for every window.
	s := DefaultSchema()
	l := New(s, Options{})
	ref := newRef(s, DefaultIDsPerGeneration)
	base := t0 + ms(10*time.Hour)
	var batch []Event
	for i := range 200 {
		batch = append(batch, ev(fmt.Sprint("x", i), 1, "view", 1, base-int64(i)*ms(37*time.Second)))
	}
	if out := ref.apply(1, batch); out.kind != "" {
		t.Fatal(out)
	}
	mustApply(t, l, 1, batch...)
	at := base - base%ms(time.Minute) // start of the 1h window's bucket holding base
	got, want := l.Get(1, at).Signals["view"], ref.get(1, "view", at)
	if got.Windows["1h"] != want.Windows["1h"] || !closeEnough(got.Score, want.Score) {
		t.Fatalf("got %+v, want %+v", got, want.SignalView)
	}
}

func TestDecayFarApartTimestamps(t *testing.T) {
	s := Schema{Signals: []SignalType{{Name: "view", HalfLife: time.Hour, Windows: []Window{{"all", 0}}}}, EmbeddingDim: 4}
	l := New(s, Options{})
	first, last := MinTS, MaxTS-1
	mustApply(t, l, 1, ev("old", 1, "view", 5, first))
	mustApply(t, l, 2, ev("new", 1, "view", 3, last)) // rescale by 2^-876000: the old term underflows
	mustApply(t, l, 3, ev("old2", 1, "view", 7, first))

	if got := l.Get(1, last).Signals["view"].Score; got != 3 {
		t.Errorf("score at the newest event: got %v, want 3 (older terms are below 2^-1074)", got)
	}
	if got := l.Get(1, last+ms(time.Hour)).Signals["view"].Score; got != 1.5 {
		t.Errorf("one half-life later: got %v, want 1.5", got)
	}
	if got := l.Get(1, first).Signals["view"].Score; got != math.MaxFloat64 {
		t.Errorf("a century before the anchor: got %v, want saturation at MaxFloat64", got)
	}
	if got := l.Get(1, math.MaxInt64).Signals["view"].Score; got != 0 {
		t.Errorf("at the end of time: got %v, want 0", got)
	}
	if v := l.Get(1, math.MinInt64).Signals["view"]; v.Score != math.MaxFloat64 || v.Count != 3 {
		t.Errorf("at the start of time: got %+v", v)
	}
	// A tiny sum read well before its anchor must not overflow spuriously.
	if got, want := decayedAt(math.SmallestNonzeroFloat64, 0, -1100*3600000, 3600000), math.Ldexp(1, 1100-1074); got != want {
		t.Errorf("decayedAt of a denormal: got %v, want %v", got, want)
	}
}

func TestExp2MatchesMath(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(x float64) {
		got, want := exp2(x), math.Exp2(x)
		if got == want || (math.IsNaN(got) && math.IsNaN(want)) {
			return
		}
		// math.Exp2 may be assembly (arm64): allow one ulp.
		if math.Abs(got-want) > math.Abs(want-math.Nextafter(want, 0)) {
			t.Fatalf("exp2(%v) = %v, math.Exp2 = %v", x, got, want)
		}
	}
	for _, x := range []float64{0, 1, -1, 0.5, -0.5, 1023, 1024, -1074, -1075, -1e6, 1e6, math.Inf(1), math.Inf(-1), math.NaN()} {
		check(x)
	}
	for range 100000 {
		check(rng.Float64()*2200 - 1100)
		check(-rng.ExpFloat64())
	}
}

func TestRetryIsAcknowledgedNotFolded(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	mustApply(t, l, 1, ev("a", 7, "like", 2, t0))
	before := l.Get(7, t0)
	// The retry carries a new ts (the client omitted it and the node
	// stamped it again): ts is not part of the compared payload.
	res := mustApply(t, l, 2, ev("a", 7, "like", 2, t0+5000), ev("b", 7, "like", 1, t0))
	if res != (Result{Applied: 1, Duplicates: 1}) {
		t.Fatalf("got %+v, want 1 applied 1 duplicate", res)
	}
	after := l.Get(7, t0).Signals["like"]
	if after.Count != before.Signals["like"].Count+1 || after.WeightSum != 3 {
		t.Fatalf("retry was folded: before %+v after %+v", before.Signals["like"], after)
	}
	loc, ok := l.Lookup("a")
	if !ok || loc != (Location{ID: "a", Index: 1, Term: 1, Position: 0, Entity: 7, Signal: "like", Weight: 2}) {
		t.Fatalf("Lookup(a) = %+v, %v: the original location must be kept", loc, ok)
	}
	// Duplicates within one batch fold once.
	res = mustApply(t, l, 3, ev("c", 1, "view", 1, t0), ev("c", 1, "view", 1, t0+1))
	if res != (Result{Applied: 1, Duplicates: 1}) {
		t.Fatalf("in-batch duplicate: got %+v", res)
	}
}

func TestConflictRejectsWholeBatch(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	mustApply(t, l, 1, ev("a", 7, "like", 2, t0))
	digest, applied := l.Digest(), l.AppliedIndex()
	batch := []Event{ev("fresh", 1, "view", 1, t0), ev("a", 7, "like", 3, t0)}
	for name, check := range map[string]func() error{
		"Check": func() error { return l.Check(batch) },
		"Apply": func() error { _, err := l.Apply(2, 1, batch); return err },
	} {
		err := check()
		var ce *ConflictError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: got %v, want a ConflictError", name, err)
		}
		if ce.Index != 1 || ce.ID != "a" || ce.Previous.Index != 1 || ce.Previous.Weight != 2 || ce.Weight != 3 {
			t.Fatalf("%s: %+v", name, ce)
		}
		t.Logf("%s: %v", name, err)
	}
	if l.Digest() != digest || l.AppliedIndex() != applied {
		t.Fatal("a rejected batch changed the state")
	}
	if _, ok := l.Lookup("fresh"); ok {
		t.Fatal("an event of the rejected batch was remembered")
	}

	// Within one batch.
	batch = []Event{ev("x", 1, "view", 1, t0), ev("y", 1, "view", 1, t0), ev("x", 2, "view", 1, t0)}
	_, err := l.Apply(2, 1, batch)
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Index != 2 || ce.Previous.Index != 0 || ce.Previous.Position != 0 {
		t.Fatalf("in-batch conflict: got %v", err)
	}
	if l.Digest() != digest {
		t.Fatal("a rejected batch changed the state")
	}
}

func TestInvalidEventRejectsWholeBatch(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	digest := l.Digest()
	cases := []struct {
		e     Event
		field string
	}{
		{ev("", 1, "view", 1, t0), "id"},
		{ev(string(make([]byte, 129)), 1, "view", 1, t0), "id"},
		{ev("has space", 1, "view", 1, t0), "id"},
		{ev("ok", 1, "purchase", 1, t0), "signal"},
		{ev("ok", 1, "view", 0, t0), "weight"},
		{ev("ok", 1, "view", -1, t0), "weight"},
		{ev("ok", 1, "view", math.NaN(), t0), "weight"},
		{ev("ok", 1, "view", math.Inf(1), t0), "weight"},
		{ev("ok", 1, "view", 2e9, t0), "weight"},
		{ev("ok", 1, "view", 1, 0), "ts"},
		{ev("ok", 1, "view", 1, t0/1000), "ts"},       // seconds
		{ev("ok", 1, "view", 1, t0*1000), "ts"},       // microseconds
		{ev("ok", 1, "view", 1, MaxTS), "ts"},         // exclusive bound
		{ev("ok", 1, "view", 1, MinTS-1), "ts"},       // inclusive bound
		{ev("ok", 1, "view", 1, MaxTS-1), ""},         // valid
		{ev("ok", 1, "view", 1e9, MinTS), ""},         // valid
		{ev("~!", math.MaxUint64, "skip", 1, t0), ""}, // valid
	}
	for _, c := range cases {
		batch := []Event{ev("good", 1, "view", 1, t0), c.e}
		if c.field == "" {
			if err := l.Check(batch); err != nil {
				t.Errorf("%+v: unexpected %v", c.e, err)
			}
			continue
		}
		_, err := l.Apply(1, 1, batch)
		var ee *EventError
		if !errors.As(err, &ee) || ee.Index != 1 || ee.Err.Field != c.field {
			t.Errorf("%+v: got %v, want events[1].%s", c.e, err, c.field)
			continue
		}
		if !bytes.HasPrefix([]byte(err.Error()), []byte("events[1]."+c.field+": ")) {
			t.Errorf("error %q does not start with the field path", err)
		}
	}
	if l.Digest() != digest {
		t.Fatal("invalid batches changed the state")
	}
}

func TestAppliedIndex(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	mustApply(t, l, 3, ev("a", 1, "view", 1, t0))
	if _, err := l.Apply(3, 1, []Event{ev("b", 1, "view", 1, t0)}); !errors.Is(err, ErrAlreadyApplied) {
		t.Fatalf("re-applying index 3: got %v", err)
	}
	l.SetApplied(3) // idempotent
	l.SetApplied(5)
	if _, err := l.Apply(4, 1, nil); !errors.Is(err, ErrAlreadyApplied) {
		t.Fatalf("applying below SetApplied: got %v", err)
	}
	if res := mustApply(t, l, 6); res != (Result{}) || l.AppliedIndex() != 6 {
		t.Fatalf("empty batch: %+v, applied %d", res, l.AppliedIndex())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("SetApplied backwards did not panic")
		}
	}()
	l.SetApplied(2)
}

func TestIDMemoryRotatesByPosition(t *testing.T) {
	const n = 4
	l := New(DefaultSchema(), Options{IDsPerGeneration: n})
	rng := rand.New(rand.NewPCG(7, 7))
	var order []string // ids in application order
	index := uint64(0)
	maxBatch := 0
	for len(order) < 200 {
		index++
		batch := make([]Event, 1+rng.IntN(3))
		maxBatch = max(maxBatch, len(batch))
		for i := range batch {
			batch[i] = ev(fmt.Sprint("id", len(order)), 1, "view", 1, t0)
			order = append(order, batch[i].ID)
		}
		mustApply(t, l, index, batch...)
		st := l.Stats()
		if st.IDs > 2*n+maxBatch-1 {
			t.Fatalf("remembering %d ids, bound is %d", st.IDs, 2*n+maxBatch-1)
		}
		if st.IDsCurrent >= n {
			t.Fatalf("current generation holds %d ids after an entry boundary", st.IDsCurrent)
		}
		// The guarantee: any id followed by fewer than n others is
		// remembered, and a retry of it is not folded.
		for i := max(0, len(order)-n); i < len(order); i++ {
			if _, ok := l.Lookup(order[i]); !ok {
				t.Fatalf("id %s forgotten with only %d ids applied after it", order[i], len(order)-1-i)
			}
		}
	}
	// Forgotten ids are forgotten for good: a retry of the first id now
	// folds again (the documented cost of a bounded memory).
	if _, ok := l.Lookup("id0"); ok {
		t.Fatal("id0 still remembered after 200 ids with 4 per generation")
	}
	index++
	if res := mustApply(t, l, index, ev("id0", 1, "view", 1, t0)); res.Applied != 1 {
		t.Fatalf("retry of a forgotten id: %+v", res)
	}
}

func TestAuditEventsInLogOrder(t *testing.T) {
	l := New(DefaultSchema(), Options{IDsPerGeneration: 3})
	mustApply(t, l, 1, ev("b", 1, "view", 1, t0), ev("a", 1, "view", 1, t0))
	mustApply(t, l, 2, ev("z", 1, "view", 1, t0), ev("b", 1, "view", 1, t0)) // rotation after this; b is a duplicate
	mustApply(t, l, 4, ev("c", 2, "like", 1, t0))
	var got []string
	if err := l.AuditEvents(func(loc Location) error {
		got = append(got, fmt.Sprintf("%s@%d.%d", loc.ID, loc.Index, loc.Position))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"b@1.0", "a@1.1", "z@2.0", "c@4.0"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	stop := errors.New("stop")
	calls := 0
	if err := l.AuditEvents(func(Location) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("callback error: got %v after %d calls", err, calls)
	}
}

func TestTopMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	s := DefaultSchema()
	l := New(s, Options{})
	ref := newRef(s, DefaultIDsPerGeneration)
	_, maxTS := randomHistory(t, rng, l, ref, 600)
	for _, at := range []int64{maxTS, maxTS + ms(30*time.Minute), maxTS + ms(20*time.Hour)} {
		for _, st := range s.Signals {
			for _, window := range []string{"", "1h", "24h", "all"} {
				values := map[uint64]float64{}
				for entity := range uint64(15) {
					sv := l.Get(entity, at).Signals[st.Name]
					if window == "" {
						values[entity] = sv.Score
					} else {
						values[entity] = float64(sv.Windows[window])
					}
				}
				for _, k := range []int{1, 3, 100} {
					got, err := l.Top(st.Name, window, k, at)
					if err != nil {
						t.Fatal(err)
					}
					if want := topFromViews(values, k); !slices.Equal(got, want) {
						t.Fatalf("Top(%s, %q, %d, %d) = %v, want %v", st.Name, window, k, at, got, want)
					}
				}
			}
		}
	}
	// Ties go to the lower entity id.
	tie := New(s, Options{})
	mustApply(t, tie, 1, ev("a", 9, "view", 1, t0), ev("b", 4, "view", 1, t0), ev("c", 6, "view", 1, t0))
	got, _ := tie.Top("view", "all", 2, t0)
	if want := []Ranked{{4, 1}, {6, 1}}; !slices.Equal(got, want) {
		t.Fatalf("ties: got %v, want %v", got, want)
	}
	for _, bad := range []struct {
		signal, window string
		k              int
		field          string
	}{{"nope", "", 1, "signal"}, {"view", "7d", 1, "window"}, {"view", "", 0, "k"}} {
		_, err := l.Top(bad.signal, bad.window, bad.k, t0)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != bad.field {
			t.Errorf("Top(%q, %q, %d): got %v, want an error on %s", bad.signal, bad.window, bad.k, err, bad.field)
		}
	}
}

func TestConcurrentReadersAndApply(t *testing.T) {
	l := New(DefaultSchema(), Options{IDsPerGeneration: 100})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			mustApplyNoT(l, uint64(i+1), ev(fmt.Sprint(i), uint64(i%50), "view", 1, t0+int64(i)))
		}
	}()
	for {
		select {
		case <-done:
			if st := l.Stats(); st.Keys != 50 || st.AppliedIndex != 2000 {
				t.Fatalf("stats after the run: %+v", st)
			}
			return
		default:
			l.Get(3, t0)
			_, _ = l.Top("view", "1h", 5, t0)
			_ = l.Digest()
			_ = l.AuditEvents(func(Location) error { return nil })
		}
	}
}

func mustApplyNoT(l *Ledger, index uint64, events ...Event) {
	if _, err := l.Apply(index, 1, events); err != nil {
		panic(err)
	}
}

// An AuditLog walks the id memory as it was at its capture, while Apply
// goes on adding ids and rotating generations (the race detector checks
// that the walk and Apply share no memory they both write), and walking
// it again gives the same list.
func TestAuditLogIsTheIdsAtCapture(t *testing.T) {
	l := New(DefaultSchema(), Options{IDsPerGeneration: 50})
	for i := range 70 {
		mustApplyNoT(l, uint64(i+1), ev(fmt.Sprint("a", i), uint64(i%7), "view", 1, t0))
	}
	list := func(fn func(func(Location) error) error) []Location {
		var out []Location
		if err := fn(func(loc Location) error { out = append(out, loc); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := list(l.AuditEvents)
	audit := l.CaptureAudit()
	if audit.AppliedIndex() != 70 {
		t.Fatalf("captured applied index %d, expected 70", audit.AppliedIndex())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			mustApplyNoT(l, uint64(71+i), ev(fmt.Sprint("b", i), uint64(i%7), "like", 1, t0))
		}
	}()
	during := list(audit.Each)
	<-done
	if after := list(audit.Each); !slices.Equal(during, want) || !slices.Equal(after, want) {
		t.Fatalf("expected the capture's %d ids both during and after later applies, found %d and %d", len(want), len(during), len(after))
	}
	if now := list(l.AuditEvents); slices.Equal(now, want) {
		t.Fatal("the id memory did not change after the capture: the test proves nothing")
	}
}
