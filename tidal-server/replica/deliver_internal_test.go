package replica

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// blockingNode is a raft.Node whose Step blocks until released, as the
// real node's does while its goroutine is busy elsewhere.
type blockingNode struct {
	raft.Node
	events  chan string
	release chan struct{}
}

func (n *blockingNode) Step(ctx context.Context, m *raftpb.Message) error {
	n.events <- "step " + m.GetType().String()
	select {
	case <-n.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type recordingTransport struct{ events chan string }

func (t *recordingTransport) Send(msgs []Outbound) {
	for _, m := range msgs {
		t.events <- fmt.Sprintf("send to %d", m.To)
	}
}
func (t *recordingTransport) SetPeer(uint64, string) {}
func (t *recordingTransport) RemovePeer(uint64)      {}

// A follower's acknowledgement of a durable append goes to the leader
// without waiting for raft's goroutine to take the local response
// (the leader commits on it). Before the fix, deliver stepped
// the local response first and this test saw no send while the step was
// held.
func TestDeliverSendsPeersBeforeSteppingLocal(t *testing.T) {
	events := make(chan string, 4)
	node := &blockingNode{events: events, release: make(chan struct{})}
	tr := &recordingTransport{events: events}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Replica{cfg: Config{ID: 2, Transport: tr}, node: node, haltCtx: ctx, log: slog.New(slog.DiscardHandler)}

	self := &raftpb.Message{Type: raftpb.MsgStorageAppendResp.Enum(), To: proto.Uint64(2), From: proto.Uint64(raft.LocalAppendThread), Index: proto.Uint64(7)}
	ack := &raftpb.Message{Type: raftpb.MsgAppResp.Enum(), To: proto.Uint64(1), From: proto.Uint64(2), Index: proto.Uint64(7)}
	done := make(chan bool, 1)
	go func() { done <- r.deliver([]*raftpb.Message{self, ack}) }()

	var got []string
	for len(got) < 2 {
		select {
		case e := <-events:
			got = append(got, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("expected a send and a step, found %q", got)
		}
	}
	if got[0] != "send to 1" || got[1] != "step MsgStorageAppendResp" {
		t.Fatalf("expected the acknowledgement sent to member 1 before the local response is stepped, found %q", got)
	}
	close(node.release)
	if !<-done {
		t.Fatal("deliver reported a stop")
	}
}
