package replica

import (
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// Regression (issue 9 item 1): what apply refuses, identically on every
// node, whatever the proposer's own (possibly lagging) table said. A
// promotion racing the removal of its learner is the AddNode row.
func TestMembershipRefusesAtApply(t *testing.T) {
	m := newMembership()
	m.Members[1] = Member{ID: 1}
	m.Members[5] = Member{ID: 5} // a learner
	m.Removed[4] = true
	var (
		add     = raftpb.ConfChangeType_ConfChangeAddNode
		learner = raftpb.ConfChangeType_ConfChangeAddLearnerNode
		remove  = raftpb.ConfChangeType_ConfChangeRemoveNode
	)
	for _, tc := range []struct {
		typ  raftpb.ConfChangeType
		id   uint64
		want string // substring of the reason; "" = applied
	}{
		{learner, 4, "member id 4 was removed earlier"},
		{add, 4, "member id 4 was removed earlier"}, // a promotion applied after the removal
		{learner, 1, "member id 1 is already a member"},
		{learner, 5, "member id 5 is already a member"},
		{add, 5, ""}, // the promotion of learner 5
		{add, 1, ""}, // already a voter: raft makes it a no-op
		{learner, 6, ""},
		{add, 7, ""}, // bootstrap adds voters nobody knew
		{remove, 4, ""},
		{remove, 1, ""},
		{learner, 0, ""}, // already zeroed: raft skips it
	} {
		got := m.refuse(tc.typ, tc.id)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("refuse(%v, %d) = %q, expected %q", tc.typ, tc.id, got, tc.want)
		}
	}
}
