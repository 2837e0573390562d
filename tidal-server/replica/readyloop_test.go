package replica_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Regression: the Ready loop wrote and fsynced every
// snapshot received from the leader itself, so a large snapshot on a slow
// disk stopped it: no ticks, no heartbeat responses, no leader changes seen,
// nothing sent. Now the snapshot is written off the loop, which keeps taking
// Readys and follows a leader change while the write is stuck.
func TestReadyLoopKeepsDrainingWhileReceivedSnapshotIsWritten(t *testing.T) {
	c := newCluster(t, 3, func(cfg *replica.Config) {
		cfg.SnapshotEvery = 20
		cfg.SnapshotCatchUp = 5
		cfg.WAL.SegmentSize = 64 << 10
	})
	lead := c.waitLeader()
	var down, other uint64
	for _, id := range []uint64{1, 2, 3} {
		switch {
		case id == lead:
		case down == 0:
			down = id
		default:
			other = id
		}
	}
	c.mustPropose(lead, "first")
	c.waitConverged()
	c.stop(down)
	big := strings.Repeat("s", 4<<10)
	for i := 0; i < 60; i++ { // a snapshot of about 240 KiB
		c.mustPropose(lead, fmt.Sprintf("%02d-%s", i, big))
	}

	// The disk of the returning node takes as long as the test says.
	writing := make(chan uint64, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the cluster's cleanup stops the node
	nd := c.startWith(down, false, func(cfg *replica.Config) {
		replica.SetSlowSnapshotDisk(cfg, func(index uint64) {
			select {
			case writing <- index:
			default:
			}
			<-release
		})
	})
	select {
	case index := <-writing:
		t.Logf("node %d is writing the snapshot at index %d", down, index)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %d, behind a compacted log, never started writing a snapshot from leader %d", down, lead)
	}

	r := nd.r
	base := replica.ReadiesHandled(r)
	waitFor(t, 30*time.Second, fmt.Sprintf("node %d's Ready loop to keep taking Readys while its snapshot is being written", down), func() (bool, string) {
		n := replica.ReadiesHandled(r)
		return n >= base+20, fmt.Sprintf("%d Readys since the write began", n-base)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.node(other).r.TransferLeader(ctx, other); err != nil {
		t.Fatalf("transfer leadership from %d to %d: %v", lead, other, err)
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("node %d, still writing its snapshot, to follow the new leader %d", down, other), func() (bool, string) {
		return r.Leader() == other, fmt.Sprintf("leader %d", r.Leader())
	})

	unblock()
	st := c.waitConverged()
	if _, ok := nd.sm.has("first"); !ok {
		t.Fatalf("node %d converged without the first write: %d entries", down, len(st.Entries))
	}
	if restores, _ := nd.sm.counts(); restores == 0 {
		t.Errorf("node %d caught up without installing the snapshot", down)
	}
	c.mustPropose(down, "after")
	c.waitConverged()
}

// Regression: the Ready loop ran learner promotion rounds
// itself, and a round proposes a conf change and waits for its outcome —
// up to a tick when raft holds the proposal back, up to promoteWait for the
// outcome, which the blocked loop itself would have to deliver. A promotion
// now runs on its own goroutine (promoteLoop): while one is stuck, the
// leader's Ready loop keeps taking Readys and its writes keep committing.
func TestReadyLoopKeepsDrainingWhileLearnerPromotionWaits(t *testing.T) {
	promoting := make(chan uint64, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	c := newCluster(t, 1, func(cfg *replica.Config) {
		replica.SetSlowPromotion(cfg, func(id uint64) {
			select {
			case promoting <- id:
			default:
			}
			<-release
		})
	})
	t.Cleanup(unblock) // before the cluster's cleanup stops the nodes
	c.waitLeader(1)
	c.mustPropose(1, "first")
	c.mustAddMember(1, 2)
	c.start(2, true)
	select {
	case id := <-promoting:
		t.Logf("leader 1 is promoting learner %d", id)
	case <-time.After(30 * time.Second):
		t.Fatalf("leader 1 never began promoting learner 2")
	}

	r := c.node(1).r
	base := replica.ReadiesHandled(r)
	waitFor(t, 30*time.Second, "leader 1's Ready loop to keep taking Readys while a learner promotion waits", func() (bool, string) {
		n := replica.ReadiesHandled(r)
		return n >= base+20, fmt.Sprintf("%d Readys since the promotion began", n-base)
	})
	if _, err := c.proposeRetrying(1, "during-promotion", 30*time.Second); err != nil {
		t.Fatalf("write on leader 1 while a learner promotion waits: %v", err)
	}

	unblock()
	waitFor(t, 30*time.Second, "node 2 to be promoted to voter", func() (bool, string) {
		for _, m := range r.Status().Members {
			if m.ID == 2 {
				return m.Role == "follower", "role " + m.Role
			}
		}
		return false, "absent"
	})
	c.mustPropose(2, "from-new-voter")
	c.waitConverged(1, 2)
}

// Regression: the state was encoded into memory on
// the apply goroutine, so while a large snapshot (131 MB of vectors) was
// encoded nothing was applied — no write completed — and the encoding's
// allocations stalled the whole process past an election timeout. Now the
// apply goroutine only captures the state (CaptureSnapshot) and the snapshot
// goroutine encodes it: while the encoding is stuck, writes keep being
// applied and acknowledged on every node, the Ready loops keep taking
// Readys, and once it finishes the snapshot restores exactly (restart).
func TestWritesApplyWhileLargeSnapshotIsEncoded(t *testing.T) {
	encoding := make(chan struct{}, 16)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	c := newCluster(t, 3, func(cfg *replica.Config) {
		cfg.SnapshotEvery = 20
		cfg.SnapshotCatchUp = 5
	})
	c.setupSM = func(sm *listSM) {
		sm.views = true
		sm.encode = func() {
			select {
			case encoding <- struct{}{}:
			default:
			}
			<-release
		}
	}
	for id := uint64(1); id <= 3; id++ { // restart with the hook in place
		c.stop(id)
	}
	for id := uint64(1); id <= 3; id++ {
		c.start(id, false)
	}
	t.Cleanup(unblock) // before the cluster's cleanup stops the nodes
	lead := c.waitLeader()
	for i := 0; i < 25; i++ {
		c.mustPropose(lead, fmt.Sprintf("before-%02d", i))
	}
	select {
	case <-encoding:
	case <-time.After(30 * time.Second):
		t.Fatal("no node began encoding a snapshot after 25 writes (SnapshotEvery 20)")
	}
	bases := map[uint64]uint64{}
	for id := uint64(1); id <= 3; id++ {
		bases[id] = replica.ReadiesHandled(c.node(id).r)
	}
	for i := 0; i < 40; i++ {
		if _, err := c.proposeRetrying(lead, fmt.Sprintf("during-%02d", i), 30*time.Second); err != nil {
			t.Fatalf("write %d while a snapshot is being encoded: %v", i, err)
		}
	}
	st := c.waitConverged()
	for id := uint64(1); id <= 3; id++ {
		if n := replica.ReadiesHandled(c.node(id).r); n < bases[id]+20 {
			t.Errorf("node %d took %d Readys while its snapshot was encoded", id, n-bases[id])
		}
	}
	unblock()
	waitFor(t, 30*time.Second, "every node to finish its snapshot", func() (bool, string) {
		for id := uint64(1); id <= 3; id++ {
			if idx := replica.SnapshotIndex(c.node(id).r); idx < 20 {
				return false, fmt.Sprintf("node %d snapshot index %d", id, idx)
			}
		}
		return true, ""
	})
	// Restart every node: each rebuilds from its snapshot and WAL.
	for id := uint64(1); id <= 3; id++ {
		c.stop(id)
	}
	for id := uint64(1); id <= 3; id++ {
		c.start(id, false)
	}
	c.waitLeader()
	after := c.waitConverged()
	if after.Digest != st.Digest || len(after.Entries) != len(st.Entries) {
		t.Fatalf("after restart: %d entries digest %s, before: %d entries digest %s", len(after.Entries), after.Digest, len(st.Entries), st.Digest)
	}
	for id := uint64(1); id <= 3; id++ {
		if restores, _ := c.node(id).sm.counts(); restores == 0 {
			t.Errorf("node %d restarted without restoring its snapshot", id)
		}
	}
}
