package peer

import (
	"context"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestCompatibleProtocols(t *testing.T) {
	own := versions{protocol: 2, protocolMin: 1, entryFormat: 1}
	for _, c := range []struct {
		theirs versions
		ok     bool
	}{
		{legacyVersions, true},
		{versions{protocol: 2, protocolMin: 1, entryFormat: 1}, true},
		{versions{protocol: 3, protocolMin: 2, entryFormat: 2}, true},  // a newer release that still talks to 2
		{versions{protocol: 4, protocolMin: 3, entryFormat: 2}, false}, // one that dropped 2
	} {
		why := compatible(own, c.theirs)
		if (why == "") != c.ok {
			t.Errorf("compatible(%+v, %+v) = %q; expected ok=%v", own, c.theirs, why, c.ok)
		}
	}
	// This node too old for the peer's minimum, and the peer too old for ours.
	if why := compatible(versions{protocol: 3, protocolMin: 3}, legacyVersions); !strings.Contains(why, "older than the oldest") {
		t.Errorf("expected the peer called too old, found %q", why)
	}
}

// Peers exchange versions when a stream opens, and the
// entry format a peer advertised is what the minimum-entry-format rule
// reads (PeerEntryFormat).
func TestPeersExchangeVersions(t *testing.T) {
	n1 := startNode(t, 1, Options{})
	n2 := startNode(t, 2, Options{})
	n1.t.SetPeer(2, n2.addr)
	n2.t.SetPeer(1, n1.addr)
	n1.t.Send(outbound(t, heartbeat(1, 2, 1)))
	eventually(t, "node 2 receiving node 1's heartbeat", func() bool { return len(n2.in.received()) == 1 })
	for _, c := range []struct {
		tr   *Transport
		peer uint64
	}{{n1.t, 2}, {n2.t, 1}} {
		eventually(t, "the peer's entry format learned", func() bool { _, ok := c.tr.PeerEntryFormat(c.peer); return ok })
		if f, _ := c.tr.PeerEntryFormat(c.peer); f != replica.EntryFormat {
			t.Errorf("node %d learned entry format %d for peer %d; expected %d", c.tr.self, f, c.peer, replica.EntryFormat)
		}
	}
}

// A stream from a peer whose protocol this node cannot talk is refused,
// naming both versions, and counted; nothing reaches raft. A peer that
// says nothing (a release before the handshake) is admitted.
func TestRefusesIncompatibleProtocol(t *testing.T) {
	n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2})})
	conn := rawClient(t, n1.addr, nil)
	future := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(mdProtocol, "5", mdProtocolMin, "4", mdEntryFormat, "2"))
	err := sendMessages(future, conn, marshal(t, heartbeat(2, 1, 1)))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "peer protocol 5") ||
		!strings.Contains(err.Error(), "this node speaks 3") {
		t.Fatalf("expected FailedPrecondition naming protocol 5 and this node's 3, found %v", err)
	}
	if got := dropped(n1.t, reasonProtocolVersion); got != 1 {
		t.Errorf("protocol_version drops = %d; expected 1", got)
	}
	if _, ok := n1.t.PeerEntryFormat(2); ok {
		t.Error("a refused peer's entry format was recorded")
	}
	garbled := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(mdProtocol, "two"))
	if err := sendMessages(garbled, conn, marshal(t, heartbeat(2, 1, 1))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("expected InvalidArgument for a garbled version, found %v", err)
	}
	if err := sendMessages(context.Background(), conn, marshal(t, heartbeat(2, 1, 1))); err != nil {
		t.Fatalf("a peer without versions (an older release) was refused: %v", err)
	}
	if got := n1.in.received(); len(got) != 1 {
		t.Fatalf("raft received %d messages; expected only the legacy peer's heartbeat", len(got))
	}
	if f, ok := n1.t.PeerEntryFormat(2); !ok || f != 1 {
		t.Errorf("a legacy peer's entry format = %d (%v); expected 1", f, ok)
	}
}

func appendWith(from, to uint64, data ...[]byte) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(1),
		Index: proto.Uint64(0), LogTerm: proto.Uint64(0), Commit: proto.Uint64(0)}
	for i, d := range data {
		m.Entries = append(m.Entries, &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Term: proto.Uint64(1), Index: proto.Uint64(uint64(i + 1)), Data: d})
	}
	return m
}

