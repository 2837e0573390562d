package peer

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// groupHandler is a Handler recording what reaches one group's raft. Its
// raft ids are node*10+group, so a test that routed by raft id as if it
// were a node id would fail.
type groupHandler struct {
	*recorder
	group uint64
}

func newGroupHandler(group uint64) *groupHandler {
	return &groupHandler{recorder: newRecorder(), group: group}
}

func (g *groupHandler) replica(node uint64) uint64 { return node*10 + g.group }

func (g *groupHandler) NodeOf(id uint64) (uint64, bool) {
	if id%10 != g.group || id < 10 {
		return 0, false
	}
	return id / 10, true
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// startCountedNode is startNode behind a countingListener.
func startCountedNode(t *testing.T, id uint64, opts Options) (*node, *countingListener) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: lis}
	opts.SpoolDir = filepath.Join(t.TempDir(), "spool")
	in := newRecorder()
	tr, err := New(id, in, opts, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	go tr.Serve(cl)
	t.Cleanup(tr.Stop)
	return &node{id: id, t: tr, in: in, addr: lis.Addr().String()}, cl
}

// waitGrouped waits until from's Messages stream to peer has the peer's
// answer saying it reads grouped frames.
func waitGrouped(t *testing.T, from *Transport, peer uint64) {
	t.Helper()
	eventually(t, "the peer's protocol learned on the Messages stream", func() bool {
		from.mu.Lock()
		s := from.senders[peer]
		from.mu.Unlock()
		return s != nil && s.protocol.Load() >= groupedProtocol
	})
}

// Three groups between two nodes under mutual TLS: every group's messages
// travel on the one connection (and the one Messages stream) node 1 opened
// to node 2, and reach that group's handler only, in the order sent.
// Groups 2 and 3 use raft ids that are not node ids: the transport routes
// by (node, group) and admits by the node a raft id resolves to.
func TestGroupsShareOneConnection(t *testing.T) {
	p := newPKI(t)
	view := members([]uint64{1, 2})
	n1, lis1 := startCountedNode(t, 1, p.secured(t, 1, Options{Membership: view, BatchMaxCount: 5}))
	n2, lis2 := startCountedNode(t, 2, p.secured(t, 2, Options{Membership: view}))
	h1 := map[uint64]*groupHandler{2: newGroupHandler(2), 3: newGroupHandler(3)}
	h2 := map[uint64]*groupHandler{2: newGroupHandler(2), 3: newGroupHandler(3)}
	g1 := map[uint64]*Group{}
	for g := uint64(2); g <= 3; g++ {
		g1[g] = n1.t.Register(g, h1[g])
		n2.t.Register(g, h2[g])
	}
	n1.t.SetPeer(2, n2.addr)
	n2.t.SetPeer(1, n1.addr)

	n1.t.Send(outbound(t, heartbeat(1, 2, 1)))
	eventually(t, "group 1's first heartbeat delivered", func() bool { return len(n2.in.received()) == 1 })
	waitGrouped(t, n1.t, 2)

	const perGroup = 200
	for term := uint64(1); term <= perGroup; term++ {
		// One Send per group per round, interleaved: the sender's queue
		// holds all three groups' messages at once.
		if term > 1 {
			n1.t.Send(outbound(t, heartbeat(1, 2, term)))
		}
		for g := uint64(2); g <= 3; g++ {
			h := h1[g]
			g1[g].Send(outbound(t, heartbeat(h.replica(1), h.replica(2), term)))
		}
		eventually(t, "the receiver within 1000 messages of the sender", func() bool {
			return 3*int(term)-len(n2.in.received())-len(h2[2].received())-len(h2[3].received()) < 1000
		})
	}
	for name, r := range map[string]*recorder{"1": n2.in, "2": h2[2].recorder, "3": h2[3].recorder} {
		eventually(t, "group "+name+"'s messages delivered", func() bool { return len(r.received()) == perGroup })
	}
	check := func(group string, r *recorder, from, to uint64) {
		t.Helper()
		for i, m := range r.received() {
			if m.GetTerm() != uint64(i+1) || m.GetFrom() != from || m.GetTo() != to {
				t.Fatalf("group %s message %d: term %d from %d to %d; expected term %d from %d to %d (in order, this group's only)",
					group, i, m.GetTerm(), m.GetFrom(), m.GetTo(), i+1, from, to)
			}
		}
	}
	check("1", n2.in, 1, 2)
	check("2", h2[2].recorder, 12, 22)
	check("3", h2[3].recorder, 13, 23)

	// The other direction, one message per group, on node 2's connection.
	n2.t.Send(outbound(t, heartbeat(2, 1, 1)))
	eventually(t, "node 1 hearing group 1", func() bool { return len(n1.in.received()) == 1 })
	waitGrouped(t, n2.t, 1)
	for g := uint64(2); g <= 3; g++ {
		n2.t.Register(g, h2[g]).Send(outbound(t, heartbeat(h2[g].replica(2), h2[g].replica(1), 1)))
	}
	for g := uint64(2); g <= 3; g++ {
		eventually(t, "node 1 hearing groups 2 and 3", func() bool { return len(h1[g].received()) == 1 })
	}

	if a1, a2 := lis1.accepted.Load(), lis2.accepted.Load(); a1 != 1 || a2 != 1 {
		t.Errorf("connections accepted: node 1 %d, node 2 %d; expected 1 each (one per direction of the pair, carrying every group)", a1, a2)
	}
	// A sender opens a Messages stream again only after a failure.
	for _, c := range []struct {
		tr   *Transport
		peer string
	}{{n1.t, "2"}, {n2.t, "1"}} {
		if f := value(c.tr.metrics.failures.WithLabelValues(c.peer)); f != 0 {
			t.Errorf("node %d's stream to %s failed %v times; expected one stream, never reopened", c.tr.self, c.peer, f)
		}
	}
	for _, tr := range []*Transport{n1.t, n2.t} {
		if n := series(tr.metrics.messagesDropped); n != 0 {
			t.Errorf("node %d dropped inbound messages (%d reasons); expected none", tr.self, n)
		}
	}
}

