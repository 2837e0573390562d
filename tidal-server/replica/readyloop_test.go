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

// Regression (issue 9 item 3): the Ready loop wrote and fsynced every
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

// Regression (issue 9 item 3): the Ready loop ran learner promotion rounds
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
