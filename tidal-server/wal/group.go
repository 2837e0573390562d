package wal

import "context"

// GroupLog is one raft group's view of a WAL shared by several groups:
// the same Save, Stage and Compact as the WAL's own (which are
// DefaultGroup's), with every record tagged by the group. All groups'
// batches share the one writer, so Saves of different groups queued
// together go out in one write and one fdatasync. Index rules, snapshot
// marks and compaction bounds are per group; fencing is per WAL.
type GroupLog struct {
	w  *WAL
	id uint64
}

// Group returns the log of raft group id (0 is the meta group, data groups
// count from 1; see package shard). Group(DefaultGroup) writes exactly as
// the WAL's own methods do. The first batch staged for any other group
// makes the log tagged for good: it starts a new segment in the tagged
// format version, and every record from then on carries its group.
func (w *WAL) Group(id uint64) *GroupLog { return &GroupLog{w: w, id: id} }

// ID is the group's id.
func (g *GroupLog) ID() uint64 { return g.id }

// Save is WAL.Save for this group.
func (g *GroupLog) Save(ctx context.Context, b Batch, sync bool) error {
	return g.w.save(ctx, g.id, b, sync)
}

// Stage is WAL.Stage for this group. Batches of all groups are written in
// the order Stage accepted them.
func (g *GroupLog) Stage(b Batch, sync bool) (*Pending, error) {
	return g.w.stage(g.id, b, sync)
}

// Compact records that this group no longer needs its entries below
// below, which must not exceed its durable snapshot mark's index + 1, and
// removes the oldest segments no group needs any more. A segment stays
// while any group with entries in it has not compacted past them: an idle
// group pins the segments holding its entries until it snapshots and
// compacts.
func (g *GroupLog) Compact(below uint64) error {
	return g.w.compactGroup(g.id, below)
}