// The sender coalesces what is queued for a node, whatever its group, into
// one frame, keeping queue order; the frame says each message's group.
func TestSenderCoalescesGroupsIntoOneFrame(t *testing.T) {
	tr := startNode(t, 1, Options{}).t
	s := &sender{t: tr, id: 2, label: "2", queue: make(chan outMsg, 16)}
	var queued []outMsg
	for i := range 9 {
		m := outMsg{group: uint64(i%3 + 1), to: 2, data: marshal(t, heartbeat(1, 2, uint64(i+1)))}
		queued = append(queued, m)
		s.queue <- m
	}
	batch, err := s.collect(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != len(queued) {
		t.Fatalf("one frame took %d of %d queued messages; expected all", len(batch), len(queued))
	}
	frame := encodeFrame(batch)
	got, err := decodeFrame(frame)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range got {
		if m.group != queued[i].group || !bytes.Equal(m.data, queued[i].data) {
			t.Fatalf("frame message %d: group %d, %x; expected group %d, %x", i, m.group, m.data, queued[i].group, queued[i].data)
		}
	}
}

// A frame of the format every earlier release sends (no group fields) is
// group 1's; a frame whose messages are all group 1's is sent in exactly
// that format, so a node with one group writes the bytes it always did.
// The grouped format is refused by the legacy decoder, never misread.
func TestFrameFormats(t *testing.T) {
	hb := marshal(t, heartbeat(1, 2, 3))
	legacy := encodeFrame([]outMsg{{group: 1, data: hb}, {group: 1, data: hb}})
	want := "00000002" + hex.EncodeToString(append([]byte{0, 0, 0, byte(len(hb))}, hb...)) + hex.EncodeToString(append([]byte{0, 0, 0, byte(len(hb))}, hb...))
	if hex.EncodeToString(legacy) != want {
		t.Fatalf("a frame of group 1 only is\n%x\nexpected the legacy format\n%s", legacy, want)
	}
	msgs, err := decodeFrame(legacy)
	if err != nil || len(msgs) != 2 || msgs[0].group != 1 || msgs[1].group != 1 || !bytes.Equal(msgs[1].data, hb) {
		t.Fatalf("legacy frame decoded as %+v, %v; expected two group-1 messages", msgs, err)
	}

	grouped := encodeFrame([]outMsg{{group: 1, data: hb}, {group: 300, data: hb}, {group: 0, data: nil}})
	if want := "ffffff0103" + "01" + hex.EncodeToString([]byte{byte(len(hb))}) + hex.EncodeToString(hb) +
		"ac02" + hex.EncodeToString([]byte{byte(len(hb))}) + hex.EncodeToString(hb) + "0000"; hex.EncodeToString(grouped) != want {
		t.Fatalf("grouped frame is\n%x\nexpected\n%s", grouped, want)
	}
	msgs, err = decodeFrame(grouped)
	if err != nil || len(msgs) != 3 || msgs[0].group != 1 || msgs[1].group != 300 || msgs[2].group != 0 || len(msgs[2].data) != 0 {
		t.Fatalf("grouped frame decoded as %+v, %v", msgs, err)
	}
	if _, err := decodeBatch(grouped); err == nil || !strings.Contains(err.Error(), "claims") {
		t.Fatalf("the legacy decoder read a grouped frame (err %v); expected it refused", err)
	}
	// Every truncation of a grouped frame is refused, naming where.
	for n := 5; n < len(grouped); n++ {
		if _, err := decodeFrame(grouped[:n]); err == nil {
			t.Fatalf("grouped frame cut to %d of %d bytes decoded", n, len(grouped))
		}
	}
	if _, err := decodeFrame(append(slices.Clone(grouped), 0)); err == nil || !strings.Contains(err.Error(), "trailing") {
		t.Fatalf("a trailing byte: %v; expected refused", err)
	}
}

// Inbound messages of a group with no handler are dropped and counted as
// unknown_group, the rest of the frame delivered; after Unregister a
// group's messages are dropped the same way. A raft id the group does not
// know is unknown_replica.
func TestUnknownGroupDroppedAndCounted(t *testing.T) {
	n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2})})
	h2 := newGroupHandler(2)
	n1.t.Register(2, h2)
	conn := rawClient(t, n1.addr, nil)
	send := func(msgs ...outMsg) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		st, err := conn.NewStream(metadata.NewOutgoingContext(ctx, ownVersions().metadata()), messagesDesc, "/"+serviceName+"/"+methodMessages)
		if err != nil {
			t.Fatal(err)
		}
		frame := encodeFrame(msgs)
		if err := st.SendMsg(&frame); err != nil {
			t.Fatal(err)
		}
		if err := finish(st); err != nil {
			t.Fatal(err)
		}
	}
	send(outMsg{group: 1, data: marshal(t, heartbeat(2, 1, 1))},
		outMsg{group: 7, data: marshal(t, heartbeat(2, 1, 2))},
		outMsg{group: 2, data: marshal(t, heartbeat(22, 12, 3))},
		outMsg{group: 2, data: marshal(t, heartbeat(99, 12, 4))}, // 99 is no replica of group 2
		outMsg{group: 0, data: marshal(t, heartbeat(2, 1, 5))})
	if got := n1.in.received(); len(got) != 1 || got[0].GetTerm() != 1 {
		t.Fatalf("group 1 received %v; expected the term-1 heartbeat", got)
	}
	if got := h2.received(); len(got) != 1 || got[0].GetTerm() != 3 {
		t.Fatalf("group 2 received %v; expected the term-3 heartbeat", got)
	}
	if d := dropped(n1.t, reasonUnknownGroup); d != 2 {
		t.Errorf("unknown_group drops = %d; expected 2 (groups 7 and 0)", d)
	}
	if d := dropped(n1.t, reasonUnknownReplica); d != 1 {
		t.Errorf("unknown_replica drops = %d; expected 1", d)
	}

	n1.t.Unregister(2)
	send(outMsg{group: 2, data: marshal(t, heartbeat(22, 12, 6))})
	if got := h2.received(); len(got) != 1 {
		t.Fatalf("an unregistered group received %d messages; expected none after Unregister", len(got)-1)
	}
	if d := dropped(n1.t, reasonUnknownGroup); d != 3 {
		t.Errorf("unknown_group drops = %d; expected 3", d)
	}

	// Group 0 (the meta group) is a group like any other, also after a
	// malformed message of its own opens a frame.
	h0 := newGroupHandler(0)
	n1.t.Register(0, h0)
	send(outMsg{group: 0, data: []byte{0xff, 0xff, 0xff}}, outMsg{group: 0, data: marshal(t, heartbeat(20, 10, 7))})
	if got := h0.received(); len(got) != 1 || got[0].GetTerm() != 7 {
		t.Fatalf("group 0 received %v; expected the term-7 heartbeat", got)
	}
	if d := dropped(n1.t, reasonUnknownGroup); d != 3 {
		t.Errorf("unknown_group drops = %d; expected still 3", d)
	}
}

