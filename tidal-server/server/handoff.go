package server

import (
	"context"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// handOffLeadership runs first in Shutdown. A leader that simply stopped
// would take its uncommitted entries and the proposals forwarded to it
// down with it: every write in flight through it would end as 504 (outcome
// unknown), and the cluster would wait out an election timeout. So a
// leader first moves leadership to its most caught-up voter; then it waits
// until the new leader has committed an entry of its term and the other
// members have stopped sending here (awaitOthersFollow), while this node —
// now a follower, still running raft — forwards whatever is sent to it.
// Each step is bounded by handOffBudget. If the hand-off fails the node
// drains as leader, as before, and says so.
func (s *Server) handOffLeadership(ctx context.Context) {
	if s.replica.Err() != nil {
		return
	}
	if s.replica.Status().Role != "leader" {
		return
	}
	budget := s.handOffBudget(ctx)
	tctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	start := time.Now()
	st, to, match, ok := awaitHandOffTarget(tctx, s.replica.Status, s.cfg.TickInterval)
	if !ok {
		if st.Role == "leader" && len(st.Members) > 1 {
			s.log.Warn("leader draining without a hand-off: no reachable voter to hand leadership to", "members", len(st.Members), "waited", time.Since(start).Round(time.Millisecond))
		}
		return
	}
	s.log.Info("leader draining: handing leadership off first", "to", to, "match", match, "commit", st.Commit, "timeout", budget)
	if err := s.replica.TransferLeader(tctx, to); err != nil {
		s.log.Warn("leadership hand-off failed; draining as leader", "to", to, "err", err)
		return
	}
	s.log.Info("leadership handed off", "to", to, "took", time.Since(start).Round(time.Millisecond))
	// A ReadIndex succeeds once the new leader has committed an entry in
	// its term, i.e. once a quorum has heard from it.
	if _, err := s.replica.ReadIndex(tctx); err != nil {
		s.log.Warn("new leader has not committed in its term yet; draining anyway", "leader", to, "err", err)
		return
	}
	fctx, cancel := context.WithTimeout(ctx, s.handOffBudget(ctx))
	defer cancel()
	s.awaitOthersFollow(fctx, to)
}

// handOffBudget bounds each step of a hand-off: two election timeouts
// (raft abandons a transfer after one), at most half of what is left of
// the drain budget.
func (s *Server) handOffBudget(ctx context.Context) time.Duration {
	budget := 2 * time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval
	if deadline, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(deadline)/2)
	}
	return budget
}

// awaitOthersFollow keeps raft running after a hand-off until the other
// members have stopped sending here. That quorum may have been the new
// leader and this node: a third member learns of the new leader from its
// first append, which a sender still in reconnect backoff (after a
// restart) can delay by up to a second, and until then it forwards its
// proposals to this node — which forwards them on while raft runs, and
// loses them once it stops. So wait for a quiet interval (two heartbeats)
// without a message from any member but the new leader: under load a
// member still forwarding here sends far more often than that, and an
// idle one has nothing in flight.
func (s *Server) awaitOthersFollow(ctx context.Context, leader uint64) {
	quiet := max(2*time.Duration(s.cfg.HeartbeatTicks)*s.cfg.TickInterval, 20*time.Millisecond)
	s.inbound.lastOther.Store(time.Now().UnixNano())
	s.inbound.watchExcept.Store(leader)
	defer s.inbound.watchExcept.Store(0)
	t := time.NewTicker(quiet / 4)
	defer t.Stop()
	for time.Since(time.Unix(0, s.inbound.lastOther.Load())) < quiet {
		select {
		case <-ctx.Done():
			s.log.Warn("members still send to this node after the hand-off; draining anyway", "leader", leader)
			return
		case <-t.C:
		}
	}
}

// awaitHandOffTarget waits, until ctx ends, for a voter to hand
// leadership to, polling status every poll; it returns the last status
// seen and the target, or !ok when this node stopped leading or is the
// only member. A voter can look unreachable for a moment while it is
// not: raft's check-quorum clears every follower's RecentActive once per
// election timeout, and a new leader starts with them all clear; each is
// set again by the follower's next response, a heartbeat later. A
// SIGTERM landing in that window found "no reachable voter", drained as
// leader, and its writes in flight ended 504 (seen in the lifecycle
// suite's rolling restart). A voter that is really down stays
// unreachable, and the wait ends with ctx.
func awaitHandOffTarget(ctx context.Context, status func() replica.Status, poll time.Duration) (st replica.Status, id, match uint64, ok bool) {
	t := time.NewTicker(max(poll, time.Millisecond))
	defer t.Stop()
	for {
		st = status()
		if st.Role != "leader" || len(st.Members) <= 1 {
			return st, 0, 0, false
		}
		if id, match, ok = handOffTarget(st); ok {
			return st, id, match, true
		}
		select {
		case <-ctx.Done():
			return st, 0, 0, false
		case <-t.C:
		}
	}
}

// handOffTarget picks the voter (not a learner, not this node) that is
// reachable and has the highest match index: the one that can take over
// soonest, since raft sends it TimeoutNow only once it is caught up.
func handOffTarget(st replica.Status) (id, match uint64, ok bool) {
	for _, m := range st.Members {
		if m.ID == st.ID || m.Role == "learner" || !m.Reachable {
			continue
		}
		if !ok || m.Match > match || (m.Match == match && m.ID < id) {
			id, match, ok = m.ID, m.Match, true
		}
	}
	return id, match, ok
}
