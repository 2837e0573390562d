package peer

import (
	"context"
	"slices"
	"testing"
)

// Many raft messages travel in one stream message
// (a batch), and admission stays per message. Member 2's certificate sends
// member 3 one batch mixing its own heartbeats with a forged From, a
// message for another member and bytes that are no raft message: only
// member 2's own reach raft, in the order sent, and each refusal is
// counted under its reason.
func TestBatchAdmitsEachMessageAndKeepsOrder(t *testing.T) {
	p := newPKI(t)
	srv := startNode(t, 3, p.secured(t, 3, Options{Membership: members([]uint64{1, 2, 3})}))
	conn := rawClient(t, srv.addr, attackerTLS(t, p.nodeDir(t, 2)))

	batch := [][]byte{
		marshal(t, heartbeat(2, 3, 1)),
		marshal(t, heartbeat(1, 3, 2)), // forged: the certificate is member 2's
		marshal(t, heartbeat(2, 3, 3)),
		marshal(t, heartbeat(2, 1, 4)), // for member 1, not this node
		{0xff, 0xff, 0xff},             // not a raft message
		marshal(t, heartbeat(2, 3, 5)),
		marshal(t, heartbeat(1, 3, 6)), // forged again
		marshal(t, heartbeat(2, 3, 7)),
	}
	if err := sendMessages(context.Background(), conn, batch...); err != nil {
		t.Fatal(err)
	}

	var terms []uint64
	for _, m := range srv.in.received() {
		if m.GetFrom() != 2 {
			t.Errorf("raft received a message from %d; expected only member 2's own", m.GetFrom())
		}
		terms = append(terms, m.GetTerm())
	}
	if want := []uint64{1, 3, 5, 7}; !slices.Equal(terms, want) {
		t.Errorf("raft received terms %v; expected %v (the admitted ones, in batch order)", terms, want)
	}
	for reason, want := range map[string]int{reasonSenderMismatch: 2, reasonWrongRecipient: 1, reasonMalformed: 1} {
		if got := dropped(srv.t, reason); got != want {
			t.Errorf("%s drops = %d; expected %d", reason, got, want)
		}
	}
}

// The sender coalesces what is queued for a peer
// into batches; messages handed over in many Send calls of different
// sizes arrive in the order they were sent, none lost.
func TestSenderKeepsOrderAcrossBatches(t *testing.T) {
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, Options{Membership: view, BatchMaxCount: 7})
	n2 := startNode(t, 2, Options{Membership: view})
	n1.t.SetPeer(2, n2.addr)

	const total = 1000
	term := uint64(0)
	for size := 1; term < total; size = size%13 + 1 {
		var out []replicaOutbound
		for i := 0; i < size && term < total; i++ {
			term++
			out = append(out, outbound(t, heartbeat(1, 2, term))...)
		}
		n1.t.Send(out)
		// Stay under the sender's queue (4096): a full queue drops.
		eventually(t, "the receiver within 2000 of the sender", func() bool { return int(term)-len(n2.in.received()) < 2000 })
	}
	eventually(t, "every message delivered", func() bool { return len(n2.in.received()) == total })
	for i, m := range n2.in.received() {
		if m.GetTerm() != uint64(i+1) {
			t.Fatalf("message %d arrived with term %d; expected %d", i, m.GetTerm(), i+1)
		}
	}
}
