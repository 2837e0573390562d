package replica_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// Regression: a log that holds an empty ConfChangeV2
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

// Regression: a membership change proposed on a leader
// that has lost its quorum (before CheckQuorum deposes it) could not
// commit, nor could the empty entry raft logs for a change it drops; the
// caller waited out its whole deadline for ErrUnknownOutcome (504). A
// leader that has heard from no quorum for an election timeout now refuses
// it before proposing: ErrNoQuorum (503), certainly not applied.
func TestMembershipChangeOnLeaderWithoutQuorumIsRefusedAtOnce(t *testing.T) {
	// A long election timeout: raft's own CheckQuorum must not depose the
	// cut-off leader before the test asks it (if it does, ErrNoLeader is
	// the same certain refusal).
	c := newCluster(t, 3, func(cfg *replica.Config) { cfg.ElectionTicks = 50 })
	lead := c.waitLeader()
	c.mustPropose(lead, "before")
	c.waitConverged()
	r := c.node(lead).r
	if err := retrying(func() error { return r.AddMember(context.Background(), replica.Member{ID: 5, PeerAddr: peerAddr(5)}) }); err != nil {
		t.Fatalf("AddMember(5) on healthy leader %d: %v", lead, err)
	}
	var others []uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != lead {
			others = append(others, id)
		}
	}
	c.net.partition([]uint64{lead}, others)
	replica.AgeHeard(r, 51) // an election timeout of silence, without waiting for it

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.AddMember(ctx, replica.Member{ID: 4, PeerAddr: peerAddr(4)})
	switch {
	case errors.Is(err, replica.ErrNoQuorum):
	case errors.Is(err, replica.ErrNoLeader):
		t.Logf("raft deposed leader %d before the change was asked; ErrNoLeader is the same certain refusal", lead)
	default:
		t.Fatalf("AddMember(4) on leader %d cut off from %v: %v; expected ErrNoQuorum (refused before proposing)", lead, others, err)
	}

	c.net.heal()
	now := c.waitLeader()
	c.mustPropose(now, "after")
	c.waitConverged()
	for _, m := range c.node(now).r.Status().Members {
		if m.ID == 4 {
			t.Errorf("member 4 is %q after a change refused as not proposed", m.Role)
		}
	}
}
