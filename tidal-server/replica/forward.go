package replica

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// forwardQueue bounds the proposals forwarded by followers that wait for
// the forward loop; beyond it they are dropped, as raft drops proposals
// it cannot take.
const forwardQueue = 4096

// forwardedProposalWait bounds how long the forward loop keeps trying to
// get one forwarded proposal into raft. Its proposer, on another node,
// waits for it until its own deadline (--write-timeout); a proposal taken
// later is applied and its proposer has already answered "unknown", which
// is what unknown allows.
const forwardedProposalWait = 5 * time.Second

// confChangeStepWait bounds how long a forwarded configuration change
// waits for raft to take it (raft blocks it while it knows no leader).
const confChangeStepWait = 100 * time.Millisecond

// forwardLoop puts the proposals followers forwarded here into raft, in
// the order they arrived, off the transport's inbound goroutine.
//
// It used to be done inline with a 100 ms bound, and a proposal raft did
// not take within it — a leader starved of CPU, or one whose raft dropped
// it — was dropped without a word: raft does not tell the follower, whose
// proposer waited out its deadline and answered 504 for a write that was
// certainly never made (replica TestProposalsForwardedDuringATransferAreKept
// failed 8 in 25 runs under -race with the CPU saturated). Here each
// normal proposal is proposed locally, which says whether raft took it;
// one it dropped (a transfer of leadership under way, the uncommitted log
// full) is tried again until raft takes it, the replica stops, or
// forwardedProposalWait passes. A node that stopped leading meanwhile
// forwards it on to the leader it knows.
func (r *Replica) forwardLoop() {
	defer r.wg.Done()
	for {
		select {
		case m := <-r.forwardq:
			r.forward(m)
		case <-r.stopc:
			return
		}
	}
}

func (r *Replica) forward(m *raftpb.Message) {
	if !allNormal(m.GetEntries()) {
		// Configuration changes keep raft's own path, stepped as sent
		// (the marker entry and the change must stay one MsgProp, at
		// consecutive indexes: confchange.go) and as briefly as before.
		// Stepping says nothing of a drop, so the one drop raft makes
		// of a change on a leader that knows it has a quorum — a leader
		// transfer under way — is checked for first, and its proposer
		// told (dropped.go); raft stamps this node as the sender, so a
		// node that no longer leads forwards it on to the new leader
		// under its own identity.
		sctx, cancel := context.WithTimeout(r.haltCtx, confChangeStepWait)
		defer cancel()
		err := r.stepConfChange(sctx, m)
		var te *TransferError
		switch {
		case errors.As(err, &te):
			r.notifyDropped(m, dropTransfer, te.Transferee)
		case err != nil && r.haltCtx.Err() == nil:
			r.metrics.ProposalsDropped.Inc()
		}
		return
	}
	ctx, cancel := context.WithTimeout(r.haltCtx, forwardedProposalWait)
	defer cancel()
	for _, e := range m.GetEntries() {
		err := r.proposeForwarded(ctx, e.GetData())
		if err == nil || r.haltCtx.Err() != nil {
			continue
		}
		r.log.Debug("forwarded proposal dropped", "from", m.GetFrom(), "err", err)
		// Certainly not taken (raft said so, or no leader was known):
		// its proposer hears it now rather than answering 504 at its
		// deadline. A deadline met inside Propose is not certain, and
		// says nothing.
		one := &raftpb.Message{Entries: []*raftpb.Entry{e}}
		switch {
		case errors.Is(err, raft.ErrProposalDropped):
			if to := r.transferringTo(); to != raft.None {
				r.notifyDropped(one, dropTransfer, to)
			} else {
				r.notifyDropped(one, dropOverloaded, raft.None)
			}
		case errors.Is(err, ErrNoLeader):
			r.notifyDropped(one, dropNoLeader, raft.None)
		default:
			r.metrics.ProposalsDropped.Inc()
		}
	}
}

// proposeForwarded proposes data until raft takes it or ctx ends. A drop
// is certain (raft appended nothing), so trying again cannot apply it
// twice; a tick apart, as raft changes state only on ticks and messages.
// A deadline met inside Propose may have been met after raft took it: that
// is never tried again.
func (r *Replica) proposeForwarded(ctx context.Context, data []byte) error {
	t := time.NewTicker(r.cfg.TickInterval)
	defer t.Stop()
	for {
		// raft blocks a proposal while it knows no leader, and a deadline
		// met while blocked cannot be told from one met after raft took
		// it: wait for a leader here instead.
		var err error
		if r.leader.Load() == raft.None {
			err = ErrNoLeader
		} else if err = r.node.Propose(ctx, data); !errors.Is(err, raft.ErrProposalDropped) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-t.C:
		}
	}
}

func allNormal(ents []*raftpb.Entry) bool {
	for _, e := range ents {
		if e.GetType() != raftpb.EntryType_EntryNormal {
			return false
		}
	}
	return len(ents) > 0
}
