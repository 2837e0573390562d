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

// PlantedDrain tells the replica its node has started to drain (SIGTERM):
// from then on drain-ack-before-fsync answers writes without waiting for
// them. It exists in a tidalbugs build only; Server.Shutdown calls it.
func (r *Replica) PlantedDrain() { r.planted.draining.Store(true) }

// plantedDrainAck reports whether drain-ack-before-fsync is on and the
// node is draining.
func (r *Replica) plantedDrainAck() bool {
	return bugs.Active(bugs.DrainAckBeforeFsync) && r.planted.draining.Load()
}
