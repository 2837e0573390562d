//go:build tidalbugs

package replica_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// A draining leader hands leadership off and raft refuses every proposal
// meanwhile. Without the defect each write it takes then is refused
// (ErrTransferInProgress: certainly not applied); with
// drain-ack-before-fsync it is answered as applied and is in no log.
func TestPlantedDrainAckBeforeFsyncAcksWritesTheHandOffRefused(t *testing.T) {
	// A transfer to a stopped member stays under way for an election
	// timeout (50 ticks), then raft abandons it and the leader leads on.
	c := newCluster(t, 3, func(cfg *replica.Config) { cfg.ElectionTicks = 50 })
	lead := c.waitLeader()
	var others []uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != lead {
			others = append(others, id)
		}
	}
	dead, via := others[0], others[1]
	c.stop(dead)
	c.node(lead).r.PlantedDrain()

	// drain proposes on the leader throughout one transfer and returns
	// the writes answered as applied, those refused, and those of the
	// answered ones that are not applied on via once a write made after
	// all of them is.
	drain := func(tag string) (acked, refused, lost []string) {
		t.Helper()
		terr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			terr <- c.node(lead).r.TransferLeader(ctx, dead)
		}()
	propose:
		for k := 0; ; k++ {
			select {
			case err := <-terr:
				if !errors.Is(err, replica.ErrTransferAbandoned) {
					t.Fatalf("%s: TransferLeader(%d) with %d stopped: expected ErrTransferAbandoned, found %v", tag, dead, dead, err)
				}
				break propose
			default:
			}
			p := fmt.Sprintf("%s-%d", tag, k)
			switch _, err := c.propose(lead, p, 5*time.Second); {
			case err == nil:
				acked = append(acked, p)
			default:
				// Refused one way or another: ErrTransferInProgress while
				// the transfer runs, or raft's drop reported otherwise when
				// the transfer ends between the drop and the look at why
				// (raft gives up a transfer to a stopped member at its
				// election timeout). Either way it was not answered as
				// applied, which is all this test judges.
				refused = append(refused, p)
			}
			time.Sleep(2 * time.Millisecond)
		}
		marker := tag + "-after"
		c.mustPropose(via, marker)
		waitFor(t, 30*time.Second, marker+" applied on "+fmt.Sprint(via), func() (bool, string) {
			_, ok := c.node(via).sm.has(marker)
			return ok, ""
		})
		for _, p := range acked {
			if _, ok := c.node(via).sm.has(p); !ok {
				lost = append(lost, p)
			}
		}
		return acked, refused, lost
	}

	acked, refused, lost := drain("off")
	if len(refused) == 0 || len(lost) != 0 {
		t.Fatalf("defect off: expected writes refused during the hand-off and every answered one applied, found %d answered, %d refused, lost %v", len(acked), len(refused), lost)
	}
	t.Cleanup(bugs.Enable(bugs.DrainAckBeforeFsync))
	acked, refused, lost = drain("on")
	if len(refused) != 0 || len(lost) == 0 {
		t.Fatalf("drain-ack-before-fsync on: expected every write answered as applied and some of them in no log, found %d answered, %d refused, lost %v", len(acked), len(refused), lost)
	}
	t.Logf("drain-ack-before-fsync on: %d writes answered as applied, %d of them in no log", len(acked), len(lost))
}

// A write waiting on a node when it starts to drain: without the defect
// it waits on (here, forwarded into a partition, until its deadline: an
// unknown outcome); with drain-ack-before-fsync it is answered as applied
// at once, and it is in no log.
func TestPlantedDrainAckBeforeFsyncAnswersTheWritesWaitingAtTheDrain(t *testing.T) {
	c := newCluster(t, 3, func(cfg *replica.Config) { cfg.ElectionTicks = 50 })
	lead := c.waitLeader()
	via, other := uint64(1), uint64(2)
	for via == lead || other == lead || via == other {
		via, other = via%3+1, other%3+1
	}
	// drained proposes p on via, cut off from the others, so that its
	// forwarded proposal is lost; once p waits there, switch runs and
	// via starts to drain. It returns Propose's answer.
	drained := func(p string, timeout time.Duration, switchOn func()) error {
		t.Helper()
		c.mustPropose(via, "before-"+p) // via knows the leader
		c.net.partition([]uint64{via}, []uint64{lead, other})
		res := make(chan error, 1)
		go func() {
			_, err := c.propose(via, p, timeout)
			res <- err
		}()
		waitFor(t, 30*time.Second, p+" waiting on "+fmt.Sprint(via), func() (bool, string) {
			n := replica.Waiting(c.node(via).r)
			return n == 1, fmt.Sprintf("%d proposals waiting", n)
		})
		switchOn()
		c.node(via).r.PlantedDrain()
		err := <-res
		c.net.heal()
		return err
	}

	if err := drained("off", 2*time.Second, func() {}); !errors.Is(err, replica.ErrUnknownOutcome) {
		t.Fatalf("defect off: expected the write forwarded into the partition to wait for its deadline (ErrUnknownOutcome), found %v", err)
	}
	if err := drained("on", 30*time.Second, func() { t.Cleanup(bugs.Enable(bugs.DrainAckBeforeFsync)) }); err != nil {
		t.Fatalf("drain-ack-before-fsync on: expected the waiting write answered as applied at the drain, found %v", err)
	}
	c.mustPropose(lead, "after")
	waitFor(t, 30*time.Second, "after applied on "+fmt.Sprint(other), func() (bool, string) {
		_, ok := c.node(other).sm.has("after")
		return ok, ""
	})
	if i, ok := c.node(other).sm.has("on"); ok {
		t.Fatalf("drain-ack-before-fsync on: expected the answered write in no log (its proposal was cut off), found it applied at %d", i)
	}
}
