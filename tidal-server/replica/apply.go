package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Proposal payloads are framed as
//
//	u8 version(1) | u64 origin node | u64 request id | application data
//
// so that only the proposer's own entry can wake its waiter.
//
// A membership change is proposed behind a marker entry framed the same way
// with version 2 and no data (see proposeConfChange).
const (
	envelopeVersion   = 1
	confMarkerVersion = 2
	envelopeHeader    = 1 + 8 + 8
)

// pendingApp is an application entry whose apply is deferred to the end
// of its run of consecutive application entries (see applyRun).
type pendingApp struct {
	AppEntry
	origin, request uint64
}

func (r *Replica) apply(ents []*raftpb.Entry) error {
	run := r.runScratch[:0]
	defer func() { r.runScratch = run[:0] }()
	applied := r.appliedIndex()
	for _, e := range ents {
		idx := e.GetIndex()
		if idx <= applied {
			continue
		}
		// Consecutive application entries gather into one run, applied
		// together; anything else ends the run first.
		var f frame
		if e.GetType() == raftpb.EntryNormal {
			if r.confMarker.index == 0 {
				if f = decodeFrame(run, idx, e.GetTerm(), e.GetData()); f.kind == frameProposals {
					run = f.run
					continue
				}
			} else {
				// Right after a conf change marker: decoded apart from the
				// run, which is applied on its own first.
				f = decodeFrame(nil, idx, e.GetTerm(), e.GetData())
			}
		}
		if err := r.applyRun(run); err != nil {
			return err
		}
		run = run[:0]
		// The entry right after a conf change marker is that change, or
		// the empty entry raft put in its place.
		marker := r.confMarker
		r.confMarker = confMarker{}
		switch e.GetType() {
		case raftpb.EntryNormal:
			switch f.kind {
			case frameNothing:
				r.sm.SetApplied(idx)
				if marker.droppedAt(e) && marker.origin == r.cfg.ID {
					r.wake(marker.request, Applied{Index: idx, Term: e.GetTerm(), Result: ErrConfChangeDropped})
				}
			case frameConfMarker:
				r.confMarker = f.marker
				r.sm.SetApplied(idx)
			case frameUnknown:
				// An entry format this build does not read (format.go):
				// skipping it would make this replica diverge from the
				// nodes that applied it.
				return &EntryFormatError{Index: idx, Term: e.GetTerm(), Envelope: e.GetData()[0]}
			case frameMalformed:
				// Cannot happen for entries a node framed (the log is
				// checksummed); refusing to apply would wedge the node, so
				// it is skipped on every node alike.
				r.log.Error("skipping entry with malformed framing", "index", idx, "len", len(e.GetData()), "err", f.err)
				r.sm.SetApplied(idx)
			case frameProposals:
				// Proposals right after a conf change marker (never, in
				// practice: see droppedAt) are applied alone, after the
				// marker is consumed as above.
				if err := r.applyRun(f.run); err != nil {
					return err
				}
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			if err := r.applyConfChange(e); err != nil {
				return err
			}
			r.sm.SetApplied(idx)
		}
		r.setApplied(idx, e.GetTerm())
	}
	return r.applyRun(run)
}

// applyRun applies a run of consecutive application entries: in one call
// when the state machine takes batches, then wakes this node's proposers
// and publishes the applied index once for the run.
func (r *Replica) applyRun(run []pendingApp) error {
	if len(run) == 0 {
		return nil
	}
	var results []any
	bsm, batches := r.sm.(BatchStateMachine)
	if !batches && run[len(run)-1].Subs > 1 || run[0].Sub > 0 {
		return fmt.Errorf("replica: entry %d packs %d proposals, and this state machine cannot apply packed entries (no ApplyBatch)", run[len(run)-1].Index, run[len(run)-1].Subs)
	}
	if batches && len(run) > 1 {
		ents := r.appScratch[:0]
		for i := range run {
			ents = append(ents, run[i].AppEntry)
		}
		results = bsm.ApplyBatch(ents)
		clear(ents)
		r.appScratch = ents[:0]
		if len(results) != len(run) {
			panic(fmt.Sprintf("replica: ApplyBatch returned %d results for %d entries", len(results), len(run)))
		}
	} else {
		results = make([]any, len(run))
		for i := range run {
			results[i] = r.sm.Apply(run[i].Index, run[i].Term, run[i].Data)
		}
	}
	// Wake this node's proposers: their channels are looked up under one
	// lock for the run, and sent to (buffered, one each) outside it.
	type waiter struct {
		ch chan Applied
		a  Applied
	}
	var waiters []waiter
	r.mu.Lock()
	for i := range run {
		if run[i].origin != r.cfg.ID {
			continue
		}
		if ch, ok := r.proposals[run[i].request]; ok {
			delete(r.proposals, run[i].request)
			waiters = append(waiters, waiter{ch, Applied{Index: run[i].Index, Term: run[i].Term, Result: results[i]}})
		}
	}
	r.mu.Unlock()
	for _, w := range waiters {
		w.ch <- w.a
	}
	last := run[len(run)-1]
	r.setApplied(last.Index, last.Term)
	clear(run)
	return nil
}

// wake hands a to the waiter of request req on this node, if any.
func (r *Replica) wake(req uint64, a Applied) {
	r.mu.Lock()
	ch, ok := r.proposals[req]
	delete(r.proposals, req)
	r.mu.Unlock()
	if ok {
		ch <- a
	}
}

// confMarker is the last applied entry when it was a conf change marker
// (see proposeConfChange); the apply goroutine owns it.
type confMarker struct {
	index, term     uint64
	origin, request uint64
}

// droppedAt reports whether e, an empty normal entry, is what raft left in
// place of the change proposed behind this marker. raft appends the marker
// and the change of one proposal together, at consecutive indexes of one
// term, and replaces a change it refuses by an empty normal entry; a new
// leader's own empty entry (at the start of its term) has another term.
func (m confMarker) droppedAt(e *raftpb.Entry) bool {
	return m.index != 0 && e.GetIndex() == m.index+1 && e.GetTerm() == m.term
}

func (r *Replica) applyConfChange(e *raftpb.Entry) error {
	cc, err := decodeConfChange(e)
	if err != nil {
		return err
	}
	var cctx confContext
	if len(cc.GetContext()) > 0 {
		if err := json.Unmarshal(cc.GetContext(), &cctx); err != nil {
			r.log.Error("conf change context is not JSON", "index", e.GetIndex(), "err", err)
		}
	}

	r.mu.Lock()
	// A change the membership table refuses is applied with its NodeId
	// zeroed, raft's own convention for "decided downstream not to apply
	// this": confchange.Changer skips such changes. Deterministic on every
	// node, since the table is replicated state. (Replacing the whole change
	// by an empty ConfChangeV2 — what this did before — means "leave the
	// joint config" to raft, which panics outside one; the entry stays in
	// the log, so every node panicked at that index on every restart.)
	var refused []string
	for _, ch := range cc.GetChanges() {
		if why := r.members.refuse(ch.GetType(), ch.GetNodeId()); why != "" {
			refused = append(refused, why)
			ch.NodeId = proto.Uint64(raft.None)
		}
	}
	var applyErr error
	if len(refused) > 0 {
		applyErr = &MembershipError{Msg: strings.Join(refused, "; ") + " (the change reached the log and was applied as a no-op)"}
		r.log.Warn("membership change refused at apply", "index", e.GetIndex(), "why", strings.Join(refused, "; "))
	}
	for _, ch := range cc.GetChanges() {
		id := ch.GetNodeId()
		if id == raft.None {
			continue
		}
		switch ch.GetType() {
		case raftpb.ConfChangeType_ConfChangeAddNode, raftpb.ConfChangeType_ConfChangeAddLearnerNode:
			m, known := r.members.Members[id]
			if cctx.Member.ID == id {
				m = cctx.Member
			} else if !known {
				m = Member{ID: id}
			}
			r.members.Members[id] = m
			r.setPeer(id, m.PeerAddr)
			if ch.GetType() == raftpb.ConfChangeType_ConfChangeAddNode {
				delete(r.promoting, id)
			}
			if !known && r.snapIndex.Load() > 0 {
				// A newcomer catches up from a snapshot if the log it
				// needs is compacted, and raft makes it refuse a snapshot
				// whose ConfState does not list it ("should never
				// happen"): the older snapshot would be sent forever.
				// Snapshot again once this change is applied. (Without a
				// snapshot yet, the log from index 1 is all still there.)
				r.snapForMember.Store(true)
			}
		case raftpb.ConfChangeType_ConfChangeRemoveNode:
			delete(r.members.Members, id)
			r.members.Removed[id] = true
			if id == r.cfg.ID {
				r.removed = true
			} else if r.cfg.Transport != nil {
				r.cfg.Transport.RemovePeer(id)
			}
		}
	}
	joint := len(r.confState.GetVotersOutgoing()) > 0
	cs := r.confState
	r.mu.Unlock()

	if len(cc.GetChanges()) == 0 && !joint {
		// An empty ConfChangeV2 means "leave the joint config", and raft
		// panics when there is none to leave. raft's proposal validation
		// keeps such an entry out of the log (it logs an empty normal
		// entry instead), and this package never enters a joint config;
		// should a log hold one anyway, the node applies it as the no-op it
		// is rather than panicking at the same index on every restart.
		// (Logs of builds that blanked refused changes hold the original
		// change, which refuse() above now zeroes.)
		r.log.Warn("skipping an empty membership change outside a joint config", "index", e.GetIndex())
	} else {
		cs = r.node.ApplyConfChange(cc)
	}
	r.mu.Lock()
	r.confState = cs
	r.mu.Unlock()
	if cctx.Origin == r.cfg.ID && cctx.Request != 0 {
		r.wake(cctx.Request, Applied{Index: e.GetIndex(), Term: e.GetTerm(), Result: applyErr})
	}
	r.log.Info("applied membership change", "index", e.GetIndex(), "changes", raftpb.ConfChangesToString(cc.GetChanges()),
		"voters", cs.GetVoters(), "learners", cs.GetLearners())
	return nil
}

func (r *Replica) setApplied(index, term uint64) {
	r.appliedMu.Lock()
	r.applied = index
	r.appliedTerm = term
	kept := r.appliedWaiters[:0]
	for _, w := range r.appliedWaiters {
		if w.index <= index {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	r.appliedWaiters = kept
	r.appliedMu.Unlock()
}

func (r *Replica) appliedIndex() uint64 {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	return r.applied
}

// waitApplied returns once the local state machine has applied index.
func (r *Replica) waitApplied(ctx context.Context, index uint64) error {
	r.appliedMu.Lock()
	if r.applied >= index {
		r.appliedMu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	r.appliedWaiters = append(r.appliedWaiters, appliedWaiter{index: index, ch: ch})
	r.appliedMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return r.stoppedErr()
	}
}
