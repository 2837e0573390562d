package peer

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// stalledInbound takes the first message it is handed and then stops
// reading until release is closed: a peer that just restarted and is
// replaying its log, or one starved of CPU. Its Messages stream stops
// being read, so the sender's stream blocks on gRPC flow control.
type stalledInbound struct {
	*recorder
	release chan struct{}
}

func (s *stalledInbound) Receive(ctx context.Context, data []byte) error {
	if err := s.recorder.Receive(ctx, data); err != nil {
		return err
	}
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}

// appendOf is a MsgApp from 1 to to carrying one format-1 entry of size
// data bytes: the shape of a catch-up append raft cuts at MaxSizePerMsg.
func appendOf(t testing.TB, to uint64, size int) []byte {
	data := make([]byte, size)
	data[0] = 1 // the format-1 proposal envelope
	return marshal(t, &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(to), Term: proto.Uint64(1),
		Index: proto.Uint64(10), LogTerm: proto.Uint64(1), Commit: proto.Uint64(10),
		Entries: []*raftpb.Entry{{Term: proto.Uint64(1), Index: proto.Uint64(11), Type: raftpb.EntryNormal.Enum(), Data: data}}})
}

// Regression: appends piling up for a peer that stops reading. A leader
// whose follower restarts keeps handing it appends of up to MaxSizePerMsg
// (again on every heartbeat answer while it probes) while the follower,
// replaying its own log, reads nothing: the stream blocks on flow control
// and, bounded by message count alone, the queue held hundreds of MB that
// the leader allocated and copied while its other follower waited for
// heartbeats. Member 2 takes one heartbeat and then stops reading; member
// 1 sends it 128 appends of 1 MiB — far under QueueSize — and then a
// heartbeat to member 3. What waits in 2's queue must stay within
// QueueBytes and one message, the rest dropped with raft told 2 is
// unreachable; and member 3 must still hear from member 1.
func TestSenderBoundsBytesQueuedForAPeerThatStopsReading(t *testing.T) {
	view := members([]uint64{1, 2, 3})
	n1 := startNode(t, 1, Options{Membership: view})
	n3 := startNode(t, 3, Options{Membership: view})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in2 := &stalledInbound{recorder: newRecorder(), release: make(chan struct{})}
	t2, err := New(2, in2, Options{Membership: view, SpoolDir: filepath.Join(t.TempDir(), "spool")}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go t2.Serve(lis)
	t.Cleanup(func() {
		close(in2.release)
		t2.Stop()
	})
	n1.t.SetPeer(2, lis.Addr().String())
	n1.t.SetPeer(3, n3.addr)

	n1.t.Send(outbound(t, heartbeat(1, 2, 1)))
	eventually(t, "member 2 took the first heartbeat and stopped reading", func() bool { return len(in2.received()) == 1 })

	const appends, size = 128, 1 << 20
	msg := appendOf(t, 2, size)
	for range appends {
		n1.t.Send([]replica.Outbound{{To: 2, Data: msg}})
	}
	n1.t.mu.Lock()
	s := n1.t.senders[2]
	n1.t.mu.Unlock()
	// What the sender took out of the queue is bounded by the stream's
	// flow-control window and one frame, whatever the machine's speed:
	// member 2 reads nothing after its first message.
	queued := len(s.queue) * len(msg)
	if limit := n1.t.opts.QueueBytes + len(msg); queued > limit {
		t.Fatalf("%d bytes (%d appends of %d) wait in the queue of a peer that reads nothing; expected at most %d (QueueBytes and one message)",
			queued, len(s.queue), len(msg), limit)
	}
	if got := value(n1.t.metrics.dropped.WithLabelValues("2")); got == 0 {
		t.Errorf("no message to member 2 counted dropped after %d appends of %d bytes it does not read; expected the ones past QueueBytes", appends, len(msg))
	}
	eventually(t, "raft told member 2 is unreachable", func() bool {
		n1.in.mu.Lock()
		defer n1.in.mu.Unlock()
		return slices.Contains(n1.in.unreachable, 2)
	})

	n1.t.Send(outbound(t, heartbeat(1, 3, 7)))
	eventually(t, "member 3 got its heartbeat while member 2 reads nothing", func() bool {
		for _, m := range n3.in.received() {
			if m.GetType() == raftpb.MsgHeartbeat && m.GetTerm() == 7 {
				return true
			}
		}
		return false
	})
}
