package replica_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
)

// Regression (issue 9 item 1): a log that holds an empty ConfChangeV2
// outside a joint config — raft's "leave the joint config", which it panics
// on when there is none — must not crash the node at that index on every
// restart. The node applies it as the no-op it is and keeps serving.
func TestRestartOverEmptyConfChangeInLog(t *testing.T) {
	c := newCluster(t, 1, nil)
	c.waitLeader(1)
	c.mustPropose(1, "before")
	c.stop(1)

	dir := filepath.Join(c.nodes[1].dir, "wal")
	w, rec, err := wal.Open(dir, wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	last := rec.Entries[len(rec.Entries)-1]
	empty := wal.Entry{Index: last.Index + 1, Term: last.Term, Type: uint8(raftpb.EntryConfChangeV2)} // marshals to no bytes
	hs := rec.HardState
	hs.Commit = empty.Index
	if err := w.Save(context.Background(), wal.Batch{Entries: []wal.Entry{empty}, HardState: &hs}, true); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	c.start(1, false)
	c.waitLeader(1)
	c.mustPropose(1, "after")
	st := c.waitConverged(1)
	if len(st.Entries) != 2 || st.Entries[0].Data != "before" || st.Entries[1].Data != "after" {
		t.Fatalf("after the restart over an empty conf change the state is %v, expected [before after]", st.Entries)
	}
	if st.Applied <= empty.Index {
		t.Fatalf("applied %d, not past the empty conf change at %d", st.Applied, empty.Index)
	}
}