// oldPeer is a node of an earlier release on the Messages stream: it
// answers with the versions it is given (none: a release before the
// handshake) and keeps every frame it receives, as bytes.
type oldPeer struct {
	addr string
	mu   sync.Mutex
	raw  [][]byte
}

func startOldPeer(t *testing.T, answer metadata.MD) *oldPeer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	op := &oldPeer{addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: methodMessages, ClientStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			if answer != nil {
				if err := st.SendHeader(answer); err != nil {
					return err
				}
			}
			for {
				var b []byte
				if err := st.RecvMsg(&b); err != nil {
					return err
				}
				op.mu.Lock()
				op.raw = append(op.raw, b)
				op.mu.Unlock()
			}
		}}, {StreamName: methodSnapshots, ClientStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			return status.Error(codes.Internal, "an old peer was sent a snapshot stream")
		}}},
	}, struct{}{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return op
}

func (op *oldPeer) frames() [][]byte {
	op.mu.Lock()
	defer op.mu.Unlock()
	return slices.Clone(op.raw)
}

// A peer of the previous protocol (one that answers protocol 2, or a
// release before the handshake that answers nothing) is sent only group
// 1's messages, in legacy frames byte for byte; messages and snapshots of
// other groups to it are withheld, counted, and their group told the
// replica is unreachable (or the snapshot failed). A peer that never
// answers is one whose protocol is not known: a frame's worth of other
// groups' messages waits for an answer, the rest are withheld.
func TestOlderPeerGetsOnlyGroup1Frames(t *testing.T) {
	const batch = 8
	for _, c := range []struct {
		name   string
		answer metadata.MD
		held   int
	}{
		{"protocol 2", versions{protocol: 2, protocolMin: 1, entryFormat: 1}.metadata(), 0},
		{"before handshake", nil, batch},
	} {
		t.Run(c.name, func(t *testing.T) {
			old := startOldPeer(t, c.answer)
			n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2}), BatchMaxCount: batch})
			h := &identityGroup{recorder: newRecorder()}
			g2 := n1.t.Register(2, h)
			n1.t.SetPeer(2, old.addr)

			const rounds = 50
			var want [][]byte
			for term := uint64(1); term <= rounds; term++ {
				hb := marshal(t, heartbeat(1, 2, term))
				want = append(want, hb)
				n1.t.Send([]replicaOutbound{{To: 2, Data: hb}})
				g2.Send(outbound(t, heartbeat(1, 2, 1000+term)))
			}
			g2.Send([]replicaOutbound{{To: 2, Snapshot: true, Data: snapshotMessage(t, 1, 2, 1024)}})

			var got [][]byte
			eventually(t, "the old peer receiving group 1's messages", func() bool {
				got = got[:0]
				for _, f := range old.frames() {
					msgs, err := decodeBatch(f)
					if err != nil {
						t.Fatalf("the old peer was sent a frame its decoder refuses (%v): %x", err, f)
					}
					if !bytes.Equal(f, encodeBatch(msgs)) {
						t.Fatalf("a frame to the old peer is not the legacy encoding of its messages: %x", f)
					}
					got = append(got, msgs...)
				}
				return len(got) >= rounds
			})
			if len(got) != rounds {
				t.Fatalf("the old peer received %d messages; expected group 1's %d only", len(got), rounds)
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("message %d to the old peer is %x; expected group 1's %x (in order)", i, got[i], want[i])
				}
			}
			eventually(t, "group 2's messages withheld and counted", func() bool {
				return value(n1.t.metrics.dropped.WithLabelValues("2")) == float64(rounds+1-c.held)
			})
			eventually(t, "group 2 told its snapshot failed", func() bool { return slices.Equal(h.snapshotReports(2), []bool{false}) })
			eventually(t, "group 2 told the replica is unreachable", func() bool {
				h.mu.Lock()
				defer h.mu.Unlock()
				return len(h.unreachable) == rounds-c.held
			})
		})
	}
}

