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
