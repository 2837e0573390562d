// Package ledger is tidal's signal state machine: it folds engagement
// events (view, like, share, ...) on numeric entity ids into per
// (entity, signal) aggregates, and remembers event ids so that retries are
// not folded twice.
//
// # Determinism
//
// The replication layer calls Apply once per committed log entry that
// carries signals (ApplyAt and Consume per command of a packed entry, then
// FinishEntry), in log order, on every node, and SetApplied for every
// other entry. The ledger reads no clock, does no I/O except Snapshot and
// Restore, and starts no goroutines: its state is a function of the
// applied log prefix alone, and Digest (a sha256 of the canonical
// encoding, applied index included) is equal on replicas that applied the
// same prefix. Errors are part of that function too: a batch Apply refuses
// is refused identically everywhere and leaves the state untouched.
// Decay factors come from a portable 2^x (not math.Exp2, which is
// assembly on arm64) and float products are kept from FMA fusion, so the
// bits agree across architectures.
//
// # Events
//
// An event is {id, entity, signal, weight, ts}. Schema.ValidateEvent
// states the rules: id 1..128 bytes of visible ASCII; signal declared in
// the schema; weight finite and in (0, 1e9] (the API defaults it to 1);
// ts in unix ms within [2000-01-01, 2100-01-01), stamped by the node
// before logging when the client omits it.
//
// # Aggregates
//
// Per (entity, signal) the ledger keeps:
//
//   - Count and WeightSum of the folded events.
//   - A decayed score with the signal type's half-life h:
//     score(at) = Σ wᵢ·2^(-(at-tsᵢ)/h). It is exact whatever order the
//     timestamps arrive in: the state is an anchor (the newest ts folded)
//     and S = Σ wᵢ·2^(-(anchor-tsᵢ)/h). An event newer than the anchor
//     rescales S to the new anchor and adds w; an older one adds
//     w·2^(-(anchor-ts)/h). Every term is at most w, so S never overflows;
//     terms far older than the anchor underflow to 0, which is their true
//     contribution to within 2^-1074. The score is evaluated at read time,
//     score(at) = S·2^(-(at-anchor)/h), for any at (before the anchor it
//     grows; it saturates at MaxFloat64 instead of +Inf).
//   - For every window of duration W (a whole number of minutes), counts
//     in buckets of width b = W/60 (1h → 1 min, 24h → 24 min), bucket k
//     holding the events with ⌊ts/b⌋ = k. A read at time at counts the
//     buckets ⌊at/b⌋-60 .. ⌊at/b⌋, i.e. exactly the events with
//     ts ∈ [(⌊at/b⌋-60)·b, (⌊at/b⌋+1)·b). Hence the error bound: every
//     event with at-W < ts <= at is counted (never dropped early); an
//     event that left the window is still counted for less than one
//     bucket width b after it left (ts > at-W-b); an event stamped after
//     at is counted only if it shares at's bucket (less than b ahead).
//     Buckets are pruned when an event is folded, relative to that key's
//     newest ts (never the wall clock): buckets below ⌊anchor/b⌋-60 are
//     dropped, so a key holds at most 61 buckets per window, and the
//     statement above holds for every read at or after the key's newest
//     event; a read at an earlier time may undercount. The "all" window is
//     the total count.
//
// Top ranks the entities of one signal by decayed score or by one
// window's count at a given time, exhaustively, ties to the lower entity
// id, leaving out zero values.
//
// # Idempotency and the id memory
//
// Every applied event's id is remembered with its payload (entity, signal,
// weight) and its location (log index, term, position in the batch). An
// event whose id is remembered with the same payload is a retry: it is
// acknowledged (counted in Result.Duplicates) and not folded. The same id
// with a different payload is a conflict (*ConflictError, HTTP 409) and
// the whole batch is refused. The same rules apply between events of one
// batch. The timestamp is not part of the compared payload: a retry whose
// client omitted ts is stamped anew by the node and must still be
// recognised; the original event's ts is the one that was folded.
//
// The memory is bounded and rotates by log position, never by wall clock
// (a time-based window lets a late retry fold twice). It has two
// generations. Ids go into the current one; after an Apply, if the
// current generation holds >= IDsPerGeneration ids (default 500,000), the
// previous generation is dropped and the current one becomes the previous.
// Guarantee: a retry is recognised if fewer than IDsPerGeneration other
// events were applied after the original. Bound: at most
// 2·IDsPerGeneration + (largest batch - 1) ids are held. A retry does not
// refresh its id. The id memory is replicated state: it is in Snapshot
// and Digest, and survives restarts through them.
//
// An entry may pack several commands (replica's packed proposals), of
// every kind: signals batches, embedding puts. Each takes a span of
// positions of the entry (Span: one per event, one for a command without
// events), from 0, in order, with no gap, refused or not. ApplyAt applies
// a signals command at its span, atomic on its own; Consume takes the span
// of a command that folds nothing (an embedding put, a refused command);
// a command whose span starts below the applied position (index,
// position) is a replay and wraps ErrAlreadyApplied, whatever its kind.
// FinishEntry after the last one is where the memory rotates, so rotation
// stays at entry boundaries (and the bound above counts the entry's
// events as one batch). State is captured only between entries
// (EntryOpen is false there), so a snapshot's applied index means "that
// entry whole", and a restored ledger refuses every command of it.
//
// # Snapshots
//
// Snapshot writes a versioned, canonical encoding (maps in sorted order)
// followed by its sha256, so equal states give equal bytes and Digest is
// that checksum. Restore verifies the checksum and every structural
// invariant before replacing the state, and refuses a snapshot taken with
// another schema or IDsPerGeneration.
//
// # Concurrency
//
// A Ledger is safe for concurrent use. Apply, ApplyAt, Consume,
// FinishEntry, SetApplied and Restore take an exclusive lock; Get, Top, Lookup, Check, Digest, Snapshot and Stats a
// shared one. AuditEvents copies the ids and calls its callback unlocked.
package ledger
