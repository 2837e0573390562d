package replica_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// MemberStatus is the peer transport's view of who may send: voters and
// learners of the applied table are current, removed ids removed, the
// rest unknown; a node whose table is still empty (a --join node before
// its first snapshot) takes its --peers as current.
func TestMemberStatus(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.waitLeader()
	c.mustPropose(lead, "before")
	victim := uint64(3)
	if victim == lead {
		victim = 2
	}
	var rest []uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != victim {
			rest = append(rest, id)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Learner 4 is added and never started: a learner is current.
	if err := retrying(func() error { return c.node(rest[0]).r.AddMember(ctx, replica.Member{ID: 4, PeerAddr: peerAddr(4)}) }); err != nil {
		t.Fatalf("AddMember(4): %v", err)
	}
	if err := retrying(func() error { return c.node(rest[0]).r.RemoveMember(ctx, victim) }); err != nil {
		t.Fatalf("RemoveMember(%d): %v", victim, err)
	}
	c.mustPropose(rest[0], "after")
	c.waitConverged(rest...)

	status := func(r *replica.Replica, id uint64) string {
		switch current, removed := r.MemberStatus(id); {
		case current && removed:
			return "current and removed"
		case current:
			return "current"
		case removed:
			return "removed"
		}
		return "unknown"
	}
	for _, on := range rest {
		r := c.node(on).r
		if v := fmt.Sprint(r.Voters()); v != fmt.Sprint(rest) {
			t.Errorf("node %d: Voters() = %s, expected %v (learner 4 does not vote, %d was removed)", on, v, rest, victim)
		}
		want := map[uint64]string{rest[0]: "current", rest[1]: "current", 4: "current", victim: "removed", 9: "unknown", 0: "unknown"}
		for id, w := range want {
			if got := status(r, id); got != w {
				t.Errorf("node %d: MemberStatus(%d) = %s, expected %s", on, id, got, w)
			}
		}
	}

	// A --join node that nobody added: its table stays empty, so its
	// --peers (the cluster it was told of, itself included) are current.
	joiner := c.startWith(5, true, func(cfg *replica.Config) {
		cfg.Peers = append(append([]replica.Member(nil), cfg.Peers...), replica.Member{ID: 5, PeerAddr: peerAddr(5)})
	})
	for id, w := range map[uint64]string{1: "current", 2: "current", 3: "current", 5: "current", 4: "unknown", 9: "unknown"} {
		if got := status(joiner.r, id); got != w {
			t.Errorf("join node with an empty table: MemberStatus(%d) = %s, expected %s (from its --peers)", id, got, w)
		}
	}
	if got := fmt.Sprint(joiner.r.Status().Members); got != "[]" {
		t.Fatalf("the join node's table should be empty for this check, found %s", got)
	}
}
