//go:build !tidalbugs

package replica

// plantedReplica holds what the planted defects of a tidalbugs build need
// (bugs_on.go); in a normal build it is empty and its hook is a constant
// the compiler folds away.
type plantedReplica struct{}

func (r *Replica) plantedDrainAck() bool { return false }
