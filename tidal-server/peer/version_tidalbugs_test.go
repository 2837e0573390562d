//go:build tidalbugs

// Tests that make this process read a newer entry format need
// replica.SetTestNewerEntryFormat, which only a tidalbugs build has:
// `make unit` runs them with -tags tidalbugs.

package peer

import (
	"testing"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// The sending half of the entry-format gate: a node that reads (and so
// may write) a newer entry format than a peer advertised does not send
// that peer appends carrying such entries — a release without the
// receiving half would skip them at apply and diverge. Appends of formats
// the peer reads still go, and so does everything to a peer that
// advertised the newer format.
func TestWithholdsEntriesAPeerCannotRead(t *testing.T) {
	defer replica.SetTestNewerEntryFormat()() // this node reads one entry format more than this build
	n1 := startNode(t, 1, Options{})
	known := []byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 'x'}
	newer := append([]byte{0x7f}, known[1:]...)
	mixed := marshal(t, appendWith(1, 2, known, newer))

	n1.t.notePeerVersions(2, legacyVersions)                                                                    // a release before the handshake
	n1.t.notePeerVersions(4, versions{protocol: 2, protocolMin: 1, entryFormat: replica.ReadableEntryFormat()}) // reads all this node does
	for _, c := range []struct {
		peer     uint64
		data     []byte
		withheld bool
	}{
		{2, mixed, true},
		{3, mixed, true}, // advertised nothing: format 1
		{4, mixed, false},
		{2, marshal(t, appendWith(1, 2, known)), false},
		{2, marshal(t, heartbeat(1, 2, 3)), false},
	} {
		idx, _, withheld := n1.t.withholds(c.peer, c.data)
		if withheld != c.withheld || (withheld && idx != 2) {
			t.Errorf("withholds(peer %d) = index %d, %v; expected %v", c.peer, idx, withheld, c.withheld)
		}
	}

	// Through Send: withheld, counted, and raft told the peer is
	// unreachable (so it probes instead of streaming on).
	n1.t.SetPeer(3, "127.0.0.1:1")
	n1.t.Send(outbound(t, appendWith(1, 3, known, newer)))
	if got := value(n1.t.metrics.dropped.WithLabelValues("3")); got != 1 {
		t.Errorf("messages withheld from peer 3 = %v; expected 1", got)
	}
	eventually(t, "raft told peer 3 is unreachable", func() bool {
		n1.in.mu.Lock()
		defer n1.in.mu.Unlock()
		return len(n1.in.unreachable) > 0 && n1.in.unreachable[0] == 3
	})
}
