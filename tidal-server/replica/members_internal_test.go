package replica

import (
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// Regression: what apply refuses, identically on every
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

type advertised map[uint64]uint32

func (a advertised) Send([]Outbound)        {}
func (a advertised) SetPeer(uint64, string) {}
func (a advertised) RemovePeer(uint64)      {}
func (a advertised) PeerEntryFormat(id uint64) (uint32, bool) {
	f, ok := a[id]
	return f, ok
}

// The minimum-entry-format rule. A format may be proposed
// only when every current member advertised that it reads it; a member
// that advertised nothing (not heard from yet, or a release before the
// handshake) counts as format 1; removed members do not count.
func TestClusterEntryFormat(t *testing.T) {
	defer testEntryFormat.Store(0)
	testEntryFormat.Store(3) // this node reads up to 3
	for _, tc := range []struct {
		name    string
		members []uint64
		adv     advertised
		want    uint32
	}{
		{"alone", []uint64{1}, advertised{}, 3},
		{"every peer reads 3", []uint64{1, 2, 3}, advertised{2: 3, 3: 4}, 3},
		{"one peer reads 2", []uint64{1, 2, 3}, advertised{2: 3, 3: 2}, 2},
		{"one peer never advertised", []uint64{1, 2, 3}, advertised{2: 3}, 1},
		{"a removed peer's word does not count", []uint64{1, 2}, advertised{2: 3, 3: 1}, 3},
	} {
		r := &Replica{cfg: Config{ID: 1, Transport: tc.adv}, members: newMembership()}
		for _, id := range tc.members {
			r.members.Members[id] = Member{ID: id}
		}
		if got := r.ClusterEntryFormat(); got != tc.want {
			t.Errorf("%s: ClusterEntryFormat() = %d, expected %d", tc.name, got, tc.want)
		}
		if r.EntryFormatAllowed(tc.want+1) || !r.EntryFormatAllowed(tc.want) {
			t.Errorf("%s: EntryFormatAllowed disagrees with ClusterEntryFormat %d", tc.name, tc.want)
		}
	}
	var none Replica
	none.cfg.ID, none.members = 1, newMembership()
	none.members.Members[2] = Member{ID: 2}
	if got := none.ClusterEntryFormat(); got != 1 {
		t.Errorf("a transport without PeerFormats: ClusterEntryFormat() = %d, expected 1", got)
	}
}

// Only a current member's word that this node was removed
// counts, and never this node's own; a node that already knows is not
// stopped twice. (That the word stops a running node is pinned with real
// processes: suites/lifecycle "a removed member".)
func TestReportRemovedIgnoresNonMembers(t *testing.T) {
	r := &Replica{cfg: Config{ID: 1}, members: newMembership()}
	r.members.Members[1] = Member{ID: 1}
	r.members.Members[2] = Member{ID: 2}
	r.ReportRemoved(9) // not a member
	r.ReportRemoved(1) // itself
	if r.isRemoved() {
		t.Fatal("a non-member's (or this node's own) word stopped the node")
	}
}
