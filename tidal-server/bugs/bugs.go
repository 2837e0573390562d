// Package bugs plants switchable defects in tidal-server so that the chaos
// harness can be shown to catch them (docs/planted-bugs.md). It exists to
// prove the checkers can fail, never to change a real node's behaviour.
//
// Invariant: in a build without the `tidalbugs` tag, Active is a constant
// false (off.go), so every hook guarded by it is dead code the compiler
// removes; the defect names and the TIDAL_BUGS variable do not even appear
// in the binary, and setting the variable changes nothing.
//
// In a `tidalbugs` build (on.go), TIDAL_BUGS=name[,name] is read once when
// the process starts; Announce logs a WARN naming every active defect and
// refuses an unknown name, so a typo cannot pass for a caught bug.
package bugs

// Defect names one planted defect. Names (for TIDAL_BUGS and logs) live
// in on.go only, so that a normal build carries none of them.
type Defect uint8

const (
	// AckBeforeCommit answers a write as soon as raft accepted the
	// proposal, without waiting for commit and apply (hook: replica.Propose).
	AckBeforeCommit Defect = iota + 1
	// ApplyTwiceAfterRestart folds the first entries replayed after a
	// restart a second time, around the id memory (hook: server's
	// StateMachine.Apply, bugs_on.go).
	ApplyTwiceAfterRestart
	// LocalLinearizableReads serves consistency=linearizable reads from
	// local state without ReadIndex (hook: server's node.Barrier).
	LocalLinearizableReads
	// DropDedupOnRestart stops a restarted node recognising event ids it
	// remembers, so a retried write folds again there (hook: server's
	// StateMachine.Apply, bugs_on.go).
	DropDedupOnRestart
	// AckBeforeFsync releases a group commit's waiters once the group is
	// written, before its fdatasync (hook: wal's commit). Only a fault that
	// drops the page cache (faultfs power-cut) shows it.
	AckBeforeFsync
	// SkipDirFsync leaves out the directory fsync after a new segment is
	// renamed into place (hook: wal's createSegment), so a power cut can
	// make the whole segment vanish with every synced record in it.
	SkipDirFsync
	// DropLastRecordOnRecovery makes the WAL's recovery take the newest
	// segment's last entry record for a torn tail and cut it off (hook:
	// wal's open, bugs_on.go), though it was written and synced whole.
	DropLastRecordOnRecovery
	// IgnoreFsyncError logs a failed group-commit fdatasync and carries on
	// as if it had succeeded, instead of fencing (hook: wal's commit).
	IgnoreFsyncError
	// NeverFsync never calls the group commit's fdatasync at all and
	// answers every write as durable (hook: wal's commit): a WAL which
	// kill -9 cannot tell from a correct one and a power cut of every
	// node must.
	NeverFsync
	// DropVectorsInSnapshot writes every state snapshot with an empty
	// vector store in place of the node's own (hook: server's
	// StateMachine.snapshotLocked). A node that restores one — its own
	// after a restart, or the leader's when it catches up by snapshot —
	// loses every vector put before the snapshot's index, while its
	// ledger and embedding write ids are whole.
	DropVectorsInSnapshot
	// WindowOffByOneBucket evaluates every windowed count one bucket
	// late: it counts the bucket that has just expired and not the one
	// holding the read's time (hook: ledger's windowCount). Every node
	// computes the same wrong count, so only a model of the aggregates
	// sees it.
	WindowOffByOneBucket
	// DecayWrongHalfLife decays every score with the schema's half-life
	// read as minutes where it says hours (72h decays as 72m; hook:
	// ledger.New). Deterministic, so every node agrees on the wrong score.
	DecayWrongHalfLife
	// IgnoreEmbeddingOverwrite acknowledges a put to an entity that
	// already has a vector, remembers its write id, and keeps the old
	// vector (hook: server's StateMachine.applyEmbedding). Every node
	// applies the same log the same way, so their digests agree: only
	// reading the vectors back shows it.
	IgnoreEmbeddingOverwrite
	// VoteBeforeSync answers a vote (MsgVoteResp) as soon as the term and
	// vote it grants are staged in the WAL, before they are synced, and
	// stages such a term/vote change without a sync of its own (hook:
	// replica's stageAppend). A power cut right after the vote loses it:
	// the node comes back at the old term, free to vote again in the term
	// it already voted in. Only a cut within milliseconds of a vote shows
	// it (power-cut-after-election).
	VoteBeforeSync
	// InternalErrorOnValidWrite answers every 20th valid POST /v1/signals
	// (5%) with 500 internal without proposing it (hook: api's
	// postSignals). Nothing is lost or applied twice, so only a checker
	// that judges the answers themselves sees it.
	InternalErrorOnValidWrite
	// DrainAckBeforeFsync makes a draining node (SIGTERM, from the start
	// of Server.Shutdown, before the leadership hand-off) answer every
	// write waiting on it as applied at once, every write it takes
	// afterwards as soon as it is handed to raft, ignoring raft's
	// refusal, and the writes still waiting when its replica stops as
	// applied: none waited for commit, let alone for a quorum's fsyncs
	// (hooks: server's Shutdown, replica's Propose, bugs_on.go). Each
	// answer's index is a guess. A leader refuses every proposal while it
	// hands leadership off, so a leader's drain acknowledges writes that
	// are in no log; the writes already in the log commit through the
	// hand-off, at other indexes than the guessed ones.
	DrainAckBeforeFsync

	// lastDefect is the highest Defect; tests walk 1..lastDefect.
	lastDefect = DrainAckBeforeFsync
)
