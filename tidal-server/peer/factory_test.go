package peer

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
)

// viewInbound is a recorder whose node has a membership of its own: the
// server's replicated table, as Factory's transport must consult it.
type viewInbound struct {
	*recorder
	current, removed map[uint64]bool
}

func (v viewInbound) MemberStatus(id uint64) (current, removed bool) {
	return v.current[id], v.removed[id]
}

// The transport a server builds (Factory) admits by the
// server's replicated membership, not by its address book: the book has
// no entry for a member without an address, and a removed member listed
// in --peers is seeded into it again at every restart.
func TestFactoryAdmitsByTheServersMembership(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in := viewInbound{recorder: newRecorder(), current: map[uint64]bool{1: true, 2: true}, removed: map[uint64]bool{3: true}}
	rt, stop, err := Factory(Options{SpoolDir: filepath.Join(t.TempDir(), "spool")})(1, lis, in, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	tr := rt.(*Transport)
	// The address book says otherwise: 3 is a peer, 2 is not.
	tr.SetPeer(3, "127.0.0.1:1")

	conn := rawClient(t, lis.Addr().String(), nil) // insecure: From is taken at its word
	if err := sendMessages(context.Background(), conn, marshal(t, heartbeat(2, 1, 5)), marshal(t, heartbeat(9, 1, 5))); err != nil {
		t.Fatal(err)
	}
	expectToldRemoved(t, sendMessages(context.Background(), conn, marshal(t, heartbeat(3, 1, 5))), 3)
	got := in.received()
	if len(got) != 1 || got[0].GetFrom() != 2 {
		t.Fatalf("raft was handed %d messages (%v); expected only member 2's heartbeat", len(got), got)
	}
	if n := dropped(tr, reasonRemovedMember); n != 1 {
		t.Errorf("removed_member drops = %d, expected 1 (member 3, removed in the server's table though in the address book)", n)
	}
	if n := dropped(tr, reasonNotMember); n != 1 {
		t.Errorf("not_member drops = %d, expected 1 (id 9)", n)
	}
}
