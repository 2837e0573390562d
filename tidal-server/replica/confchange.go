package replica

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// AddMember proposes m as a learner; the leader promotes it to voter once
// it has caught up (PromoteWithin).
func (r *Replica) AddMember(ctx context.Context, m Member) error {
	r.mu.Lock()
	err := r.members.checkAdd(m.ID)
	r.mu.Unlock()
	if err != nil {
		return &MembershipError{Msg: err.Error()}
	}
	if m.PeerAddr == "" {
		return &MembershipError{Msg: "peer_addr is required"}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddLearnerNode, m)
}

// RemoveMember proposes removing id.
func (r *Replica) RemoveMember(ctx context.Context, id uint64) error {
	r.mu.Lock()
	_, ok := r.members.Members[id]
	r.mu.Unlock()
	if !ok {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a member", id), NotFound: true}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeRemoveNode, Member{ID: id})
}

// PublishMember records m's addresses in the replicated membership table
// for m.ID, an existing voter, the way etcd members publish their client
// URLs: nodes bootstrapped from --peers know only peer addresses. A
// ConfChangeAddNode for a voter changes no configuration; applying it
// stores the member its context carries. Learners are refused (the change
// would promote them).
func (r *Replica) PublishMember(ctx context.Context, m Member) error {
	r.mu.Lock()
	_, known := r.members.Members[m.ID]
	voter := slices.Contains(r.confState.GetVoters(), m.ID)
	r.mu.Unlock()
	if !known || !voter {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a voter; only voters publish their addresses", m.ID)}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddNode, m)
}

// MembershipError is a membership request that cannot be made as asked.
type MembershipError struct {
	Msg      string
	NotFound bool
}

func (e *MembershipError) Error() string { return e.Msg }

// proposeConfChange proposes one membership change and waits until this
// node has applied it.
//
// raft refuses a change proposed while another is not yet applied (which
// includes every change a new leader takes before it has applied its
// predecessor's log), and it does so silently: it logs an empty normal entry
// in the change's place. To tell that entry from any other, the change is
// proposed behind a marker entry carrying this node's request id, in one
// MsgProp; raft appends both at consecutive indexes of one term. An empty
// entry right after our marker is our change, dropped: the caller hears
// ErrConfChangeDropped at once (certainly not applied; 503) instead of
// waiting out its deadline for an outcome it would then call unknown.
func (r *Replica) proposeConfChange(ctx context.Context, typ raftpb.ConfChangeType, m Member) error {
	if err := r.checkRunning(); err != nil {
		return err
	}
	// As in Propose: raft would hold the proposal until the deadline.
	if r.leader.Load() == raft.None {
		return ErrNoLeader
	}
	// Without a quorum the change (or the empty entry raft logs in place
	// of one it drops) could not commit, and the caller would wait out its
	// deadline for a 504; refusing before proposing is certain.
	if r.leaderLacksQuorum() {
		return ErrNoQuorum
	}
	req, err := r.ids.next()
	if err != nil {
		return err
	}
	cctx, _ := json.Marshal(confContext{Member: m, Request: req, Origin: r.cfg.ID})
	cc, err := proto.Marshal(&raftpb.ConfChangeV2{
		Changes: []*raftpb.ConfChangeSingle{{Type: &typ, NodeId: proto.Uint64(m.ID)}},
		Context: cctx,
	})
	if err != nil {
		return fmt.Errorf("encode membership change: %w", err)
	}
	marker := make([]byte, envelopeHeader)
	marker[0] = confMarkerVersion
	binary.BigEndian.PutUint64(marker[1:], r.cfg.ID)
	binary.BigEndian.PutUint64(marker[9:], req)
	prop := &raftpb.Message{Type: raftpb.MsgProp.Enum(), Entries: []*raftpb.Entry{
		{Type: raftpb.EntryNormal.Enum(), Data: marker},
		{Type: raftpb.EntryConfChangeV2.Enum(), Data: cc},
	}}

	ch := make(chan Applied, 1)
	r.mu.Lock()
	r.proposals[req] = ch
	r.mu.Unlock()
	forget := func() {
		r.mu.Lock()
		delete(r.proposals, req)
		r.mu.Unlock()
	}
	// Step, as node.ProposeConfChange does: it returns once raft took the
	// message (a follower forwards it to the leader). It says nothing of
	// a drop, so a leader first checks for the one drop it can know of:
	// a leader transfer under way (raft takes no proposal then). The gate
	// keeps a transfer from starting between the check and the step; a
	// leader's Step returns at once, so the gate is held only briefly. A
	// follower's leader makes the same check and tells this node
	// (forward.go, dropped.go).
	if err := r.stepConfChange(ctx, prop); err != nil {
		forget()
		if errors.Is(err, ErrTransferInProgress) {
			r.metrics.ProposalsDropped.Inc()
			return err
		}
		return r.proposeErr(err)
	}
	select {
	case a := <-ch:
		if a.dropped != nil {
			return a.dropped
		}
		if err, _ := a.Result.(error); err != nil {
			return err
		}
		return nil
	case <-ctx.Done():
		forget()
		r.metrics.ProposalsTimedOut.Inc()
		return ErrUnknownOutcome
	case <-r.done:
		forget()
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, r.stoppedErr())
	}
}

// stepConfChange steps a membership change's MsgProp, refusing it with a
// *TransferError while this node leads and transfers leadership.
func (r *Replica) stepConfChange(ctx context.Context, prop *raftpb.Message) error {
	if r.leader.Load() != r.cfg.ID {
		return r.node.Step(ctx, prop)
	}
	r.transferGate.Lock()
	defer r.transferGate.Unlock()
	if to := r.transferringTo(); to != raft.None {
		return r.transferError(to)
	}
	// A leader's raft takes a proposal at once; it blocks one only while
	// it knows no leader (this node lost leadership just now). Bounded,
	// so the gate never holds up a peer's stream (Receive) for long.
	sctx, cancel := context.WithTimeout(ctx, confChangeStepWait)
	defer cancel()
	return r.node.Step(sctx, prop)
}

// promoteLoop runs learner promotion rounds off the Ready loop: a round
// proposes changes and waits for their outcome.
func (r *Replica) promoteLoop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.promoteKick:
			r.maybePromoteLearners()
		case <-r.stopc:
			return
		}
	}
}

