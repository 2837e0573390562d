package wal

import (
	"fmt"
	"slices"
)

// indexTracker holds the rules that keep the log a contiguous run of
// indexes. Save applies them before a batch is queued, and replay applies
// them again to what it reads back, so a log that replays is one Save could
// have written.
type indexTracker struct {
	// anchored is false only at the start of a replay whose oldest
	// segments were compacted away, until the first entry: that entry
	// anchors the log wherever it is. A mark does not anchor it: the
	// first marks read may be stale ones, written before entries whose
	// predecessors went with the compacted segments (a mark at 1, then
	// entries 26.. whose 2..25 were compacted below a newer mark).
	anchored bool
	snap     uint64 // index of the newest snapshot mark
	last     uint64 // index of the last entry, or snap when the log is empty past it
}

func (t *indexTracker) admitMark(m SnapshotMark) error {
	if m.Index < t.snap {
		return fmt.Errorf("snapshot mark at index %d: expected at least the previous mark's index %d", m.Index, t.snap)
	}
	t.snap = m.Index
	t.last = max(t.last, m.Index)
	return nil
}

// admitEntries checks a run of entries with indexes first..last (already
// known to be contiguous).
func (t *indexTracker) admitEntries(first, last uint64) error {
	if first <= t.snap {
		return fmt.Errorf("entry index %d: expected above the snapshot mark's index %d", first, t.snap)
	}
	if t.anchored && first > t.last+1 {
		return fmt.Errorf("entry index %d: expected at most %d (one past the last entry); the log would have a gap", first, t.last+1)
	}
	t.last = last
	t.anchored = true
	return nil
}

// checkContiguous verifies that es have consecutive indexes.
func checkContiguous(es []Entry) error {
	for i := 1; i < len(es); i++ {
		if es[i].Index != es[i-1].Index+1 {
			return fmt.Errorf("entries[%d].Index: expected %d (one past entries[%d]), found %d", i, es[i-1].Index+1, i-1, es[i].Index)
		}
	}
	return nil
}

// logState rebuilds the log from records in write order.
type logState struct {
	indexTracker
	snap    SnapshotMark
	hs      HardState
	hasSnap bool
	hasHS   bool
	entries []Entry // contiguous; entries above snap.Index only
}

func newLogState(anchored bool) *logState {
	return &logState{indexTracker: indexTracker{anchored: anchored}}
}

func (s *logState) applyEntry(e Entry) error {
	if err := s.admitEntries(e.Index, e.Index); err != nil {
		return err
	}
	// A rewrite of index i replaces i and everything after it: this is
	// how raft truncates a conflicting suffix.
	if n := len(s.entries); n > 0 && e.Index <= s.entries[n-1].Index {
		cut := max(0, int(int64(e.Index)-int64(s.entries[0].Index)))
		clear(s.entries[cut:])
		s.entries = s.entries[:cut]
	}
	e.Data = slices.Clone(e.Data) // the segment buffer must not outlive replay
	s.entries = append(s.entries, e)
	return nil
}

func (s *logState) applyMark(m SnapshotMark) error {
	if err := s.admitMark(m); err != nil {
		return err
	}
	s.snap, s.hasSnap = m, true
	// Entries at or below the mark are covered by the snapshot.
	i, _ := slices.BinarySearchFunc(s.entries, m.Index+1, func(e Entry, idx uint64) int {
		switch {
		case e.Index < idx:
			return -1
		case e.Index > idx:
			return 1
		}
		return 0
	})
	clear(s.entries[:i])
	s.entries = s.entries[i:]
	return nil
}

// groupsState rebuilds every group's log from records in write order.
type groupsState struct {
	// anchored says whether a group seen for the first time starts at
	// index 0 (the log was never compacted) or wherever its first entry
	// or mark lies.
	anchored bool
	groups   map[uint64]*logState
}

func newGroupsState(anchored bool) *groupsState {
	return &groupsState{anchored: anchored, groups: make(map[uint64]*logState)}
}

// group returns g's state, creating it empty.
func (s *groupsState) group(g uint64) *logState {
	st, ok := s.groups[g]
	if !ok {
		st = newLogState(s.anchored)
		s.groups[g] = st
	}
	return st
}

func (s *groupsState) apply(rec record) error {
	if err := s.group(rec.group).apply(rec); err != nil {
		return fmt.Errorf("group %d: %w", rec.group, err)
	}
	return nil
}

// recovered is g's recovered state; empty for a group with no records.
func (s *groupsState) recovered(g uint64) GroupRecovered {
	st, ok := s.groups[g]
	if !ok {
		return GroupRecovered{}
	}
	return GroupRecovered{Snapshot: st.snap, HardState: st.hs, Entries: st.entries}
}

// result assembles Recovered: every group, and DefaultGroup's state at the
// top level for single-group callers.
func (s *groupsState) result(torn *TornTail) *Recovered {
	one := s.recovered(DefaultGroup)
	rec := &Recovered{Snapshot: one.Snapshot, HardState: one.HardState, Entries: one.Entries, TornTail: torn,
		Groups: make(map[uint64]GroupRecovered, len(s.groups))}
	for g := range s.groups {
		rec.Groups[g] = s.recovered(g)
	}
	return rec
}

func (s *logState) apply(rec record) error {
	switch rec.typ {
	case recEntry:
		return s.applyEntry(decodeEntry(rec.payload))
	case recHardState:
		s.hs, s.hasHS = decodeHardState(rec.payload), true
		return nil
	case recSnapshotMark:
		return s.applyMark(decodeSnapshotMark(rec.payload))
	}
	return fmt.Errorf("unexpected %s record", typeName(rec.typ))
}
