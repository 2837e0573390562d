package replica

// Leadership transfer: asked of any node, carried out by the leader, and
// abandoned (not re-asked) when the target has been silent for an
// election timeout, so a transfer to a dead member cannot block writes.

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TransferLeader asks the current leader to hand leadership to `to` and
// waits until `to` leads or ctx ends. On the leader, a transfer to a
// member it has not heard from for an election timeout ends, once raft
// abandoned it, with ErrTransferAbandoned.
func (r *Replica) TransferLeader(ctx context.Context, to uint64) error {
	if err := r.checkRunning(); err != nil {
		return err
	}
	r.mu.Lock()
	_, ok := r.members.Members[to]
	r.mu.Unlock()
	if !ok {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a member", to), NotFound: true}
	}
	lead := r.leader.Load()
	if lead == raft.None {
		return ErrNoLeader
	}
	if lead == to {
		return nil
	}
	if lead == r.cfg.ID {
		r.mu.Lock()
		r.transfers.Add(1)
		r.mu.Unlock()
		defer r.releaseHeld()
	}
	r.askTransfer(ctx, lead, to)
	// raft abandons a transfer the target did not complete within an
	// election timeout (a target still catching up on a busy leader), and
	// says nothing: ask again each election timeout, of whichever node
	// leads then, until leadership is where it was asked to go or ctx
	// ends. Asking while a transfer to the same node is under way is a
	// no-op in raft. A leader does not ask again for a target it has not
	// heard from for that election timeout (killed, cut off): every
	// proposal is dropped while a transfer is under way, so asking again
	// would keep the cluster refusing writes and membership changes for
	// the caller's whole deadline. It waits for raft to abandon the
	// transfer instead and says why. (A follower does not hear the
	// target, so it keeps asking.)
	again := r.electionTimeout()
	asked := time.Now()
	abandoning := false
	t := time.NewTicker(r.cfg.TickInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			now := r.leader.Load()
			if now == to {
				return nil
			}
			if abandoning {
				if r.transferringTo() == raft.None {
					return fmt.Errorf("%w: leadership did not move from %d to %d: raft abandoned the transfer after an election timeout (%s), and member %d had not been heard from for as long",
						ErrTransferAbandoned, lead, to, again, to)
				}
				continue
			}
			if now != raft.None && time.Since(asked) >= again {
				if now == r.cfg.ID && !r.heardWithin(to, uint64(r.cfg.ElectionTicks)) {
					abandoning = true
					continue
				}
				r.askTransfer(ctx, now, to)
				asked = time.Now()
			}
		case <-ctx.Done():
			return fmt.Errorf("leadership did not move from %d to %d: %w", lead, to, ctx.Err())
		case <-r.done:
			return r.stoppedErr()
		}
	}
}

// askTransfer asks raft to move leadership from lead to to, ordered with
// membership changes' transfer checks (transferGate).
func (r *Replica) askTransfer(ctx context.Context, lead, to uint64) {
	r.transferGate.Lock()
	defer r.transferGate.Unlock()
	if lead == r.cfg.ID {
		r.noteTransferAsk(to)
	}
	r.node.TransferLeadership(ctx, lead, to)
}

// noteTransferAsk records that this leader is asked to transfer
// leadership to `to`, and reports whether to ask raft: not when `to` has
// not been heard from for an election timeout and it was asked for within
// the last four (a follower repeating its request each election timeout;
// the margin covers a follower whose timer ran late).
// raft gives a transfer one election timeout and abandons it; asked
// again, it would drop every proposal for another, and a silent target
// will not take over. The first ask of a series always reaches raft (a
// member may have just restarted). Called under transferGate.
func (r *Replica) noteTransferAsk(to uint64) bool {
	now, window := r.heardAt.now.Load(), uint64(r.cfg.ElectionTicks)
	repeat := r.lastTransfer.to == to && now-r.lastTransfer.tick <= 4*window
	r.lastTransfer.to, r.lastTransfer.tick = to, now
	return !repeat || r.heardWithin(to, window)
}

// heardWithin reports whether this node received a message from id within
// the last window ticks.
func (r *Replica) heardWithin(id, window uint64) bool {
	at, ok := r.heardAt.lastHeard(id)
	return ok && r.heardAt.now.Load()-at <= window
}

// releaseHeld ends a transfer: once none is under way, the proposals held
// during them are stepped.
func (r *Replica) releaseHeld() {
	r.mu.Lock()
	var held []*raftpb.Message
	if r.transfers.Add(-1) == 0 {
		held, r.heldProps = r.heldProps, nil
	}
	r.mu.Unlock()
	for _, m := range held {
		r.stepForwarded(r.haltCtx, m)
	}
}
