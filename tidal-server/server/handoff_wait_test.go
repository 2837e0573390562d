package server

import (
	"context"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// raftNet is three in-memory raft nodes configured as the replica
// configures them (check-quorum, pre-vote, a heartbeat every tick), whose
// messages move only when the test says: one hop per deliver.
type raftNet struct {
	t       *testing.T
	nodes   map[uint64]*raft.RawNode
	storage map[uint64]*raft.MemoryStorage
}

func newRaftNet(t *testing.T, electionTicks int) *raftNet {
	t.Helper()
	n := &raftNet{t: t, nodes: map[uint64]*raft.RawNode{}, storage: map[uint64]*raft.MemoryStorage{}}
	for id := uint64(1); id <= 3; id++ {
		ms := raft.NewMemoryStorage()
		snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1),
			ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
		if err := ms.ApplySnapshot(snap); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{ID: id, ElectionTick: electionTicks, HeartbeatTick: 1, Storage: ms,
			MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true})
		if err != nil {
			t.Fatal(err)
		}
		n.nodes[id], n.storage[id] = rn, ms
	}
	return n
}

// deliver persists every node's Ready and hands the messages it produced
// to their targets: one hop. It reports whether anything moved.
func (n *raftNet) deliver() bool {
	var msgs []*raftpb.Message
	for id := uint64(1); id <= 3; id++ {
		rn := n.nodes[id]
		if !rn.HasReady() {
			continue
		}
		rd := rn.Ready()
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := n.storage[id].SetHardState(rd.HardState); err != nil {
				n.t.Fatal(err)
			}
		}
		if err := n.storage[id].Append(rd.Entries); err != nil {
			n.t.Fatal(err)
		}
		msgs = append(msgs, rd.Messages...)
		rn.Advance(rd)
	}
	for _, m := range msgs {
		if err := n.nodes[m.GetTo()].Step(m); err != nil {
			n.t.Fatal(err)
		}
	}
	return len(msgs) > 0
}

func (n *raftNet) settle() {
	for i := 0; n.deliver(); i++ {
		if i > 100 {
			n.t.Fatal("raft messages never settled")
		}
	}
}

// status is replica.Status as the replica builds it from raft's: a
// member is reachable when the leader's progress says RecentActive.
func (n *raftNet) status(id uint64) replica.Status {
	rs := n.nodes[id].Status()
	st := replica.Status{ID: id, Leader: rs.Lead, Role: "follower"}
	if rs.RaftState == raft.StateLeader {
		st.Role = "leader"
	}
	for m := uint64(1); m <= 3; m++ {
		ms := replica.MemberStatus{Member: replica.Member{ID: m}, Role: "follower"}
		if pr, ok := rs.Progress[m]; ok {
			ms.Match, ms.Reachable = pr.Match, pr.RecentActive
		} else if m == id {
			ms.Reachable = true
		}
		st.Members = append(st.Members, ms)
	}
	return st
}

// Regression (lifecycle suite, rolling restart: one write ended 504 after
// the leader logged "no reachable voter to hand leadership to"): with
// check-quorum, the leader clears every follower's RecentActive once per
// election timeout, and they come back only with the followers' next
// responses. A SIGTERM in that window saw no reachable voter, drained as
// leader, and the writes in flight through it had no outcome. The
// hand-off must wait for a voter to answer, not give up on one look.
func TestHandOffWaitsForAVoterAfterCheckQuorumClearedThem(t *testing.T) {
	const electionTicks = 10
	n := newRaftNet(t, electionTicks)
	if err := n.nodes[1].Campaign(); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if st := n.status(1); st.Role != "leader" {
		t.Fatalf("expected node 1 to lead, found %s", st.Role)
	}
	if _, _, ok := handOffTarget(n.status(1)); !ok {
		t.Fatal("expected reachable voters right after the election")
	}
	// An election timeout of heartbeats in flight, then the check-quorum
	// tick: the quorum was active (the election's responses), so node 1
	// stays leader, and clears RecentActive for what comes next.
	for range electionTicks {
		n.nodes[1].Tick()
	}
	st := n.status(1)
	if st.Role != "leader" {
		t.Fatalf("expected node 1 still leading after the check-quorum tick, found %s", st.Role)
	}
	if id, _, ok := handOffTarget(st); ok {
		t.Fatalf("expected no voter to look reachable right after the check-quorum tick (the window this test is about), found %d", id)
	}
	// The SIGTERM lands now. Each look at the status lets one hop of
	// messages through, as time passing would: heartbeats out, responses
	// back.
	looks := 0
	status := func() replica.Status {
		if looks > 0 {
			n.deliver()
		}
		looks++
		return n.status(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, to, _, ok := awaitHandOffTarget(ctx, status, time.Millisecond)
	if !ok {
		t.Fatalf("expected a hand-off target once the followers answered, found none after %d looks", looks)
	}
	if to != 2 && to != 3 {
		t.Fatalf("expected member 2 or 3, found %d", to)
	}
	if looks < 2 {
		t.Fatalf("expected the first look to find no voter and a later one to find %d, found it in %d look(s)", to, looks)
	}
}

// A voter that is really gone stays unreachable: the wait ends with its
// context, without a target. A node that stopped leading, or leads
// alone, does not wait at all.
func TestHandOffWaitEndsWithoutATarget(t *testing.T) {
	down := replica.Status{ID: 1, Role: "leader", Members: []replica.MemberStatus{
		{Member: replica.Member{ID: 1}, Role: "leader", Reachable: true},
		{Member: replica.Member{ID: 2}, Role: "follower"},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, id, _, ok := awaitHandOffTarget(ctx, func() replica.Status { return down }, time.Millisecond); ok {
		t.Fatalf("expected no target with the only other voter down, found %d", id)
	}
	if ctx.Err() == nil {
		t.Fatal("expected the wait to last until its context ended")
	}
	looks := 0
	for _, st := range []replica.Status{
		{ID: 1, Role: "follower", Members: down.Members},
		{ID: 1, Role: "leader", Members: down.Members[:1]},
	} {
		if _, _, _, ok := awaitHandOffTarget(context.Background(), func() replica.Status { looks++; return st }, time.Hour); ok {
			t.Fatalf("%s with %d members: expected no target", st.Role, len(st.Members))
		}
	}
	if looks != 2 {
		t.Fatalf("expected one look each, found %d looks", looks)
	}
}
