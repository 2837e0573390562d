package replica

import "math/bits"

// Snapshot points (p99.9 at 64 clients). Without staggering,
// every member of a cluster applies the same log and reaches
// "SnapshotEvery entries since the last snapshot" at the same index, so
// all of them capture and encode at once; on a small box that takes CPU
// from the leader and both followers together, and a commit, which needs
// the leader and one follower, waits on an encoder either way.
//
// With Config.StaggerSnapshots a member snapshots at the indexes
// congruent to its phase modulo SnapshotEvery, where the phase is the
// fractional part of id·φ (φ the golden ratio) times SnapshotEvery. By
// the three-distance theorem consecutive ids land spread over the cycle:
// ids 1, 2 and 3 sit at 0.618, 0.236 and 0.854 of it, so no two of them
// are closer than 0.236·SnapshotEvery entries, and no membership
// knowledge is needed (a joining member or a replaced id keeps the
// property).
//
// Invariants, pinned by TestSnapshotPoints:
//   - the next point lies at least max(1, SnapshotEvery/2) and less than
//     1.5·SnapshotEvery entries after the last snapshot, so snapshots
//     stay as frequent on average and the log never grows by more than
//     half an interval beyond what it did unstaggered;
//   - without staggering the next point is exactly SnapshotEvery entries
//     after the last snapshot.

// golden64 is 2^64/φ, rounded to odd.
const golden64 = 0x9E3779B97F4A7C15

// snapshotPhase is where in each cycle of every entries member id takes
// its periodic snapshot: floor(frac(id·φ)·every).
func snapshotPhase(id, every uint64) uint64 {
	hi, _ := bits.Mul64(id*golden64, every)
	return hi
}

// nextSnapshotAt is the applied index at which a member that last
// snapshotted at snapIndex takes its next periodic snapshot.
func nextSnapshotAt(id, snapIndex, every uint64, stagger bool) uint64 {
	if !stagger {
		return snapIndex + every
	}
	earliest := snapIndex + max(1, every/2)
	phase := snapshotPhase(id, every)
	return earliest + (phase+every-earliest%every)%every
}
