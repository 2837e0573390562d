package replica

import (
	"slices"
	"testing"
)

func TestSnapshotPoints(t *testing.T) {
	for _, every := range []uint64{1, 2, 3, 10, 20, 300, 10000} {
		for id := uint64(1); id <= 7; id++ {
			for _, snap := range []uint64{0, 1, 7, 9999, 10000, 123457} {
				got := nextSnapshotAt(id, snap, every, false)
				if got != snap+every {
					t.Fatalf("unstaggered id %d after %d every %d: expected %d, found %d", id, snap, every, snap+every, got)
				}
				got = nextSnapshotAt(id, snap, every, true)
				lo, hi := snap+max(1, every/2), snap+every+every/2
				if got < lo || got >= max(hi, lo+1) {
					t.Fatalf("staggered id %d after %d every %d: expected in [%d, %d), found %d", id, snap, every, lo, hi, got)
				}
				if every > 1 && got%every != snapshotPhase(id, every) {
					t.Fatalf("staggered id %d after %d every %d: %d is not at phase %d", id, snap, every, got, snapshotPhase(id, every))
				}
			}
		}
	}
}

// Members 1, 2 and 3 started together never snapshot within 0.2 of an
// interval of each other: the whole point of staggering.
func TestStaggeredMembersSnapshotApart(t *testing.T) {
	const every = 10000
	var points []uint64
	for id := uint64(1); id <= 3; id++ {
		snap := uint64(0)
		for range 50 {
			snap = nextSnapshotAt(id, snap, every, true)
			points = append(points, snap)
		}
	}
	slices.Sort(points)
	for i := 1; i < len(points); i++ {
		if gap := points[i] - points[i-1]; gap < every/5 {
			t.Fatalf("snapshots at %d and %d are %d entries apart; expected at least %d", points[i-1], points[i], gap, every/5)
		}
	}
}
