package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

const testTS = 1767225600000

func signalsCmd(events ...ledger.Event) []byte { return encodeSignals(events) }

func event(id string, entity uint64, weight float64) ledger.Event {
	return ledger.Event{ID: id, Entity: entity, Signal: "view", Weight: weight, TS: testTS}
}

// randomCommands is a seeded mix of signal batches (with retries and
// conflicting reuses of ids), embedding puts and malformed commands.
func randomCommands(rng *rand.Rand, n int) [][]byte {
	var out [][]byte
	for range n {
		switch rng.IntN(10) {
		case 0:
			vec := make([]float32, 4)
			for i := range vec {
				vec[i] = float32(1 + rng.IntN(3))
			}
			out = append(out, encodeEmbedding(embeddingPut{ID: fmt.Sprintf("v%d", rng.IntN(20)), Entity: uint64(rng.IntN(5)), Vector: vec}))
		case 1:
			out = append(out, []byte{kindSignals, 1, 2})
		default:
			evs := make([]ledger.Event, 1+rng.IntN(20))
			for i := range evs {
				id := rng.IntN(300)
				evs[i] = event(fmt.Sprintf("e%d", id), uint64(id%11)+uint64(rng.IntN(2)), float64(1+id%2))
				evs[i].TS += rng.Int64N(1e7)
			}
			out = append(out, signalsCmd(evs...))
		}
	}
	return out
}

func testSchema() ledger.Schema {
	s := ledger.DefaultSchema()
	s.EmbeddingDim = 4
	return s
}

// ApplyBatch (one lock per Ready) leaves exactly
// the state, and returns exactly the results, that Apply entry by entry
// does.
func TestApplyBatchMatchesApply(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cmds := randomCommands(rng, 600)
	one := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	batched := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	var want, got []any
	for i, c := range cmds {
		want = append(want, one.Apply(uint64(i+1), 1, c))
	}
	for i := 0; i < len(cmds); {
		n := min(1+rng.IntN(30), len(cmds)-i)
		var ents []replica.AppEntry
		for j := range n {
			ents = append(ents, replica.AppEntry{Index: uint64(i + j + 1), Term: 1, Data: cmds[i+j], Subs: 1})
		}
		got = append(got, batched.ApplyBatch(ents)...)
		i += n
	}
	for i := range want {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
			t.Fatalf("entry %d: batched %v, one by one %v", i+1, got[i], want[i])
		}
	}
	_, a := one.Digest()
	_, b := batched.Digest()
	if a != b {
		t.Fatalf("digests differ: one by one %s, batched %s", a, b)
	}
}

// A packed entry's commands (Sub 0..Subs-1 at one index) are applied one
// after the other at distinct positions: a conflict refuses only its own
// command, a retry across commands is a duplicate, and the whole is what
// a snapshot carries.
func TestPackedEntryCommands(t *testing.T) {
	sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 3})
	cmds := [][]byte{
		signalsCmd(event("a", 1, 1), event("b", 2, 1)),
		signalsCmd(event("a", 9, 1)),                   // conflicts with a
		signalsCmd(event("c", 3, 1), event("b", 2, 1)), // b is a retry
		encodeEmbedding(embeddingPut{ID: "v", Entity: 1, Vector: []float32{1, 0, 0, 0}}),
	}
	var ents []replica.AppEntry
	for i, c := range cmds {
		ents = append(ents, replica.AppEntry{Index: 1, Term: 1, Data: c, Sub: i, Subs: len(cmds)})
	}
	res := sm.ApplyBatch(ents)
	var ce *ledger.ConflictError
	if r := res[1].(SignalsResult); !errors.As(r.Err, &ce) || ce.Previous.Index != 1 || ce.Previous.Position != 0 {
		t.Fatalf("command 1: %+v, expected a conflict with a at (1, 0)", r)
	}
	if r := res[0].(SignalsResult); r.Applied != 2 || r.Err != nil {
		t.Fatalf("command 0: %+v", r)
	}
	if r := res[2].(SignalsResult); r.Applied != 1 || r.Duplicates != 1 || r.Err != nil {
		t.Fatalf("command 2: %+v, expected c applied and b a duplicate", r)
	}
	if r := res[3].(EmbeddingResult); r.Err != nil || r.Duplicate {
		t.Fatalf("command 3: %+v", r)
	}
	locs := map[string][2]uint64{}
	sm.Read(func(l *ledger.Ledger, _ *vectors.Store, applied uint64) {
		for _, id := range []string{"a", "b", "c"} {
			loc, _ := l.Lookup(id)
			locs[id] = [2]uint64{loc.Index, uint64(loc.Position)}
		}
		// Three ids with 3 per generation: rotated once, at the end of
		// the entry, so all three are still remembered.
		if st := l.Stats(); st.IDs != 3 || st.IDsCurrent != 0 || applied != 1 {
			t.Errorf("stats %+v at applied %d: expected 3 ids, all in the previous generation after the entry's end", st, applied)
		}
	})
	// Positions: a, b at 0, 1; the refused command took position 2; c at 3.
	if want := map[string][2]uint64{"a": {1, 0}, "b": {1, 1}, "c": {1, 3}}; !reflect.DeepEqual(locs, want) {
		t.Fatalf("locations %v, expected %v", locs, want)
	}
	// The next entry starts at position 0 again.
	if r := sm.Apply(2, 1, signalsCmd(event("d", 4, 1))).(SignalsResult); r.Err != nil || r.Applied != 1 {
		t.Fatalf("entry 2: %+v", r)
	}
}