// An append carrying an entry of a format this node cannot read is
// dropped before raft sees it (reason entry_format); appends of known
// formats pass. Without the check, raft would append it and apply would
// meet it (where it stops the node, rather than skip the entry and
// diverge).
func TestDropsAppendsOfUnreadableEntryFormat(t *testing.T) {
	n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2})})
	conn := rawClient(t, n1.addr, nil)
	known := []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9, 'x'}
	newer := append([]byte{0x7f}, known[1:]...)
	if err := sendMessages(context.Background(), conn,
		marshal(t, appendWith(2, 1, known, nil)),
		marshal(t, appendWith(2, 1, known, newer)),
	); err != nil {
		t.Fatal(err)
	}
	got := n1.in.received()
	if len(got) != 1 || len(got[0].GetEntries()) != 2 || got[0].GetEntries()[1].GetData() != nil {
		t.Fatalf("raft received %v; expected only the append of known formats", got)
	}
	if d := dropped(n1.t, reasonEntryFormat); d != 1 {
		t.Errorf("entry_format drops = %d; expected 1", d)
	}
	if idx, env, bad := unreadableEntry(marshal(t, appendWith(2, 1, known, known, newer))); !bad || idx != 3 || env != 0x7f {
		t.Errorf("unreadableEntry = %d, %#x, %v; expected index 3, envelope 0x7f", idx, env, bad)
	}
}

// A member removed while it was cut off never applies
// its removal (the leader stops sending to it). When it next sends, the
// member it reaches says so, and it is told: Inbound.ReportRemoved.
func TestRemovedSenderIsTold(t *testing.T) {
	n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2}, 3)})
	n3 := startNode(t, 3, Options{Membership: members([]uint64{1, 2, 3})})
	n3.t.SetPeer(1, n1.addr)
	n3.t.Send(outbound(t, heartbeat(3, 1, 7)))
	eventually(t, "node 3 told it was removed", func() bool { return len(n3.in.removalReports()) > 0 })
	if got := n3.in.removalReports(); got[0] != 1 {
		t.Fatalf("removal reported by %v; expected member 1", got)
	}
	if got := n1.in.received(); len(got) != 0 {
		t.Fatalf("raft on node 1 received %v from a removed member", got)
	}
	// A member that is not removed is never told so.
	n2 := startNode(t, 2, Options{Membership: members([]uint64{1, 2, 3})})
	n2.t.SetPeer(1, n1.addr)
	n2.t.Send(outbound(t, heartbeat(2, 1, 7)))
	eventually(t, "node 1 receiving member 2's heartbeat", func() bool { return len(n1.in.received()) == 1 })
	if got := n2.in.removalReports(); len(got) != 0 {
		t.Fatalf("member 2 was told it was removed by %v", got)
	}
}

// Snapshot streams are versioned like Messages streams: one from a peer
// this node cannot talk to is refused before anything is spooled.
func TestSnapshotStreamRefusesIncompatibleProtocol(t *testing.T) {
	n1 := startNode(t, 1, Options{Membership: members([]uint64{1, 2})})
	conn := rawClient(t, n1.addr, nil)
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(),
		metadata.Pairs(mdProtocol, "5", mdProtocolMin, "4")), waitFor)
	defer cancel()
	st, err := conn.NewStream(ctx, snapshotDesc, "/"+serviceName+"/"+methodSnapshots)
	if err != nil {
		t.Fatal(err)
	}
	chunk := snapshotMessage(t, 2, 1, 1024)
	_ = st.SendMsg(&chunk)
	if err := finish(st); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "peer protocol 5") {
		t.Fatalf("expected FailedPrecondition naming protocol 5, found %v", err)
	}
	if got := dropped(n1.t, reasonProtocolVersion); got != 1 {
		t.Errorf("protocol_version drops = %d; expected 1", got)
	}
}

// Regression: newer protocol refuses this one. SetTestNewerProtocol (a
// tidalbugs build's; here testProtocolBump.Store(1)) stands for a future
// release that no longer talks to this one, so its minimum must be above ProtocolVersion whatever ProtocolVersion is; a
// minimum computed from MinProtocolVersion alone fell to ProtocolVersion
// once the protocol moved past 2, and the "incompatible" node talked.
func TestNewerTestProtocolRefusesThisRelease(t *testing.T) {
	this := ownVersions()
	testProtocolBump.Store(1)
	defer testProtocolBump.Store(0)
	newer := ownVersions()
	if why := compatible(newer, this); why == "" {
		t.Fatalf("a node with the protocol bump (%+v) talks to this release (%+v); expected refused", newer, this)
	}
	if why := compatible(this, newer); why == "" {
		t.Fatalf("this release (%+v) talks to a node with the protocol bump (%+v); expected refused", this, newer)
	}
}

// Regression: protocol bump race. The bump is set while senders of nodes
// other tests started (closed only by their cleanup) still read it in
// ownVersions, so it must be safe to read and write at once; under -race
// a plain variable failed here, as it failed the test above at random.
func TestProtocolBumpIsSafeToSetWhileSendersRead(t *testing.T) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = ownVersions()
			}
		}
	}()
	for range 1000 {
		testProtocolBump.Store(1)
		testProtocolBump.Store(0)
	}
	close(stop)
	<-done
	if v := ownVersions(); v.protocol != ProtocolVersion {
		t.Fatalf("protocol after restoring the bump = %d; expected %d", v.protocol, ProtocolVersion)
	}
}
