package server

import (
	"bytes"
	"errors"
	"fmt"
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

// ApplyBatch (issue 14, build item 2: one lock per Ready) leaves exactly
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
// Ready under load; issue 14, build item 2).
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

// SnapshotView (issue 14: the vector store is frozen on the apply
// goroutine and encoded off it) writes exactly the bytes Snapshot wrote at
// the moment it was taken, however much is applied afterwards, and those
// bytes restore to that state.
func TestSnapshotViewIsSnapshotAtItsIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cmds := randomCommands(rng, 800)
	sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	for i, c := range cmds[:400] {
		sm.Apply(uint64(i+1), 1, c)
	}
	var want bytes.Buffer
	if err := sm.Snapshot(&want); err != nil {
		t.Fatal(err)
	}
	idx, digest := sm.Digest()
	v, err := sm.SnapshotView()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds[400:] {
		sm.Apply(uint64(401+i), 1, c)
	}
	var got bytes.Buffer
	n, err := v.WriteTo(&got)
	if err != nil {
		t.Fatal(err)
	}
	if n != v.Size() || int64(got.Len()) != v.Size() {
		t.Fatalf("view wrote %d bytes (buffer %d), Size says %d", n, got.Len(), v.Size())
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("view's %d bytes differ from Snapshot's %d at index 400", got.Len(), want.Len())
	}
	back := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 100})
	if err := back.Restore(bytes.NewReader(got.Bytes())); err != nil {
		t.Fatal(err)
	}
	if bi, bd := back.Digest(); bi != idx || bd != digest {
		t.Fatalf("restored view: index %d digest %s, expected %d %s", bi, bd, idx, digest)
	}
}
