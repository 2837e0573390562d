package server

import (
	"context"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func TestHandOffTargetIsTheMostCaughtUpReachableVoter(t *testing.T) {
	st := replica.Status{ID: 1, Members: []replica.MemberStatus{
		{Member: replica.Member{ID: 1}, Role: "leader", Match: 100, Reachable: true},
		{Member: replica.Member{ID: 2}, Role: "follower", Match: 90, Reachable: true},
		{Member: replica.Member{ID: 3}, Role: "follower", Match: 99, Reachable: false},
		{Member: replica.Member{ID: 4}, Role: "learner", Match: 100, Reachable: true},
		{Member: replica.Member{ID: 5}, Role: "follower", Match: 95, Reachable: true},
	}}
	if id, match, ok := handOffTarget(st); !ok || id != 5 || match != 95 {
		t.Fatalf("expected member 5 (match 95), got %d (match %d, ok %v)", id, match, ok)
	}
	st.Members = st.Members[:1]
	if id, _, ok := handOffTarget(st); ok {
		t.Fatalf("a leader alone: expected no target, got %d", id)
	}
}

// Regression: after a hand-off the old leader waits until
// members other than the new leader stop sending to it; the inbound proxy
// tells their messages apart from the new leader's.
func TestInboundProxyNotesMessagesFromOthersThanTheNewLeader(t *testing.T) {
	var p inboundProxy
	msg := func(from uint64) []byte {
		typ := raftpb.MsgProp
		b, err := proto.Marshal(&raftpb.Message{Type: &typ, From: proto.Uint64(from), To: proto.Uint64(1)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p.Receive(context.Background(), msg(3))
	if p.lastOther.Load() != 0 {
		t.Fatal("noted a message while not watching")
	}
	p.watchExcept.Store(2)
	p.Receive(context.Background(), msg(2))
	if p.lastOther.Load() != 0 {
		t.Fatal("a message from the new leader counted as from another member")
	}
	p.Receive(context.Background(), msg(3))
	if p.lastOther.Load() == 0 {
		t.Fatal("a message from member 3 was not noted")
	}
}
