//go:build tidalbugs

package server

import "github.com/tidaldb/tidal/tidal-server/bugs"

// plantedDrainStart switches the replica to drain-ack-before-fsync's
// answers as the drain starts, before the leadership hand-off: the
// writes a leader takes while it hands off are refused by raft and
// answered as applied all the same.
func (s *Server) plantedDrainStart() {
	if !bugs.Active(bugs.DrainAckBeforeFsync) || s.replica == nil {
		return
	}
	s.replica.PlantedDrain()
	s.log.Warn("draining: answering every write as applied without waiting for it (planted drain-ack-before-fsync)")
}
