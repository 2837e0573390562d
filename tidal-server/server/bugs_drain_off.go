//go:build !tidalbugs

package server

// plantedDrainStart is the start of drain-ack-before-fsync's drain in a
// tidalbugs build (bugs_drain_on.go); here it does nothing.
func (s *Server) plantedDrainStart() {}
