//go:build tidalbugs

package replica

import (
	"sync/atomic"

	"github.com/tidaldb/tidal/tidal-server/bugs"
)

// plantedReplica is what the defects of a tidalbugs build need to know.
type plantedReplica struct {
	draining atomic.Bool // set once, when the node starts to drain
}

// PlantedDrain tells the replica its node has started to drain (SIGTERM).
// With drain-ack-before-fsync on, it answers every write waiting on this
// node as applied at once, and from then on Propose answers writes
// without waiting for them. It exists in a tidalbugs build only;
// Server.Shutdown calls it.
func (r *Replica) PlantedDrain() {
	r.planted.draining.Store(true)
	if !bugs.Active(bugs.DrainAckBeforeFsync) {
		return
	}
	// Each waiter is told its write is applied at the index after the
	// last one this node holds: a guess, as the drain never waits to
	// learn where (or whether) the write lands.
	last, _ := r.storage.LastIndex()
	a := Applied{Index: last + 1, Term: r.term.Load()}
	r.mu.Lock()
	waiting := r.proposals
	r.proposals = map[uint64]chan Applied{}
	r.mu.Unlock()
	for _, ch := range waiting {
		ch <- a // buffered, and no longer reachable by apply
	}
}

// plantedDrainAck reports whether drain-ack-before-fsync is on and the
// node is draining.
func (r *Replica) plantedDrainAck() bool {
	return bugs.Active(bugs.DrainAckBeforeFsync) && r.planted.draining.Load()
}
