// Package replica is the glue between go.etcd.io/raft/v3 and the rest of
// tidal-server: it owns the raft node, its durable log (package wal), the
// snapshot files, the membership table and the apply loop. No other package
// imports raft types; the transport moves opaque, already-marshalled
// messages and the state machine sees only (index, term, data).
//
// # The Ready contract
//
// raft runs with AsyncStorageWrites: a Ready carries no obligation to
// persist before the next one. The work is split between goroutines joined
// by FIFO queues, so the order raft asked for is kept end to end:
//
//  1. the Ready loop (run) sends peer messages at once. Nothing in a
//     Ready's Messages depends on an unfinished local write: raft attaches
//     those (a follower's MsgAppResp, a vote, the leader's own append
//     acknowledgement) to the write's MsgStorageAppend as Responses. For
//     each MsgStorageAppend it stages snapshot mark, entries and HardState
//     in the WAL as one batch (fdatasync'd when entries, term or vote
//     changed) without waiting for it, and updates raft.MemoryStorage.
//     The next batch is thus staged while this one syncs, and shares the
//     next fsync. A MsgStorageAppend carrying a snapshot received from the
//     leader goes instead to the lane goroutine, which first writes the
//     snapshot to its own CRC-protected file (fsynced) and then stages it
//     the same way; appends after it follow it through the lane, in order,
//     until the lane is empty. A large snapshot on a slow disk thus never
//     stops the Ready loop: it keeps ticking, answering heartbeats and
//     following leader changes. Each MsgStorageApply goes to the apply
//     goroutine. Learner promotion runs on its own goroutine too: it
//     proposes and waits for the outcome.
//  2. the sync goroutine waits for each staged batch in order, and only
//     then steps its Responses into raft or sends them to peers. The
//     leader's own acknowledgement is among them, so a commit never counts
//     a copy that is not durable; followers acknowledge only what they
//     synced. A received snapshot is queued for the apply goroutine before
//     the responses, so it is installed before any entry after it.
//  3. the apply goroutine applies each MsgStorageApply's committed entries
//     in log order, wakes their proposers, steps the apply response back,
//     and encodes snapshots (periodic and on demand), so a snapshot is
//     exactly the applied prefix. A snapshot goroutine makes each encoded
//     snapshot durable (file, fsync, WAL mark, compaction) while apply goes
//     on. ReadIndex results go to their waiters from the Ready loop; each
//     waits for apply to reach its index.
//
// If a WAL write fails the replica is fenced: every goroutine stops,
// nothing more is persisted, sent or applied, raft is stopped, and every
// later proposal fails with ErrFenced. Carrying on after a failed fsync is
// how replicas diverge.
//
// # Invariants
//
//   - applied <= commit, and every applied entry is durable here: raft
//     hands an entry to apply only after this node stepped the responses
//     of the write that made it durable.
//   - An entry is applied exactly once per process lifetime, in index order;
//     after a restart the state machine is rebuilt from the newest snapshot
//     plus the WAL suffix, so apply must be deterministic.
//   - A proposal's waiter is woken only by the entry carrying its own
//     request id, so an entry that replaced it after a leader change cannot
//     acknowledge it; such a waiter times out (outcome unknown). The one
//     exception is not an acknowledgement: a membership change is proposed
//     behind a marker entry carrying its request id, and the empty entry
//     raft puts right after that marker (same term) in place of a change
//     it refused answers the waiter with ErrConfChangeDropped.
//   - Request ids are never reused by a node, across restarts too: their
//     high bits are an epoch persisted and raised at every start.
//   - Node ids are never reused: the membership table remembers removed ids
//     and it is part of every snapshot. A change that reaches the log
//     against the table (re-adding a removed id, adding a member as a
//     learner) is applied with its NodeId zeroed, which raft skips, on
//     every node alike.
package replica
