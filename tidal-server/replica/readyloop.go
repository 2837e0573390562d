package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// pipelineDepth bounds the queues from the Ready loop to the sync and
// apply goroutines. A full queue blocks the Ready loop, and with it
// heartbeats, so it is sized to be rarely reached: raft already bounds what
// is in flight to apply (MaxCommittedSizePerReady bytes of entries until
// their MsgStorageApplyResp is stepped), and what is staged but not yet
// synced by the uncommitted-log limit on a leader and by the leader's
// replication window (MaxInflightMsgs) on a follower.
const pipelineDepth = 4096

// run is the Ready loop. It persists and applies nothing itself: it sends
// peer messages at once and hands raft's local storage messages, in order,
// to the append and apply goroutines.
func (r *Replica) run() {
	defer r.wg.Done()
	ticker := time.NewTicker(r.cfg.TickInterval)
	defer ticker.Stop()
	ticks := 0
	for {
		select {
		case <-ticker.C:
			r.node.Tick()
			r.heardAt.tick()
			ticks++
			if ticks%5 == 0 {
				select {
				case r.promoteKick <- struct{}{}:
				default: // a round is still running
				}
				r.updateMetrics()
			}
		case rd := <-r.node.Ready():
			r.readies.Add(1)
			if !r.route(rd) {
				return
			}
		case <-r.stopc:
			return
		}
	}
}

// route dispatches one Ready. With AsyncStorageWrites every message in it
// may go out now: those that depend on a local write are not in it but in
// that write's MsgStorageAppend.Responses.
func (r *Replica) route(rd raft.Ready) bool {
	if rd.SoftState != nil {
		prev := r.leader.Swap(rd.SoftState.Lead)
		r.role.Store(rd.SoftState.RaftState)
		if prev != rd.SoftState.Lead {
			r.metrics.LeaderChanges.Inc()
			r.log.Info("leader changed", "from", prev, "to", rd.SoftState.Lead, "role", rd.SoftState.RaftState.String())
		}
	}
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		r.term.Store(rd.HardState.GetTerm())
		r.commit.Store(rd.HardState.GetCommit())
	}
	var peers []*raftpb.Message
	var local []*raftpb.Message
	for _, m := range rd.Messages {
		switch m.GetTo() {
		case raft.LocalAppendThread, raft.LocalApplyThread:
			local = append(local, m)
		default:
			peers = append(peers, m)
		}
	}
	// Peers first: a follower's fsync then overlaps the leader's.
	r.send(peers)
	for _, m := range local {
		if m.GetTo() == raft.LocalAppendThread {
			if r.laneBusy.Load() > 0 || !raft.IsEmptySnap(m.GetSnapshot()) {
				// Writing a received snapshot's file (it may be large,
				// the disk slow) goes to the lane, and every append after
				// it follows it there until the lane is empty: the WAL
				// must name the snapshot before any entry above it. This
				// loop goes on ticking and sending meanwhile.
				r.laneBusy.Add(1)
				select {
				case r.laneq <- m:
				case <-r.stopc:
					return false
				}
				continue
			}
			// Staging only encodes and queues (the WAL's writer does the
			// I/O), so it stays on this goroutine: one hand-off fewer on
			// every write's path than a separate append goroutine.
			it, err := r.stageAppend(m, &r.prevHS)
			if err != nil {
				r.halt(err)
				return false
			}
			select {
			case r.syncq <- it:
			case <-r.stopc:
				return false
			}
			continue
		}
		select {
		case r.applyq <- applyItem{ents: m.GetEntries(), resps: m.GetResponses()}:
		case <-r.stopc:
			return false
		}
	}
	for _, rs := range rd.ReadStates {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		id := binary.BigEndian.Uint64(rs.RequestCtx)
		r.mu.Lock()
		ch, ok := r.reads[id]
		delete(r.reads, id)
		r.mu.Unlock()
		if ok {
			ch <- rs.Index
		}
	}
	return true
}

