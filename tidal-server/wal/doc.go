// Package wal is tidal-server's write-ahead log: the durable raft log of one
// node, shared by every raft group the node hosts. For each group it
// stores raft entries by index, the newest HardState and the newest
// snapshot mark, and gives them back after a crash. It knows nothing of
// raft itself; package replica translates.
//
// # Groups
//
// WAL.Group(id) is one group's view of the log (Save, Stage, Compact); the
// WAL's own methods are group 1's (DefaultGroup), the only group of a
// single-group node. Every group's index rules, snapshot mark and
// compaction bound are its own; the writer, the segments and the fence are
// shared, so Saves of different groups queued together go out in one
// write and one fdatasync. Open returns every group's state in
// Recovered.Groups and group 1's also in Recovered's top-level fields.
//
// # Files
//
// A log is a directory of segment files named by a 16-hex-digit sequence
// number ("000000000000002a.wal") plus a LOCK file that one process holds
// (flock) while the log is open. Segments are created complete — fallocated
// to Options.SegmentSize, header written and fdatasynced — under a ".tmp"
// name, then renamed into place and the directory fsynced; so every segment
// file that exists starts with a durable header, and leftover ".tmp" files
// are debris that Open deletes, logging each. Open creates the directory
// with its parent fsynced (and fsyncs the parent of an existing one), so
// the log's own directory entry survives a crash. Compaction removes
// segments oldest first,
// fsyncing the directory after each, so the sequence numbers on disk are
// always contiguous.
//
// # Record format
//
// A segment is a run of records followed by zeroes (the unwritten part of
// the preallocation) or by the end of the file:
//
//	+-----------+-----------+--------+------------------+
//	| length u32| crc32c u32| type u8| payload [length] |
//	+-----------+-----------+--------+------------------+
//
// Integers are little-endian. The CRC is CRC-32C (Castagnoli) over the type
// byte and the payload. Types, with their payloads:
//
//	1 segment header       magic "TIDALWAL", version u32, sequence u64
//	2 entry                index u64, term u64, entry type u8, data
//	3 hard state           term u64, vote u64, commit u64
//	4 snapshot mark        index u64, term u64
//	5 tagged entry         group uvarint, then type 2's payload
//	6 tagged hard state    group uvarint, then type 3's payload
//	7 tagged snapshot mark group uvarint, then type 4's payload
//
// Type 0 does not exist, so a header of nine zero bytes is never a record:
// it is what never-written preallocated space looks like. The first record
// of a segment is its header, and only there; its sequence must match the
// file name. The group tag is a canonical (shortest) uvarint, so a record
// has exactly one encoding, and the checksum covers it like the rest.
//
// The header's version says which records follow: version 1 segments hold
// types 2-4 only, all of group 1; version 2 segments hold types 5-7 only.
// A log that no group other than 1 ever wrote to is written in version 1,
// byte for byte as by releases before groups, which therefore still open
// it. The first batch of another group makes the log tagged for good: the
// writer commits what was queued before it, then starts a new segment in
// version 2 even if the current one has room, and every later segment is
// version 2 too, group 1's records in it tagged. So no segment mixes
// encodings, an untagged segment after a tagged one is corruption, and a
// release before groups refuses a tagged log by its version check
// (*FormatError naming the segment and the version) instead of misreading
// it.
//
// # Writing: group commit
//
// Save encodes its Batch (snapshot mark, then entries, then hard state) in
// the caller's goroutine, then under a mutex checks the index rules below
// and appends it to a queue: the lock covers the hand-off, never I/O. One
// writer goroutine takes everything queued when it wakes (up to
// BatchMaxBytes; with BatchTimeout > 0 it may first wait that long for
// more), writes it with one pwrite at the end of the current segment and
// calls fdatasync once; only then are the waiting Saves released. A group
// never spans segments: if it does not fit, the writer syncs the current
// segment and rolls over to the next first.
//
// If a write, fdatasync, or segment creation fails, the WAL is fenced:
// that group and every Save after it fail with an error wrapping ErrFenced,
// and nothing more is written. After a failed fdatasync the kernel may
// have dropped the dirty pages and a retry could "succeed"; carrying on is
// how replicas diverge. Reopening the log is the only way forward. The
// fence is the WAL's, not a raft group's: every group shares the file and
// the disk whose sync failed, so every group is fenced.
//
// # Index rules (checked by Save, and again by replay)
//
// They hold for each group on its own; records of other groups between
// them do not matter.
//
//   - Entries in a batch have consecutive indexes.
//   - An entry's index is above the newest snapshot mark and at most one
//     past the last entry (or past the mark, if that is newer). A fresh log
//     therefore starts at index 1, or at the index after a saved mark.
//   - An entry whose index is at or below the last index replaces that
//     index and everything after it: this is how raft truncates a
//     conflicting suffix, and replay does the same.
//   - Snapshot marks never go backwards. A mark drops the entries at or
//     below it; a mark past the last entry empties the log and the next
//     entry must follow the mark.
//
// # Recovery rule
//
// Open reads the segments in order. In each it decodes records from offset
// 0 until one fails to decode. If every byte from there to the end of the
// file is zero (or there are no bytes), that is the segment's clean end.
// Otherwise the bytes at that offset are damaged, and:
//
//   - they are a torn tail, which Open truncates (ftruncate to the offset,
//     fdatasync, preallocate again), logs, and reports in
//     Recovered.TornTail, if and only if the segment is the newest, the
//     damage is after its header, no record decodes at any later offset of
//     the file, and the bad record looks like a write that did not
//     complete (below);
//   - otherwise they are corruption: Open returns a *CorruptionError
//     naming the file and offset and does not open the log.
//
// What a write that did not complete looks like follows from how the log
// writes: a segment is preallocated with zeroes, a group is one pwrite into
// that zeroed space (or past the end of the file), and a device persists a
// write in whole 512-byte sectors. A killed process leaves a prefix of its
// write; a power loss leaves any subset of its sectors. So the bytes that
// did not arrive read as zeroes, whole sectors of them, or are missing at
// the end of the file. The bad record is torn if
//
//   - the file ends inside it (its header, or the length it claims, runs
//     past the end), or its header is all zero; or
//   - one of the pieces it falls into when split at 512-byte aligned file
//     offsets is all zero;
//
// unless one flipped bit — in its length, its stored checksum, or the type
// and payload the checksum covers — would make it valid: small records
// hold zero bytes of their own (a HardState's high bytes), and one that
// straddles a sector boundary can have an all-zero piece although it was
// written whole. A complete record with a bad checksum and no zeroed piece
// reached the disk whole and was damaged since: corruption. That matters
// most for the last record of a batch, its HardState: cutting a flipped
// bit there as "torn" would silently bring back the previous term and
// vote, and the node could vote twice in one term.
//
// The rule is exact for a killed process and for a power loss that tears
// the last write at sector boundaries, as long as the tear leaves a
// prefix. If a power loss persisted the sectors of the last, unsynced
// write out of order (a later record whole after a zeroed sector), Open
// reports corruption although nothing acknowledged was lost; and a torn
// record whose checksum one flipped bit happens to explain (a CRC-32C
// collision, about n/2^29 for an n-byte record) is reported as corruption
// too. Both fail safe: `tidal-server wal repair` (Repair) then truncates at
// the damage. What the rule cannot see is damage that zeroes a whole
// sector of a record written whole (a device returning zeroes for a bad
// sector) in the last write: that is cut as torn.
//
// Records that decode but break the index rules, and a gap in segment
// sequence numbers, are corruption too.
//
// # Compaction
//
// Group(g).Compact(below) records that group g no longer needs its entries
// below below, which must not exceed g's durable snapshot mark's index +
// 1. Whole segments are then removed, oldest first and never the one being
// written, while every group with entries in the next one has compacted
// past all of them (each segment tracks, per group, the largest entry
// index it holds). If a group's newest hard state or mark would go with
// them, both are first rewritten into the current segment. The invariant:
// a segment goes only when no group needs any entry in it. Its cost: an
// idle group pins the segment holding its entries, and every segment after
// it, until it snapshots and compacts; bounds live in memory, so after
// Open each group must compact again before its old segments go.
//
// Entries at or below the newest mark that survive in kept segments are
// dropped by replay. Because the oldest segment of a compacted log is not
// segment 0, replay lets each group's first entry anchor its index
// sequence; marks read before it set the mark but do not anchor, since the
// oldest kept segment may begin with a mark older than the entries after
// it, whose predecessors were compacted away.
//
// # Invariants
//
//   - A Save that returned nil with sync set is on disk and will be
//     recovered (unless a later entry replaced it, or a mark covered it).
//   - Recovery returns a prefix of what was written, in write order; the
//     only thing it ever drops by itself is a torn tail of the newest
//     segment, which no Save with sync returned nil for (barring a device
//     that zeroes a whole sector of the very last write after it was
//     synced; see above).
//   - Once fenced, the WAL writes nothing, and what it reported durable is
//     frozen.
//   - The files on disk are always an openable log: segment creation,
//     truncation and removal are each made durable before the next write
//     depends on them.
package wal