// identityGroup is a Handler whose raft ids are node ids.
type identityGroup struct{ *recorder }

func (identityGroup) NodeOf(id uint64) (uint64, bool) { return id, true }

// A snapshot of a group travels on its own stream tagged with the group,
// reaches that group's handler, and the sending group hears the outcome
// under its own raft id. A snapshot stream naming a group this node does
// not host is refused before anything is spooled.
func TestSnapshotCarriesItsGroup(t *testing.T) {
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, Options{Membership: view})
	n2 := startNode(t, 2, Options{Membership: view})
	h1, h2 := newGroupHandler(3), newGroupHandler(3)
	g := n1.t.Register(3, h1)
	n2.t.Register(3, h2)
	n1.t.SetPeer(2, n2.addr)
	n1.t.Send(outbound(t, heartbeat(1, 2, 1)))
	eventually(t, "group 1's heartbeat delivered", func() bool { return len(n2.in.received()) == 1 })
	waitGrouped(t, n1.t, 2)

	g.Send([]replicaOutbound{{To: 23, Snapshot: true, Data: snapshotMessage(t, 13, 23, 4096)}})
	eventually(t, "group 3's snapshot reported", func() bool { return len(h1.snapshotReports(23)) == 1 })
	if r := h1.snapshotReports(23); !r[0] {
		t.Fatal("group 3's snapshot failed; expected it delivered")
	}
	if got := h2.received(); len(got) != 1 || got[0].GetType() != raftpb.MsgSnap || got[0].GetFrom() != 13 {
		t.Fatalf("group 3 on node 2 received %v; expected the snapshot from replica 13", got)
	}
	if len(n2.in.received()) != 1 {
		t.Fatal("group 1 received group 3's snapshot")
	}

	conn := rawClient(t, n2.addr, nil)
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), metadata.Pairs(mdGroup, "9")), waitFor)
	defer cancel()
	st, err := conn.NewStream(ctx, snapshotDesc, "/"+serviceName+"/"+methodSnapshots)
	if err != nil {
		t.Fatal(err)
	}
	chunk := snapshotMessage(t, 1, 2, 1024)
	_ = st.SendMsg(&chunk)
	if err := finish(st); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "group 9") {
		t.Fatalf("expected NotFound naming group 9, found %v", err)
	}
	if d := dropped(n2.t, reasonUnknownGroup); d != 1 {
		t.Errorf("unknown_group drops = %d; expected 1", d)
	}
}

// Regression: other groups held until the peer answers. A sender learns
// whether its peer reads grouped frames from the answer to the stream it
// opens; messages of groups other than 1 collected before that answer
// wait for it (a frame's worth) instead of being withheld, so a new or
// reconnected stream does not cost every other group a round of messages.
func TestOtherGroupsWaitForThePeersAnswer(t *testing.T) {
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, Options{Membership: view})
	n2 := startNode(t, 2, Options{Membership: view})
	h1, h2 := &identityGroup{recorder: newRecorder()}, &identityGroup{recorder: newRecorder()}
	g := n1.t.Register(2, h1)
	n2.t.Register(2, h2)
	// Queued before the stream exists: the first frame is collected
	// before the peer's answer can have arrived.
	n1.t.SetPeer(2, n2.addr)
	for term := uint64(1); term <= 5; term++ {
		g.Send(outbound(t, heartbeat(1, 2, term)))
	}
	eventually(t, "group 2's first messages delivered", func() bool { return len(h2.received()) == 5 })
	if d := value(n1.t.metrics.dropped.WithLabelValues("2")); d != 0 {
		t.Errorf("%v messages to node 2 dropped; expected none", d)
	}
}