// stageAppend stages one MsgStorageAppend in the WAL without waiting for
// its fsync, and updates raft's in-memory log. Staging in order is all the
// WAL needs to write in order; the waiting happens in syncLoop, so the next
// batch is staged (and shares the next fsync) while this one syncs.
func (r *Replica) stageAppend(m *raftpb.Message, prev *wal.HardState) (syncItem, error) {
	it := syncItem{resps: m.GetResponses(), entries: len(m.GetEntries()), staged: time.Now()}
	var batch wal.Batch
	snap := m.GetSnapshot()
	hasSnap := snap != nil && !raft.IsEmptySnap(snap)
	if hasSnap {
		// Held until the mark is staged: the snapshot goroutine must not
		// slip an older mark in between.
		r.snapMu.Lock()
		defer r.snapMu.Unlock()
		if r.cfg.beforeSnapshotWrite != nil {
			r.cfg.beforeSnapshotWrite(snap.GetMetadata().GetIndex())
		}
		if err := r.snaps.save(snap); err != nil {
			return it, fmt.Errorf("save received snapshot: %w", err)
		}
		md := snap.GetMetadata()
		batch.Snapshot = &wal.SnapshotMark{Index: md.GetIndex(), Term: md.GetTerm()}
		it.snap = snap
	}
	// raft sets the HardState fields of a MsgStorageAppend only when the
	// HardState changed.
	var hs *raftpb.HardState
	if m.Term != nil || m.Vote != nil || m.Commit != nil {
		hs = &raftpb.HardState{Term: proto.Uint64(m.GetTerm()), Vote: proto.Uint64(m.GetVote()), Commit: proto.Uint64(m.GetCommit())}
		batch.HardState = &wal.HardState{Term: m.GetTerm(), Vote: m.GetVote(), Commit: m.GetCommit()}
	}
	if ents := m.GetEntries(); len(ents) > 0 {
		batch.Entries = make([]wal.Entry, len(ents))
		for i, e := range ents {
			batch.Entries[i] = toWALEntry(e)
		}
	}
	// raft.MustSync's rule: entries, term and vote must be durable before
	// anything that depends on them is sent; a commit index alone need not.
	mustSync := len(batch.Entries) > 0 || hasSnap ||
		(batch.HardState != nil && (batch.HardState.Term != prev.Term || batch.HardState.Vote != prev.Vote))
	if bugs.Active(bugs.VoteBeforeSync) && len(batch.Entries) == 0 && !hasSnap && mustSync {
		// Planted defect: a term/vote change is written without a sync,
		// and the votes it grants go out before it is even written.
		mustSync = false
		var early []*raftpb.Message
		it.resps = slices.DeleteFunc(slices.Clone(it.resps), func(m *raftpb.Message) bool {
			if m.GetType() == raftpb.MessageType_MsgVoteResp && m.GetTo() != r.cfg.ID {
				early = append(early, m)
				return true
			}
			return false
		})
		r.send(early)
	}
	if batch.HardState != nil {
		*prev = *batch.HardState
	}
	if batch.HardState != nil || batch.Snapshot != nil || len(batch.Entries) > 0 {
		p, err := r.wal.Stage(batch, mustSync)
		if err != nil {
			return it, fmt.Errorf("persist ready (%d entries): %w", len(batch.Entries), err)
		}
		it.pending = p
	}

	// raft's view of the log. It may run ahead of the disk: raft reads
	// back only what it already holds, and counts nothing durable before
	// the responses below are stepped.
	if hasSnap {
		if err := r.storage.ApplySnapshot(snap); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
			return it, fmt.Errorf("apply snapshot to raft storage: %w", err)
		} else if err == nil {
			r.snapHeld.Store(int64(len(snap.GetData()))) // ApplySnapshot keeps a clone: exactly the length
		}
		r.snapIndex.Store(snap.GetMetadata().GetIndex())
	}
	if hs != nil {
		if err := r.storage.SetHardState(hs); err != nil {
			return it, err
		}
	}
	if ents := m.GetEntries(); len(ents) > 0 {
		if err := r.storage.Append(ents); err != nil {
			return it, fmt.Errorf("append to raft storage: %w", err)
		}
	}
	return it, nil
}

// laneLoop stages the appends the Ready loop hands it — one carrying a
// received snapshot, whose file it writes first, and those behind it —
// in order, then queues them for the sync goroutine exactly as the Ready
// loop would. laneBusy falls only once an item is queued, so when the Ready
// loop sees it at zero, everything handed over is already in syncq and it
// may stage inline again (the atomic orders prevHS between the two).
func (r *Replica) laneLoop() {
	defer r.wg.Done()
	for {
		select {
		case m := <-r.laneq:
			it, err := r.stageAppend(m, &r.prevHS)
			if err != nil {
				r.halt(err)
				return
			}
			select {
			case r.syncq <- it:
			case <-r.stopc:
				return
			}
			r.laneBusy.Add(-1)
		case <-r.stopc:
			return
		}
	}
}

