package ledger

import (
	"bytes"
	"fmt"
	"math"
	"testing"
)

// FuzzApply decodes the input into a sequence of entries (small pools of
// ids, entities and timestamps so that retries, conflicts, rotation and
// invalid events are common) and applies them to the ledger and to the
// brute-force reference. It checks that nothing panics, that every
// outcome matches the reference, that refused entries leave the digest
// unchanged, and at the end that every aggregate equals the reference and
// a snapshot round-trips to the same digest.
//
// Input layout, repeated: one header byte (batch length in the low 3 bits,
// bit 3 = reuse the previous index, bit 4 = skip an index), then 4 bytes
// per event: id, entity, signal and weight, ts.
func FuzzApply(f *testing.F) {
	f.Add([]byte{2, 1, 1, 0, 128, 2, 1, 0, 128})                            // two views
	f.Add([]byte{1, 1, 1, 0, 128, 1, 1, 1, 0, 200})                         // retry with another ts
	f.Add([]byte{1, 1, 1, 0, 128, 1, 1, 2, 0, 128})                         // conflict on entity
	f.Add([]byte{2, 3, 1, 0x10, 0, 3, 1, 0x20, 255})                        // in-batch conflict on weight
	f.Add([]byte{1, 1, 1, 0x30, 128, 9, 2, 1, 0, 0})                        // NaN weight; stale index
	f.Add(bytes.Repeat([]byte{3, 0, 1, 0, 1, 5, 2, 1, 3, 9, 3, 2, 250}, 5)) // rotation
	f.Fuzz(func(t *testing.T, data []byte) {
		const idsPerGen = 6
		s := DefaultSchema()
		l := New(s, Options{IDsPerGeneration: idsPerGen})
		ref := newRef(s, idsPerGen)
		signals := []string{"view", "like", "share", "skip", "nope"}
		weights := []float64{1, 2, 0.5, 1e9, 0, -1, math.NaN(), math.Inf(1), 3, 1e-300, 7, 1, 1, 1, 1, 1}
		var index uint64
		var maxTS int64
		total := 0
		for len(data) > 0 {
			hdr := data[0]
			data = data[1:]
			switch {
			case hdr&0x08 != 0:
				// reuse: index stays, Apply must refuse it
			case hdr&0x10 != 0:
				index += 2
			default:
				index++
			}
			n := int(hdr & 0x07)
			batch := make([]Event, 0, n)
			for len(batch) < n && len(data) >= 4 {
				b := data[:4]
				data = data[4:]
				e := Event{
					ID:     fmt.Sprintf("id%d", b[0]%12),
					Entity: uint64(b[1] % 4),
					Signal: signals[int(b[2]&0x0f)%len(signals)],
					Weight: weights[b[2]>>4],
					// Out of order over ~10 days; 0 is out of range.
					TS: t0 + (int64(b[3])-128)*ms(97*60000),
				}
				if b[3] == 0 {
					e.TS = 0
				}
				if b[0] == 255 {
					e.ID = ""
				}
				batch = append(batch, e)
			}
			before := l.Digest()
			got := outcomeOf(l.Apply(index, 1, batch))
			want := ref.apply(index, batch)
			if got != want {
				t.Fatalf("entry %d %+v: ledger %+v, reference %+v", index, batch, got, want)
			}
			if got.kind == "" {
				total += got.res.Applied
				for _, e := range batch {
					maxTS = max(maxTS, e.TS)
				}
			} else {
				if l.Digest() != before {
					t.Fatalf("entry %d refused (%s) but the state changed", index, got.kind)
				}
				if index > l.AppliedIndex() {
					l.SetApplied(index)
					ref.applied = index
				}
			}
			if st := l.Stats(); st.IDs > 2*idsPerGen+7-1 || st.IDsCurrent >= idsPerGen {
				t.Fatalf("id memory %+v exceeds its bound", st)
			}
		}
		var counted uint64
		for entity := range uint64(4) {
			view := l.Get(entity, maxTS)
			for _, st := range s.Signals {
				got, want := view.Signals[st.Name], ref.get(entity, st.Name, maxTS)
				counted += got.Count
				if got.Count != want.Count || got.WeightSum != want.WeightSum || !closeEnough(got.Score, want.Score) || fmt.Sprint(got.Windows) != fmt.Sprint(want.Windows) {
					t.Fatalf("entity %d %s: got %+v, want %+v", entity, st.Name, got, want.SignalView)
				}
			}
		}
		if counted != uint64(total) || l.AppliedIndex() != index {
			t.Fatalf("folded %d events, Apply reported %d; applied index %d, last entry %d", counted, total, l.AppliedIndex(), index)
		}
		var snap bytes.Buffer
		if err := l.Snapshot(&snap); err != nil {
			t.Fatal(err)
		}
		r := New(s, Options{IDsPerGeneration: idsPerGen})
		if err := r.Restore(&snap); err != nil {
			t.Fatal(err)
		}
		if r.Digest() != l.Digest() {
			t.Fatal("snapshot round-trip changed the digest")
		}
	})
}
