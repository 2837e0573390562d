package runbook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// LossBound is the loss a page states it may cause, as the scenario
// measured it: the writes acknowledged before At at raft log indexes
// above Applied. For the quorum-loss page: Applied is the most advanced
// survivor's applied index once the quorum was gone (what a backup of it
// holds), At a moment after the quorum was lost and before the page ran
// (so before any new cluster acknowledged anything). Every other
// acknowledged write must still be there.
type LossBound struct {
	Applied uint64
	At      time.Time
	// Survivor names the slot whose applied index Applied is.
	Survivor string
	// Basis says what Applied is of the survivor: "" for its applied
	// index (a backup of it), "last log index" for a page that keeps its
	// whole log (recover --force-new-cluster).
	Basis string
}

// basis is Basis, defaulted.
func (b LossBound) basis() string {
	if b.Basis == "" {
		return "applied index"
	}
	return b.Basis
}

// LossDetails are the Details of the loss result.
type LossDetails struct {
	Applied uint64 `json:"applied"`
	At      int64  `json:"at"` // history time
	// Lost are the acknowledged writes within the bound: judged by the
	// ledger as certainly not applied (it says false if one is found).
	Lost int `json:"lost"`
	// Events counts their events (a write is a batch).
	Events int      `json:"events"`
	IDs    []string `json:"ids,omitempty"` // the first few
}

// applyStatedLoss rewrites the history for the ledger checker: every ok
// write acknowledged before the bound's time at a log index above its
// applied index becomes a fail (certainly not applied) with the reason.
// The ledger then judges those writes absent everywhere (one found is
// failed-but-applied: false) and every other write as usual (one lost is
// false). start is the history's wall-clock start.
func applyStatedLoss(ops []history.Op, b LossBound, start time.Time) ([]history.Op, checker.Result) {
	at := b.At.Sub(start).Nanoseconds()
	d := LossDetails{Applied: b.Applied, At: at}
	out := slices.Clone(ops)
	for i, op := range out {
		if op.Type != history.OK || op.F != history.FWrite || op.Process == history.Nemesis || op.Seq <= b.Applied || op.Time >= at {
			continue
		}
		out[i].Type = history.Fail
		out[i].Error = fmt.Sprintf("stated loss: acknowledged at log index %d, above the survivor's %s %d, before the quorum was lost", op.Seq, b.basis(), b.Applied)
		d.Lost++
		if v, err := history.Decode[history.WriteValue](op); err == nil {
			d.Events += len(v.Events)
			for _, e := range v.Events {
				if len(d.IDs) < 10 {
					d.IDs = append(d.IDs, e.ID)
				}
			}
		}
	}
	r := checker.Result{Name: "loss", Valid: checker.Valid, Details: d, Summary: fmt.Sprintf(
		"stated loss: %d acknowledged writes (%d events) at log indexes above %d (%s's %s) acknowledged before the quorum was lost at %s; the ledger judges them absent and every other write present",
		d.Lost, d.Events, b.Applied, b.Survivor, b.basis(), history.FormatTime(at))}
	if b.Applied == 0 {
		r.Valid, r.Summary = checker.Unknown, "the survivor's "+b.basis()+" was not measured: the loss cannot be bounded"
	}
	return out, r
}

// LoseQuorum loses two of three members for good while the third was cut
// off: a follower (the survivor) is frozen (SIGSTOP) while the workload
// goes on through the other two, which commit without it; once the leader
// has committed at least lossEntries more entries, both are killed
// (SIGKILL) and their data directories deleted, and the survivor is let
// go. It has no quorum and never will: writes stop. The scenario measures
// the survivor's applied index once it has settled (no leader, nothing
// more to apply): the bound of what the page may lose.
var LoseQuorum = Scenario{Name: "lose-quorum", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	return loseQuorum(ctx, c, leader, members, nil)
}}

