package replica

import (
	"testing"
	"time"
)

// SetWallClock makes the package read now instead of time.Now until the
// test ends: a clock that steps back across a restart.
func SetWallClock(t testing.TB, now func() time.Time) {
	prev := wallClock
	wallClock = now
	t.Cleanup(func() { wallClock = prev })
}

// SetSlowSnapshotDisk makes the replica started with cfg call hook before it
// writes the file of a snapshot received from the leader, on the goroutine
// that writes it: hook stands for a disk as slow as the test wants.
func SetSlowSnapshotDisk(cfg *Config, hook func(index uint64)) { cfg.beforeSnapshotWrite = hook }

// SetSlowPromotion makes the replica started with cfg call hook before it
// proposes a learner's promotion, on the goroutine that proposes it: hook
// stands for a promotion that takes as long as the test wants (raft holding
// a conf change back while another is pending, a leader slow to commit).
func SetSlowPromotion(cfg *Config, hook func(id uint64)) { cfg.beforePromote = hook }

// ReadiesHandled is how many Readys r's Ready loop has taken from raft.
func ReadiesHandled(r *Replica) uint64 { return r.readies.Load() }

// PromotionRounds is how many learner promotion rounds r has run as leader.
func PromotionRounds(r *Replica) uint64 { return r.promotionRounds.Load() }

// RaftApplied is the applied index raft itself has been told of, which
// trails the replica's own by the time it takes to step the apply response
// back; raft judges whether a conf change is pending by it.
func RaftApplied(r *Replica) uint64 { return r.node.Status().Applied }

// ProposeRaw hands data to raft as it is, without the envelope Propose
// frames it in: an entry as a newer release (or a bug) would write it.
func ProposeRaw(r *Replica, data []byte) error {
	return r.node.Propose(r.haltCtx, data)
}

// HoldPacks makes r's proposals queue for packing without being flushed
// (as if a flush were in progress) until the returned release is called,
// which flushes them: a test decides what one pack holds.
func HoldPacks(r *Replica) (queued func() int, release func()) {
	r.pack.mu.Lock()
	r.pack.busy = true
	r.pack.mu.Unlock()
	queued = func() int {
		r.pack.mu.Lock()
		defer r.pack.mu.Unlock()
		return len(r.pack.pending)
	}
	return queued, func() { r.flushPacks() }
}

// AgeHeard moves r's record of when it last heard from each peer ticks
// further into the past, as if that many ticks had passed in silence.
func AgeHeard(r *Replica, ticks uint64) { r.heardAt.now.Add(ticks) }

// SnapshotIndex is the index of r's newest durable snapshot.
func SnapshotIndex(r *Replica) uint64 { return r.snapIndex.Load() }

// Waiting is how many proposals made on r wait for their entry to apply.
func Waiting(r *Replica) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.proposals)
}
