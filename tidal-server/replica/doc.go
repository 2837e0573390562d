// Package replica is the glue between go.etcd.io/raft/v3 and the rest of
// tidal-server: it owns the raft node, its durable log (package wal), the
// snapshot files, the membership table and the apply loop. No other package
// imports raft types; the transport moves opaque, already-marshalled
// messages and the state machine sees only (index, term, data).
//
// # The Ready contract
//
// One goroutine (run) handles every raft.Ready in this order:
//
//  1. a snapshot, if any, is written to its own CRC-protected file and
//     fsynced before the WAL records its mark;
//  2. entries, HardState and the snapshot mark go to the WAL as one batch:
//     one write and, when Ready.MustSync, one fdatasync (group commit: every
//     proposal that reached raft since the last Ready shares that sync);
//  3. the in-memory raft log (raft.MemoryStorage) is updated;
//  4. messages are sent — only after step 2, so nothing this node
//     acknowledges to a peer is less durable than the ack claims;
//  5. committed entries are applied in log order and their proposers woken;
//  6. ReadIndex results are handed to their waiters;
//  7. Advance.
//
// If step 2 fails the replica is fenced: raft is stopped, nothing more is
// persisted, sent or applied, and every later proposal fails with
// ErrFenced. Carrying on after a failed fsync is how replicas diverge.
//
// # Invariants
//
//   - applied <= commit <= last persisted index, at every moment.
//   - An entry is applied exactly once per process lifetime, in index order;
//     after a restart the state machine is rebuilt from the newest snapshot
//     plus the WAL suffix, so apply must be deterministic.
//   - A proposal's waiter is woken only by the entry carrying its own
//     request id, so an entry that replaced it after a leader change cannot
//     acknowledge it; such a waiter times out (outcome unknown).
//   - Node ids are never reused: the membership table remembers removed ids
//     and it is part of every snapshot.
package replica
