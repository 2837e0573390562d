//go:build tidalbugs

package server

import (
	"bytes"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// The planted defect drop-vectors-in-snapshot (issue 9 item 15), shown
// switched off (the state machine's real snapshot) and on, so a hook that
// silently does nothing fails here rather than passing the bugs suite by
// luck. Run with `go test -tags tidalbugs -run Planted ./tidal-server/server/`.

// restoredThroughSnapshot applies one embedding put and one signal event,
// snapshots the state and restores it into a fresh state machine, and
// returns what the restored one holds.
func restoredThroughSnapshot(t *testing.T) (vectorKept bool, events uint64, digestsEqual bool) {
	t.Helper()
	sm := NewStateMachine(testSchema(), ledger.Options{})
	sm.Apply(1, 1, encodeEmbedding(embeddingPut{ID: "w1", Entity: 7, Vector: []float32{1, 2, 3, 4}}))
	sm.Apply(2, 1, signalsCmd(event("e1", 3, 1)))
	var snap bytes.Buffer
	if err := sm.Snapshot(&snap); err != nil {
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
	if kept, events, same := restoredThroughSnapshot(t); !kept || events != 1 || !same {
		t.Fatalf("defect off: expected the restored state to equal the original (vector kept, 1 event), found vector kept %v, %d events, digests equal %v", kept, events, same)
	}
	t.Cleanup(bugs.Enable(bugs.DropVectorsInSnapshot))
	kept, events, same := restoredThroughSnapshot(t)
	if kept || same {
		t.Fatalf("drop-vectors-in-snapshot on: expected the restored state to lack entity 7's vector (digests differ), found vector kept %v, digests equal %v", kept, same)
	}
	if events != 1 {
		t.Fatalf("drop-vectors-in-snapshot on: expected the ledger restored whole (1 event), found %d", events)
	}
}
