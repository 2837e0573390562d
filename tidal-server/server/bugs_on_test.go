//go:build tidalbugs

package server

import (
	"bytes"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// The planted defect drop-vectors-in-snapshot, shown
// switched off (the state machine's real snapshot) and on, so a hook that
// silently does nothing fails here rather than passing the bugs suite by
// luck. Run with `go test -tags tidalbugs -run Planted ./tidal-server/server/`.

// restoredThroughSnapshot applies one embedding put and one signal event,
// snapshots the state and restores it into a fresh state machine, and
// returns what the restored one holds. viaView takes the snapshot the way
// the replica does (CaptureSnapshot, then its encoder).
func restoredThroughSnapshot(t *testing.T, viaView bool) (vectorKept bool, events uint64, digestsEqual bool) {
	t.Helper()
	sm := NewStateMachine(testSchema(), ledger.Options{})
	sm.Apply(1, 1, encodeEmbedding(embeddingPut{ID: "w1", Entity: 7, Vector: []float32{1, 2, 3, 4}}))
	sm.Apply(2, 1, signalsCmd(event("e1", 3, 1)))
	var snap bytes.Buffer
	if viaView {
		encode, err := sm.CaptureSnapshot()
		if err != nil {
			t.Fatal(err)
		}
		if err := encode(&snap); err != nil {
			t.Fatal(err)
		}
	} else if err := sm.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	restored := NewStateMachine(testSchema(), ledger.Options{})
	if err := restored.Restore(&snap); err != nil {
		t.Fatalf("Restore: expected the snapshot to restore, found %v", err)
	}
	restored.Read(func(l *ledger.Ledger, v *vectors.Store, _ uint64) {
		_, vectorKept = v.Get(7)
		events = l.Get(3, testTS).Signals["view"].Count
	})
	_, want := sm.Digest()
	_, got := restored.Digest()
	return vectorKept, events, got == want
}

func TestPlantedDropVectorsInSnapshotRestoresNoVectors(t *testing.T) {
	if bugs.Active(bugs.DropVectorsInSnapshot) {
		t.Fatal("drop-vectors-in-snapshot is already on for this process (TIDAL_BUGS set?); the off half would prove nothing")
	}
	for _, viaView := range []bool{false, true} {
		if kept, events, same := restoredThroughSnapshot(t, viaView); !kept || events != 1 || !same {
			t.Fatalf("defect off (view %v): expected the restored state to equal the original (vector kept, 1 event), found vector kept %v, %d events, digests equal %v", viaView, kept, events, same)
		}
	}
	t.Cleanup(bugs.Enable(bugs.DropVectorsInSnapshot))
	for _, viaView := range []bool{false, true} {
		kept, events, same := restoredThroughSnapshot(t, viaView)
		if kept || same {
			t.Fatalf("drop-vectors-in-snapshot on (view %v): expected the restored state to lack entity 7's vector (digests differ), found vector kept %v, digests equal %v", viaView, kept, same)
		}
		if events != 1 {
			t.Fatalf("drop-vectors-in-snapshot on (view %v): expected the ledger restored whole (1 event), found %d", viaView, events)
		}
	}
}

// overwritten puts two vectors on one entity and returns whether the
// second one is what the entity holds, with both puts' results.
func overwritten(t *testing.T) (replaced bool, first, second EmbeddingResult) {
	t.Helper()
	sm := NewStateMachine(testSchema(), ledger.Options{})
	first, _ = sm.Apply(1, 1, encodeEmbedding(embeddingPut{ID: "w1", Entity: 7, Vector: []float32{1, 2, 3, 4}})).(EmbeddingResult)
	second, _ = sm.Apply(2, 1, encodeEmbedding(embeddingPut{ID: "w2", Entity: 7, Vector: []float32{4, 3, 2, 1}})).(EmbeddingResult)
	sm.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) {
		got, _ := v.Get(7)
		replaced = len(got) == 4 && got[0] == 4
	})
	return replaced, first, second
}

func TestPlantedIgnoreEmbeddingOverwriteKeepsTheFirstVector(t *testing.T) {
	if bugs.Active(bugs.IgnoreEmbeddingOverwrite) {
		t.Fatal("ignore-embedding-overwrite is already on for this process (TIDAL_BUGS set?); the off half would prove nothing")
	}
	if replaced, first, second := overwritten(t); !replaced || first != (EmbeddingResult{}) || second != (EmbeddingResult{}) {
		t.Fatalf("defect off: expected the second put applied (replaced), both answered applied, found replaced %v, results %+v, %+v", replaced, first, second)
	}
	t.Cleanup(bugs.Enable(bugs.IgnoreEmbeddingOverwrite))
	replaced, first, second := overwritten(t)
	if replaced {
		t.Fatal("ignore-embedding-overwrite on: expected the entity to keep its first vector, found the second")
	}
	if first != (EmbeddingResult{}) || second != (EmbeddingResult{}) {
		t.Fatalf("ignore-embedding-overwrite on: expected both puts answered as applied (not duplicates), found %+v, %+v", first, second)
	}
}
