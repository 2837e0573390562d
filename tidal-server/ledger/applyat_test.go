package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// Commands packed into one entry (ApplyAt) leave
// exactly the state one Apply of their concatenation leaves, when none is
// refused: same digest, same event locations.
func TestApplyAtMatchesOneBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	signals := []string{"view", "like", "share", "skip"}
	packed := New(DefaultSchema(), Options{IDsPerGeneration: 40})
	whole := New(DefaultSchema(), Options{IDsPerGeneration: 40})
	for index := uint64(1); index <= 300; index++ {
		var cmds [][]Event
		var all []Event
		for range 1 + rng.IntN(4) {
			cmd := make([]Event, 1+rng.IntN(5))
			for i := range cmd {
				id := rng.IntN(500)
				cmd[i] = Event{ID: fmt.Sprintf("p%d", id), Entity: uint64(id % 17), Signal: signals[id%4], Weight: float64(1 + id%3), TS: t0 + rng.Int64N(1e8)}
			}
			cmds = append(cmds, cmd)
			all = append(all, cmd...)
		}
		want, err := whole.Apply(index, 1, all)
		if err != nil {
			t.Fatalf("entry %d: %v", index, err)
		}
		var got Result
		first := uint32(0)
		for _, cmd := range cmds {
			r, err := packed.ApplyAt(index, 1, first, cmd)
			if err != nil {
				t.Fatalf("entry %d position %d: %v", index, first, err)
			}
			got.Applied += r.Applied
			got.Duplicates += r.Duplicates
			first += uint32(len(cmd))
		}
		packed.FinishEntry()
		if got != want {
			t.Fatalf("entry %d: packed %+v, one batch %+v", index, got, want)
		}
	}
	if packed.Digest() != whole.Digest() {
		t.Fatalf("digests differ: packed %s, one batch %s", packed.Digest(), whole.Digest())
	}
}

// A refused command of a packed entry leaves the others applied, and
// positions are never reused or taken backwards.
func TestApplyAtRefusals(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	ev := func(id string, entity uint64) Event {
		return Event{ID: id, Entity: entity, Signal: "view", Weight: 1, TS: t0}
	}
	if _, err := l.ApplyAt(1, 1, 0, []Event{ev("a", 1), ev("b", 1)}); err != nil {
		t.Fatal(err)
	}
	// Conflicts with "a": refused, nothing changes, the index stays.
	var ce *ConflictError
	if _, err := l.ApplyAt(1, 1, 2, []Event{ev("c", 1), ev("a", 2)}); !errors.As(err, &ce) || ce.Previous.Index != 1 || ce.Previous.Position != 0 {
		t.Fatalf("expected a conflict with a at (1, 0), found %v", err)
	}
	// The refused command's span is consumed all the same; a command
	// after it must start where it ended.
	if _, err := l.ApplyAt(1, 1, 4, []Event{ev("d", 1)}); err == nil || errors.Is(err, ErrAlreadyApplied) {
		t.Fatalf("ApplyAt at position 4 before 2..3 were consumed: %v, expected a gap refused", err)
	}
	if err := l.Consume(1, 2, Span(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ApplyAt(1, 1, 4, []Event{ev("d", 1)}); err != nil {
		t.Fatal(err)
	}
	if loc, ok := l.Lookup("d"); !ok || loc.Index != 1 || loc.Position != 4 {
		t.Fatalf("d at %+v, expected index 1 position 4", loc)
	}
	if _, ok := l.Lookup("c"); ok {
		t.Fatal("c of the refused command was remembered")
	}
	for _, tc := range []struct {
		index uint64
		first uint32
	}{{1, 0}, {1, 3}, {0, 9}} {
		if _, err := l.ApplyAt(tc.index, 1, tc.first, []Event{ev("e", 1)}); !errors.Is(err, ErrAlreadyApplied) {
			t.Errorf("ApplyAt(%d, first %d) after (1, next 5): %v, expected ErrAlreadyApplied", tc.index, tc.first, err)
		}
	}
	if err := l.Consume(1, 4, 1); !errors.Is(err, ErrAlreadyApplied) {
		t.Errorf("Consume(1, 4) after (1, next 5): %v, expected ErrAlreadyApplied", err)
	}
	if _, err := l.ApplyAt(2, 1, 1, []Event{ev("e", 1)}); err == nil || errors.Is(err, ErrAlreadyApplied) {
		t.Errorf("ApplyAt(2, first 1) as an entry's first command: %v, expected a gap refused", err)
	}
	l.SetApplied(2) // an entry without events
	if _, err := l.ApplyAt(3, 1, 0, []Event{ev("e", 1)}); err != nil {
		t.Fatal(err)
	}
}

// A command without events (an embedding put) takes a position
// (Consume), so the signals packed after it start past it instead of at
// its position, where they would look like its replay. Whatever kinds an
// entry packs, each of its commands applies once, and each again (a
// replay, live or after a restore) is refused.
func TestConsumeTakesAPosition(t *testing.T) {
	l := New(DefaultSchema(), Options{})
	ev := func(id string) Event { return Event{ID: id, Entity: 1, Signal: "view", Weight: 1, TS: t0} }
	// Entry 1: embedding, signals ×2, embedding, signals.
	type cmd struct{ events []Event }
	entry := []cmd{{nil}, {[]Event{ev("a"), ev("b")}}, {nil}, {[]Event{ev("c")}}}
	apply := func(l *Ledger) []error {
		var errs []error
		pos := uint32(0)
		for _, c := range entry {
			var err error
			if c.events == nil {
				err = l.Consume(1, pos, Span(0))
			} else {
				_, err = l.ApplyAt(1, 1, pos, c.events)
			}
			errs = append(errs, err)
			pos += Span(len(c.events))
		}
		l.FinishEntry()
		return errs
	}
	for i, err := range apply(l) {
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	for id, want := range map[string]int{"a": 1, "b": 2, "c": 4} {
		if loc, ok := l.Lookup(id); !ok || loc.Index != 1 || loc.Position != want {
			t.Errorf("%s at %+v, expected index 1 position %d", id, loc, want)
		}
	}
	if l.EntryOpen() {
		t.Fatal("entry open after FinishEntry")
	}
	var snap bytes.Buffer
	if err := l.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	restored := New(DefaultSchema(), Options{})
	if err := restored.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	for what, led := range map[string]*Ledger{"live": l, "restored": restored} {
		for i, err := range apply(led) {
			if !errors.Is(err, ErrAlreadyApplied) {
				t.Errorf("%s: replayed command %d: %v, expected ErrAlreadyApplied", what, i, err)
			}
		}
	}
	if l.Digest() != restored.Digest() {
		t.Fatal("digests differ after the replays")
	}
}