// LoseQuorumKeepLog is LoseQuorum for a page that keeps the survivor's
// whole log (recover --force-new-cluster): the bound is the survivor's
// last log index, read from its WAL (read-only, as `wal verify` does)
// once it has settled, since it may hold entries it never learned were
// committed. Every acknowledged write at or below it must survive.
var LoseQuorumKeepLog = Scenario{Name: "lose-quorum-keep-log", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	return loseQuorum(ctx, c, leader, members, func(s Slot, applied uint64) (uint64, string, error) {
		rec, err := wal.Read(filepath.Join(s.DataDir, "wal"))
		if err != nil {
			return 0, "", fmt.Errorf("runbook: read the survivor's WAL: %w", err)
		}
		last := max(applied, rec.Snapshot.Index)
		if n := len(rec.Entries); n > 0 {
			last = max(last, rec.Entries[n-1].Index)
		}
		return last, "last log index", nil
	})
}}

// loseQuorum is the scenario of both; bound, when given, turns the
// survivor's settled applied index into the page's loss bound.
func loseQuorum(ctx context.Context, c *LocalCluster, leader string, members []string,
	bound func(s Slot, applied uint64) (uint64, string, error)) (Injected, error) {
	survivor, err := followerSlot(c, leader, members)
	if err != nil {
		return Injected{}, err
	}
	name := survivor.Name
	ls, err := c.Slot(leader)
	if err != nil {
		return Injected{}, err
	}
	lc := c.AdminClient(ls, client.WithRetries(0), client.WithTimeout(2*time.Second))
	defer lc.CloseIdleConnections()
	commitNow := func() uint64 {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if st, err := lc.Status(sctx); err == nil {
			return st.Commit
		}
		return 0
	}
	before := commitNow()
	if err := c.Pause(survivor); err != nil {
		return Injected{}, err
	}
	var commit uint64
	if err := waitFor(ctx, time.Minute, func() bool {
		commit = commitNow()
		return before > 0 && commit >= before+lossEntries
	}); err != nil {
		c.Resume(survivor)
		return Injected{}, fmt.Errorf("runbook: with %s frozen the leader %s committed %d → %d; expected %d more entries (is the workload writing?): %w",
			name, leader, before, commit, lossEntries, err)
	}
	for _, m := range members {
		if m == name {
			continue
		}
		s, err := c.Slot(m)
		if err != nil {
			return Injected{}, err
		}
		if err := c.Kill(ctx, s); err != nil {
			return Injected{}, err
		}
		if err := os.RemoveAll(s.DataDir); err != nil {
			return Injected{}, err
		}
	}
	if err := c.Resume(survivor); err != nil {
		return Injected{}, err
	}
	// The survivor settles: it answers, knows no leader, and applies
	// nothing more (it can learn no new commit index).
	sc := c.AdminClient(survivor, client.WithRetries(0), client.WithTimeout(2*time.Second))
	defer sc.CloseIdleConnections()
	var applied, last uint64
	stable := 0
	if err := waitFor(ctx, time.Minute, func() bool {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		st, err := sc.Status(sctx)
		if err != nil || st.Leader != 0 || st.Applied < st.Commit {
			stable = 0
			return false
		}
		if st.Applied == last {
			stable++
		} else {
			stable, last = 0, st.Applied
		}
		applied = st.Applied
		return stable >= 5
	}); err != nil {
		return Injected{}, fmt.Errorf("runbook: the survivor %s did not settle (leaderless, applied = commit, steady) within a minute (applied %d): %w", name, applied, err)
	}
	if applied >= commit {
		return Injected{}, fmt.Errorf("runbook: the survivor %s applied %d, the lost leader had committed %d: nothing would be lost, the scenario proves nothing", name, applied, commit)
	}
	loss := &LossBound{Applied: applied, Survivor: name}
	if bound != nil {
		var err error
		if loss.Applied, loss.Basis, err = bound(survivor, applied); err != nil {
			return Injected{}, err
		}
		if loss.Applied >= commit {
			return Injected{}, fmt.Errorf("runbook: the survivor %s's %s is %d, the lost leader had committed %d: nothing would be lost, the scenario proves nothing", name, loss.Basis, loss.Applied, commit)
		}
	}
	// Every write acknowledged so far came from the old cluster (no new
	// one exists before the page runs), including responses the clients
	// read after the kills: the bound's time is now, not the kills'.
	loss.At = time.Now()
	return Injected{Target: name, Loss: loss}, nil
}

// lossEntries is how many entries the two members that are lost commit
// without the survivor: writes acknowledged that only they had.
const lossEntries = 40
