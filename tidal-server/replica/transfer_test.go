package replica_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Regression: membership change during a transfer to a dead node. raft
// drops every proposal while its leader transfers leadership, and a
// membership change is stepped, which says nothing of a drop: one
// forwarded by a follower while the leader transferred to a stopped member
// was lost without a word, and its proposer waited out its deadline for an
// unknown outcome (the API's 504) although it was certainly never made.
// The leader now refuses it and tells the follower, whose proposer answers
// ErrTransferInProgress at once; the leader gives up the transfer to the
// silent member once raft abandoned it (ErrTransferAbandoned), and the
// change retried then is made.
func TestMembershipChangeDuringATransferToADeadNode(t *testing.T) {
	// A long election timeout keeps each transfer under way for a while,
	// so the follower's change lands inside one; a change that lands
	// after it (a loaded machine) is made, and the scenario runs again
	// with the next member id.
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

	for attempt, id := 0, uint64(10); ; attempt, id = attempt+1, id+1 {
		if attempt == 10 {
			t.Fatalf("in %d transfers to stopped member %d, no membership change through %d met one under way", attempt, dead, via)
		}
		terr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			terr <- c.node(lead).r.TransferLeader(ctx, dead)
		}()
		// The leader's own write is dropped by raft, which Propose hears:
		// it must name the transfer (it said "too many uncommitted
		// proposals"). It also shows the transfer is under way.
		waitFor(t, 30*time.Second, "a write on the leader refused for the transfer", func() (bool, string) {
			_, err := c.propose(lead, fmt.Sprintf("probe-%d", id), 5*time.Second)
			return errors.Is(err, replica.ErrTransferInProgress), fmt.Sprint(err)
		})
		var te *replica.TransferError
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		err := c.node(via).r.AddMember(ctx, replica.Member{ID: id, PeerAddr: peerAddr(id)})
		took := time.Since(start)
		cancel()
		switch {
		case err == nil:
			t.Logf("attempt %d: the change through %d landed after the transfer; trying again", attempt, via)
		case errors.As(err, &te):
			if te.Leader != lead || te.Transferee != dead {
				t.Errorf("AddMember(%d) through %d: expected a transfer from %d to %d, got %+v", id, via, lead, dead, te)
			}
		default:
			t.Fatalf("AddMember(%d) through %d during a transfer from %d to stopped %d: expected ErrTransferInProgress (certainly not applied) or success, got %v after %s",
				id, via, lead, dead, err, took)
		}
		if err := <-terr; !errors.Is(err, replica.ErrTransferAbandoned) {
			t.Fatalf("TransferLeader(%d) on %d with %d stopped: expected ErrTransferAbandoned, got %v", dead, lead, dead, err)
		}
		if te == nil {
			continue
		}
		t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
		// The transfer was abandoned: the change, retried, is made.
		c.mustAddMember(via, id)
		waitFor(t, 30*time.Second, fmt.Sprintf("member %d listed on %d", id, via), func() (bool, string) {
			st := c.node(via).r.Status()
			for _, m := range st.Members {
				if m.ID == id {
					return true, ""
				}
			}
			return false, fmt.Sprint(st.Members)
		})
		break
	}
}

// A membership change asked of the leader itself during a transfer is
// refused at once, naming the transfer.
func TestMembershipChangeOnTheLeaderDuringATransfer(t *testing.T) {
	c := newCluster(t, 3, func(cfg *replica.Config) { cfg.ElectionTicks = 50 })
	lead := c.waitLeader()
	dead := uint64(1)
	if dead == lead {
		dead = 2
	}
	c.stop(dead)
	for attempt, id := 0, uint64(10); ; attempt, id = attempt+1, id+1 {
		if attempt == 10 {
			t.Fatalf("in %d transfers to stopped member %d, no membership change on the leader met one under way", attempt, dead)
		}
		terr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			terr <- c.node(lead).r.TransferLeader(ctx, dead)
		}()
		waitFor(t, 30*time.Second, "a write on the leader refused for the transfer", func() (bool, string) {
			_, err := c.propose(lead, fmt.Sprintf("probe-%d", id), 5*time.Second)
			return errors.Is(err, replica.ErrTransferInProgress), fmt.Sprint(err)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.node(lead).r.AddMember(ctx, replica.Member{ID: id, PeerAddr: peerAddr(id)})
		cancel()
		<-terr
		if err == nil {
			continue
		}
		if !errors.Is(err, replica.ErrTransferInProgress) {
			t.Fatalf("AddMember(%d) on leader %d during a transfer: expected ErrTransferInProgress, got %v", id, lead, err)
		}
		return
	}
}

// Regression: a follower repeats a transfer to a dead node. TransferLeader
// asked of a follower asks the leader again each election timeout (raft
// abandons a transfer silently), and the follower cannot hear the target:
// with the target stopped, every repeat had the leader drop every proposal
// for another election timeout, until the follower's deadline. The leader
// now ignores repeats for a member it has not heard from: once raft
// abandoned the first transfer, its writes are taken.
func TestRepeatedTransferToADeadNodeAskedOfAFollower(t *testing.T) {
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
	// Until the leader has found the stopped member silent, a repeat
	// could still be taken for a live target's.
	waitFor(t, 30*time.Second, fmt.Sprintf("leader %d to see stopped %d unreachable", lead, dead), func() (bool, string) {
		st := c.node(lead).r.Status()
		for _, m := range st.Members {
			if m.ID == dead {
				return !m.Reachable, fmt.Sprint(m)
			}
		}
		return false, fmt.Sprint(st.Members)
	})
	terr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		terr <- c.node(via).r.TransferLeader(ctx, dead)
	}()
	waitFor(t, 30*time.Second, "a write on the leader refused for the transfer", func() (bool, string) {
		_, err := c.propose(lead, "probe", 5*time.Second)
		return errors.Is(err, replica.ErrTransferInProgress), fmt.Sprint(err)
	})
	waitFor(t, 30*time.Second, "a write on the leader taken once raft abandoned the transfer", func() (bool, string) {
		_, err := c.propose(lead, "after", 5*time.Second)
		return err == nil, fmt.Sprint(err)
	})
	refused, taken := 0, 0
	for done := false; !done; {
		select {
		case err := <-terr:
			if err == nil {
				t.Fatalf("TransferLeader(%d) through %d succeeded with %d stopped", dead, via, dead)
			}
			done = true
		default:
			_, err := c.propose(lead, fmt.Sprintf("w%d", taken+refused), 5*time.Second)
			switch {
			case err == nil:
				taken++
			case errors.Is(err, replica.ErrTransferInProgress), errors.Is(err, replica.ErrOverloaded):
				// Dropped by raft (named overload when the transfer
				// ended before the drop was looked at).
				refused++
			default:
				t.Fatalf("write on leader %d: %v", lead, err)
			}
		}
	}
	if refused > 0 {
		t.Fatalf("after raft abandoned the transfer to stopped %d, the leader refused %d of %d writes for transfers %d asked for again", dead, refused, refused+taken, via)
	}
}