const (
	// promoteRetry spaces promotions of one learner whose outcome is not
	// known to have failed.
	promoteRetry = 5 * time.Second
	// promoteWait bounds the wait for one promotion's outcome.
	promoteWait = 5 * time.Second
)

// maybePromoteLearners runs on the leader: a learner whose match index is
// close enough to commit is proposed as a voter. Promoting earlier would
// let a slow newcomer count towards quorums it cannot yet serve.
func (r *Replica) maybePromoteLearners() {
	if r.leader.Load() != r.cfg.ID {
		return
	}
	defer r.promotionRounds.Add(1)
	st := r.node.Status()
	commit := st.HardState.GetCommit()
	for id, pr := range st.Progress {
		if !pr.IsLearner {
			continue
		}
		if pr.Match == 0 || pr.Match+r.cfg.PromoteWithin < commit { // Match 0: it has never acknowledged anything
			continue
		}
		r.mu.Lock()
		if t, ok := r.promoting[id]; ok && wallClock().Sub(t) < promoteRetry {
			r.mu.Unlock()
			continue
		}
		r.promoting[id] = wallClock()
		m, ok := r.members.Members[id]
		r.mu.Unlock()
		if !ok {
			continue
		}
		r.log.Info("promoting learner to voter", "id", id, "match", pr.Match, "commit", commit)
		if r.cfg.beforePromote != nil {
			r.cfg.beforePromote(id)
		}
		ctx, cancel := context.WithTimeout(r.haltCtx, promoteWait)
		err := r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddNode, m)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrConfChangeDropped), errors.Is(err, ErrNoLeader), errors.Is(err, ErrNoQuorum), errors.Is(err, ErrOverloaded),
			errors.Is(err, ErrTransferInProgress):
			// Certainly not made: the next round tries again.
			r.mu.Lock()
			delete(r.promoting, id)
			r.mu.Unlock()
			r.log.Info("learner promotion not made; retrying next round", "id", id, "err", err)
		default:
			r.log.Warn("promote learner", "id", id, "err", err)
		}
	}
}

// decodeConfChange reads a committed conf change entry of either version
// as a ConfChangeV2.
func decodeConfChange(e *raftpb.Entry) (*raftpb.ConfChangeV2, error) {
	if e.GetType() == raftpb.EntryConfChange {
		v1 := &raftpb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			return nil, fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
		}
		return v1.AsV2(), nil
	}
	cc := &raftpb.ConfChangeV2{}
	if err := proto.Unmarshal(e.GetData(), cc); err != nil {
		return nil, fmt.Errorf("decode conf change v2 at index %d: %w", e.GetIndex(), err)
	}
	return cc, nil
}