// BenchmarkApplyEntries applies single-event signal entries one by one
// (Apply) and in runs of 64 (ApplyBatch, what the replica hands over per
// Ready under load).
func BenchmarkApplyEntries(b *testing.B) {
	cmds := make([][]byte, 1<<16)
	for i := range cmds {
		cmds[i] = signalsCmd(ledger.Event{ID: fmt.Sprintf("b%d", i), Entity: uint64(i % 100000), Signal: "view", Weight: 1, TS: testTS + int64(i)})
	}
	for _, run := range []int{1, 64} {
		b.Run(fmt.Sprintf("run=%d", run), func(b *testing.B) {
			sm := NewStateMachine(testSchema(), ledger.Options{})
			ents := make([]replica.AppEntry, 0, run)
			index := uint64(0)
			b.ReportAllocs()
			for i := 0; i < b.N; i += run {
				ents = ents[:0]
				for j := 0; j < run; j++ {
					index++
					ents = append(ents, replica.AppEntry{Index: index, Term: 1, Data: cmds[(i+j)%len(cmds)], Subs: 1})
				}
				if run == 1 {
					sm.Apply(ents[0].Index, 1, ents[0].Data)
				} else {
					sm.ApplyBatch(ents)
				}
			}
		})
	}
}

var _ replica.SnapshotCapturer = (*StateMachine)(nil)

// CaptureSnapshot (snapshots encoded off the apply path) takes
// the state at the capture: its encoder, run while later commands are
// applied and again after them, writes the bytes Snapshot wrote at the
// capture, and a state machine restored from them has the digest of the
// state at the capture.
func TestCaptureSnapshotIsTheStateAtCapture(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	cmds := randomCommands(rng, 800)
	sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	for i, c := range cmds[:400] {
		sm.Apply(uint64(i+1), 1, c)
	}
	var want bytes.Buffer
	if err := sm.Snapshot(&want); err != nil {
		t.Fatal(err)
	}
	_, wantDigest := sm.Digest()
	encode, err := sm.CaptureSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	encoded := make(chan []byte)
	go func() {
		var buf bytes.Buffer
		if err := encode(&buf); err != nil {
			t.Error(err)
		}
		encoded <- buf.Bytes()
	}()
	for i, c := range cmds[400:] {
		sm.Apply(uint64(400+i+1), 1, c)
	}
	if got := <-encoded; !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("capture encoded %d bytes while applying, differing from the %d of Snapshot at the capture", len(got), want.Len())
	}
	var again bytes.Buffer
	if err := encode(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), want.Bytes()) {
		t.Fatal("capture encoded after the later commands differs from Snapshot at the capture")
	}
	// Any writer, not only a bytes.Buffer (whose ledger section is
	// encoded in place), gets the same bytes.
	var plain bytes.Buffer
	if err := encode(struct{ io.Writer }{&plain}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Bytes(), want.Bytes()) {
		t.Fatal("capture encoded into a plain writer differs from the encoding into a bytes.Buffer")
	}
	if _, now := sm.Digest(); now == wantDigest {
		t.Fatal("the state did not change after the capture: the test proves nothing")
	}
	restored := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	if err := restored.Restore(bytes.NewReader(again.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, got := restored.Digest(); got != wantDigest {
		t.Fatalf("restored from the capture: digest %s, at the capture %s", got, wantDigest)
	}
}
