package replica_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

func memberIDs(ms []replica.Member) []uint64 {
	ids := make([]uint64, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// StoredMembers reads a stopped node's membership from its snapshot and
// the conf changes logged after it, the same table the node rebuilds on
// start (what --peers is checked against).
func TestStoredMembersFollowsSnapshotAndLog(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gone := uint64(3)
	if lead == 3 {
		gone = 2
	}
	if err := c.node(lead).r.RemoveMember(ctx, gone); err != nil {
		t.Fatal(err)
	}
	c.mustPropose(lead, "after-remove")
	if _, _, err := c.node(lead).r.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	// Added after the snapshot: only the log knows member 4.
	if err := c.node(lead).r.AddMember(ctx, replica.Member{ID: 4, PeerAddr: peerAddr(4), ClientAddr: "127.0.0.1:7074"}); err != nil {
		t.Fatal(err)
	}
	c.mustPropose(lead, "after-add")
	c.stop(lead)

	members, index, err := replica.StoredMembers(c.nodes[lead].dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []uint64
	for _, id := range []uint64{1, 2, 3, 4} {
		if id != gone {
			want = append(want, id)
		}
	}
	if got := memberIDs(members); !slices.Equal(got, want) || index == 0 {
		t.Fatalf("stored members: expected ids %v at some index, got %v at index %d", want, got, index)
	}
	if m := members[len(members)-1]; m.PeerAddr != peerAddr(4) || m.ClientAddr != "127.0.0.1:7074" {
		t.Fatalf("member 4: expected its addresses from the conf change, got %+v", m)
	}

	// Member 4 was added as a learner and never started, so it was never
	// promoted: it is no voter.
	cfg, err := replica.ReadStoredConfig(c.nodes[lead].dir)
	if err != nil {
		t.Fatal(err)
	}
	if wantVoters := slices.DeleteFunc(want, func(id uint64) bool { return id == 4 }); !slices.Equal(cfg.Voters, wantVoters) || cfg.Index != index {
		t.Fatalf("stored voters: expected %v at index %d, got %v at index %d", wantVoters, index, cfg.Voters, cfg.Index)
	}

	none, index, err := replica.StoredMembers(t.TempDir())
	if err != nil || none != nil || index != 0 {
		t.Fatalf("an empty data dir: expected no members, got %v at %d (err %v)", none, index, err)
	}
}

// Regression: nodes bootstrapped from --peers know only
// peer addresses; a voter publishes its client address into the
// replicated table, and every node sees it.
func TestPublishMemberRecordsAddressesEverywhere(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.waitLeader()
	for _, id := range []uint64{1, 2, 3} {
		m := replica.Member{ID: id, PeerAddr: peerAddr(id), ClientAddr: fmt.Sprintf("127.0.0.1:707%d", id)}
		// raft takes one conf change at a time: a change proposed while
		// another is pending is dropped (ErrConfChangeDropped, certainly
		// not applied), or, without a leader yet, refused (ErrNoLeader);
		// a timeout is an unknown outcome. Publishing retries, as the
		// server does.
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := c.node(id).r.PublishMember(ctx, m)
			cancel()
			if err == nil {
				break
			}
			retryable := errors.Is(err, replica.ErrUnknownOutcome) || errors.Is(err, replica.ErrConfChangeDropped) ||
				errors.Is(err, replica.ErrNoLeader)
			if !retryable || attempt == 10 {
				t.Fatalf("node %d publishing %+v (attempt %d): %v", id, m, attempt, err)
			}
		}
	}
	c.mustPropose(lead, "after-publish")
	c.waitConverged()
	for _, id := range []uint64{1, 2, 3} {
		st := c.node(id).r.Status()
		if len(st.Members) != 3 {
			t.Fatalf("node %d: expected 3 members, got %+v", id, st.Members)
		}
		for _, m := range st.Members {
			if want := fmt.Sprintf("127.0.0.1:707%d", m.ID); m.ClientAddr != want || m.Role == "learner" {
				t.Errorf("node %d sees member %d with client address %q role %s, expected %q as a voter", id, m.ID, m.ClientAddr, m.Role, want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.node(lead).r.PublishMember(ctx, replica.Member{ID: 9, PeerAddr: "x:1"}); err == nil {
		t.Error("publishing for a non-member succeeded")
	}
}