// syncLoop waits for each staged batch in order and only then releases what
// depended on it: the acknowledgements to the leader (or, on the leader,
// its own vote towards commit) and raft's notice that the entries are
// stable. A failed write fences the replica.
func (r *Replica) syncLoop() {
	defer r.wg.Done()
	for {
		var it syncItem
		select {
		case it = <-r.syncq:
		case <-r.stopc:
			return
		}
		if it.pending != nil {
			if err := it.pending.Wait(r.haltCtx); err != nil {
				if r.haltCtx.Err() == nil {
					r.halt(fmt.Errorf("persist ready (%d entries): %w", it.entries, err))
				}
				return
			}
			r.metrics.PersistSeconds.Observe(time.Since(it.staged).Seconds())
		}
		if it.snap != nil {
			// The state machine takes the snapshot in apply order: every
			// entry raft committed before it is already queued, and none
			// after it can be until the responses below are stepped.
			select {
			case r.applyq <- applyItem{snap: it.snap}:
			case <-r.stopc:
				return
			}
		}
		if !r.deliver(it.resps) {
			return
		}
	}
}

// deliver sends the responses addressed to peers and then steps those
// addressed to this node back into raft. Peers first: on a follower the
// acknowledgement of a durable append (MsgAppResp) is what the leader
// waits for to commit, and stepping first would put a rendezvous with
// raft's goroutine in front of it. Both only ever go out after
// the write they acknowledge is durable, so their order does not matter
// to raft.
func (r *Replica) deliver(resps []*raftpb.Message) bool {
	var peers []*raftpb.Message
	for _, m := range resps {
		if m.GetTo() != r.cfg.ID {
			peers = append(peers, m)
		}
	}
	r.send(peers)
	for _, m := range resps {
		if m.GetTo() != r.cfg.ID {
			continue
		}
		if err := r.node.Step(r.haltCtx, m); err != nil {
			return false
		}
	}
	return true
}

// applyLoop applies committed entries in log order, installs received
// snapshots in that same order, and encodes snapshots — all off the Ready
// loop and off the WAL's path, so a slow apply or a large snapshot never
// holds up persistence: the snapshot goroutine writes periodic snapshots,
// the lane writes received ones (laneLoop), and the Ready loop only ever
// stages (and can wait for neither).
func (r *Replica) applyLoop() {
	defer r.wg.Done()
	for {
		select {
		case it := <-r.applyq:
			if it.snap != nil {
				r.confMarker = confMarker{} // the log it was followed by is gone
				if err := r.restoreSnapshot(it.snap); err != nil {
					r.halt(err)
					return
				}
				r.log.Info("installed snapshot from leader", "index", it.snap.GetMetadata().GetIndex())
				continue
			}
			if len(it.ents) > 0 {
				start := time.Now()
				if err := r.apply(it.ents); err != nil {
					r.halt(err)
					return
				}
				r.metrics.ApplySeconds.Observe(time.Since(start).Seconds())
				r.metrics.ApplyBatch.Observe(float64(len(it.ents)))
			}
			if r.isRemoved() {
				r.log.Warn("this node was removed from the cluster; stopping raft")
				r.halt(nil)
				return
			}
			if !r.deliver(it.resps) {
				return
			}
			due := r.appliedIndex() >= nextSnapshotAt(r.cfg.ID, r.snapIndex.Load(), r.cfg.SnapshotEvery, r.cfg.StaggerSnapshots) || r.snapForMember.Load()
			if due && !r.snapBusy.Load() {
				r.snapForMember.Store(false)
				if !r.startSnapshot(nil) {
					return
				}
			}
		case req := <-r.snapshotReq:
			if !r.startSnapshot(req) {
				return
			}
		case <-r.stopc:
			return
		}
	}
}

func (r *Replica) send(msgs []*raftpb.Message) {
	if len(msgs) == 0 || r.cfg.Transport == nil {
		return
	}
	out := make([]Outbound, 0, len(msgs))
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			// Marshalling a snapshot copies all its data (131 MB for
			// 20,000 vectors of 1536): never on the Ready loop, whose
			// ticks and heartbeats would wait for it. The
			// transport streams it on its own connection, so it never
			// was ordered with the messages around it.
			r.snapSends.Add(1)
			go func() {
				defer r.snapSends.Done()
				r.sendSnapshot(m)
			}()
			continue
		}
		data, err := proto.Marshal(m)
		if err != nil {
			r.log.Error("marshal raft message", "type", m.GetType().String(), "err", err)
			continue
		}
		out = append(out, Outbound{To: m.GetTo(), Snapshot: m.GetType() == raftpb.MsgSnap, Data: data})
	}
	r.cfg.Transport.Send(out)
}

// sendSnapshot marshals one MsgSnap and hands it to the transport.
func (r *Replica) sendSnapshot(m *raftpb.Message) {
	data, err := proto.Marshal(m)
	if err != nil {
		r.log.Error("marshal raft message", "type", m.GetType().String(), "err", err)
		r.node.ReportSnapshot(m.GetTo(), raft.SnapshotFailure)
		return
	}
	r.cfg.Transport.Send([]Outbound{{To: m.GetTo(), Snapshot: true, Data: data}})
}
