package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Report is what Verify found, and for Repair also what it dropped.
type Report struct {
	Dir      string
	Segments []SegmentReport
	// Records counts the good records replayed, segment headers excluded.
	Records int
	// Problem is the first damage found, nil if the log is clean. When
	// TornTail is also set, the damage is a torn tail that Open truncates
	// by itself; otherwise Open refuses the log.
	Problem  *CorruptionError
	TornTail *TornTail
	// Dropped lists what Repair cut off, in the order it did so.
	Dropped []Dropped
	// Commit is DefaultGroup's highest commit index of any HardState
	// record that decodes, before or after the damage: the newest
	// position this node recorded as committed, so entries up to it were
	// acknowledged by a quorum and raft on the other nodes relies on this
	// node holding them.
	Commit uint64
	// LastIndex is DefaultGroup's index of the last entry (or snapshot
	// mark) of the log that replays, i.e. up to the damage: what Repair
	// keeps.
	LastIndex uint64
	// Groups has one line per group with records, DefaultGroup's
	// included, in group order.
	Groups []GroupReport
}

// GroupReport is one group's part of a Report.
type GroupReport struct {
	Group uint64
	// Records counts the group's good records replayed.
	Records int
	// Snapshot is the index of the group's newest snapshot mark.
	Snapshot uint64
	// LastIndex and Commit are as in Report, for this group.
	LastIndex, Commit uint64
}

// CutsCommitted reports whether cutting at the damage would drop entries
// this node recorded as committed, in any group (its LastIndex below its
// Commit). A raft member whose log loses committed entries panics on its
// next start ("tocommit(N) is out of range [lastIndex(M)]"): the leader
// sends it that commit index again.
func (r *Report) CutsCommitted() bool {
	return r.cutsCommitted() != nil
}

// cutsCommitted returns the first group whose committed entries a cut
// at the damage drops, or nil.
func (r *Report) cutsCommitted() *GroupReport {
	if r.Problem == nil || r.TornTail != nil {
		return nil
	}
	for i, g := range r.Groups {
		if g.LastIndex < g.Commit {
			return &r.Groups[i]
		}
	}
	return nil
}

// SegmentReport describes one segment file.
type SegmentReport struct {
	File string
	Seq  uint64
	// Version is the segment's format version: 1 untagged (one group),
	// 2 group-tagged; 0 if its header is damaged.
	Version uint32
	Size    int64
	// Records counts records that decoded, from the start of the segment
	// up to the first bad one (the header excluded).
	Records int
	// LastGoodOffset is one past the last record that decoded.
	LastGoodOffset int64
	// DataEnd is one past the last non-zero byte of the file.
	DataEnd int64
	// Problem describes the first bad bytes of this segment, if any.
	Problem string
}

// Dropped is one cut Repair made.
type Dropped struct {
	File string
	// Offset is where the file was truncated; 0 with Removed set when
	// the whole file went.
	Offset  int64
	Removed bool
	// Bytes is how many non-zero bytes were dropped.
	Bytes int64
	// Records is how many whole records in the dropped bytes still
	// decoded (they were after the damage, so replay could not use them).
	Records int
}

// segSummary is inspect's view of one segment.
type segSummary struct {
	seq     uint64
	path    string
	size    int64
	end     int64 // one past the last good record
	dataEnd int64
	version uint32
	records []int64 // offsets of the good records, header excluded
	// maxIndex maps each group with entry records here to its largest
	// entry index here.
	maxIndex   map[uint64]uint64
	problem    string
	laterValid int               // records decoding after the bad bytes
	maxCommit  map[uint64]uint64 // per group, highest HardState commit among records that decode
}

// inspection is everything Open, Verify and Repair need from one read-only
// pass over the directory.
type inspection struct {
	segs  []segSummary
	state *groupsState
	// hsSeq and smSeq map each group to the segment holding its newest
	// HardState and snapshot mark.
	hsSeq, smSeq map[uint64]uint64
	replayed     int
	records      map[uint64]int // per group, records replayed
	problem      *CorruptionError
	problemSeg   int // index into segs
	torn         *TornTail
}

// inspect scans every segment of dir in order and replays them up to the
// first problem, then classifies that problem (see the package
// documentation). Segments after the problem are still scanned, for the
// report.
func inspect(dir string) (*inspection, error) {
	seqs, err := listSegments(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: list segments in %s: %w", dir, err)
	}
	return inspectSegments(seqs, func(seq uint64) (*segmentScan, error) { return readSegment(dir, seq) })
}

// inspectSegments is inspect without the directory: read returns the scan
// of one segment. It is pure, so a fuzz target can drive it from memory.
func inspectSegments(seqs []uint64, read func(seq uint64) (*segmentScan, error)) (*inspection, error) {
	in := &inspection{problemSeg: -1, hsSeq: map[uint64]uint64{}, smSeq: map[uint64]uint64{}, records: map[uint64]int{}}
	// A log whose first segment is 0 was never compacted: every group's
	// replay starts at index 0 like a fresh log. Otherwise the first
	// entry or mark read of each group anchors it.
	in.state = newGroupsState(len(seqs) > 0 && seqs[0] == 0)
	for i, seq := range seqs {
		scan, err := read(seq)
		if err != nil {
			return nil, fmt.Errorf("wal: read segment: %w", err)
		}
		if scan.format != nil {
			// Not damage: a log this build must not read at all.
			return nil, scan.format
		}
		sum := segSummary{seq: seq, path: scan.path, size: scan.size, end: scan.end, version: scan.version,
			maxIndex: map[uint64]uint64{}, maxCommit: map[uint64]uint64{}}
		sum.dataEnd = max(scan.end, scan.junkEnd)
		for _, r := range scan.records {
			sum.records = append(sum.records, r.offset)
			if r.typ == recEntry {
				sum.maxIndex[r.group] = max(sum.maxIndex[r.group], decodeEntry(r.payload).Index)
			}
		}
		for _, r := range scan.records {
			if r.typ == recHardState {
				sum.maxCommit[r.group] = max(sum.maxCommit[r.group], decodeHardState(r.payload).Commit)
			}
		}
		for _, r := range scan.later {
			if r.typ == recHardState {
				sum.maxCommit[r.group] = max(sum.maxCommit[r.group], decodeHardState(r.payload).Commit)
			}
		}
		if scan.problem != nil {
			sum.problem = scan.problem.Error()
			sum.laterValid = scan.laterValid
		}
		in.segs = append(in.segs, sum)
		if in.problem != nil {
			continue
		}

		if i > 0 && seq != seqs[i-1]+1 {
			in.problem = &CorruptionError{File: scan.path, Offset: 0,
				Reason: fmt.Sprintf("segment sequence: expected %d after %d, found %d; a segment is missing", seqs[i-1]+1, seqs[i-1], seq)}
			in.problemSeg = i
			continue
		}
		if i > 0 && scan.end > 0 && !taggedVersion(scan.version) && taggedVersion(in.segs[i-1].version) {
			// Tagging is for the life of the log: once a segment is
			// tagged, the writer creates no untagged one after it.
			in.problem = &CorruptionError{File: scan.path, Offset: 0,
				Reason: fmt.Sprintf("segment format version %d after a version %d segment: expected a tagged segment, as the log was already shared by groups", scan.version, in.segs[i-1].version)}
			in.problemSeg = i
			continue
		}
		for _, r := range scan.records {
			if err := in.state.apply(r.record); err != nil {
				in.problem = &CorruptionError{File: scan.path, Offset: r.offset, Reason: err.Error()}
				in.problemSeg = i
				break
			}
			in.replayed++
			in.records[r.group]++
			switch r.typ {
			case recHardState:
				in.hsSeq[r.group] = seq
			case recSnapshotMark:
				in.smSeq[r.group] = seq
			}
		}
		if in.problem != nil || scan.problem == nil {
			continue
		}
		in.problemSeg = i
		newest := i == len(seqs)-1
		reason := scan.problem.Error()
		switch {
		case scan.end == 0:
			reason += "; the segment header is damaged"
		case scan.laterValid > 0:
			reason += fmt.Sprintf("; %d valid record(s) follow from offset %d, so this is not a torn tail", scan.laterValid, scan.laterValidAt)
		case !newest:
			reason += "; the segment is not the newest, so this is not a torn tail"
		case scan.notTorn != "":
			reason += "; " + scan.notTorn
		default:
			in.torn = &TornTail{File: scan.path, Offset: scan.end, Bytes: scan.junkEnd - scan.end}
		}
		in.problem = &CorruptionError{File: scan.path, Offset: scan.end, Reason: reason}
	}
	return in, nil
}

func (in *inspection) report(dir string) *Report {
	r := &Report{Dir: dir, Records: in.replayed, Problem: in.problem, TornTail: in.torn}
	groups := map[uint64]*GroupReport{}
	group := func(g uint64) *GroupReport {
		gr, ok := groups[g]
		if !ok {
			gr = &GroupReport{Group: g}
			groups[g] = gr
		}
		return gr
	}
	for g, st := range in.state.groups {
		gr := group(g)
		gr.Records, gr.Snapshot, gr.LastIndex = in.records[g], st.snap.Index, st.last
	}
	for _, s := range in.segs {
		for g, c := range s.maxCommit {
			gr := group(g)
			gr.Commit = max(gr.Commit, c)
		}
		r.Segments = append(r.Segments, SegmentReport{
			File: s.path, Seq: s.seq, Version: s.version, Size: s.size, Records: len(s.records),
			LastGoodOffset: s.end, DataEnd: s.dataEnd, Problem: s.problem,
		})
	}
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		r.Groups = append(r.Groups, *groups[g])
	}
	if gr, ok := groups[DefaultGroup]; ok {
		r.Commit, r.LastIndex = gr.Commit, gr.LastIndex
	}
	return r
}

// Verify scans the log in dir without changing anything and reports every
// segment and the first problem, classified exactly as Open classifies it.
// Run it on a stopped node: on a log being written it may catch the last
// write half-done and report it as a torn tail, or, mid-copy, as damage. A
// returned error means the directory could not be read; damage is reported
// in Report.Problem.
func Verify(dir string) (*Report, error) {
	in, err := inspect(dir)
	if err != nil {
		return nil, err
	}
	return in.report(dir), nil
}

// Read returns what Open would recover from the log in dir, without
// opening it for writing: no lock, no truncation, no new segment; other
// packages use it to look into a stopped node's data dir. A missing dir
// reads as an empty log; a torn tail is left out, as Open would cut it. At
// corruption Read returns the log up to the damage together with the
// *CorruptionError.
func Read(dir string) (*Recovered, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return &Recovered{}, nil
	}
	in, err := inspect(dir)
	if err != nil {
		return nil, err
	}
	rec := in.state.result(in.torn)
	if in.problem != nil && in.torn == nil {
		return rec, in.problem
	}
	return rec, nil
}

// RepairOptions changes what Repair may do.
type RepairOptions struct {
	// AllowCommittedLoss lets Repair cut below the commit index the log
	// records (Report.CutsCommitted). Only for a node that holds the only
	// copy of its data (a one-member cluster): a member of a larger
	// cluster whose log loses committed entries panics when the leader
	// sends it that commit index again, and must instead be removed,
	// wiped and added back under a new id.
	AllowCommittedLoss bool
}

// CutsCommittedError is Repair refusing a cut that would drop entries the
// log records as committed; it changed nothing.
type CutsCommittedError struct {
	Problem   *CorruptionError
	Group     uint64 // the first group whose committed entries the cut drops
	LastIndex uint64 // the group's log would end here after the cut
	Commit    uint64 // the newest commit index the log records for the group
}

func (e *CutsCommittedError) Error() string {
	return fmt.Sprintf("wal: repair: cutting at the damage would leave group %d's log ending at index %d, below its recorded commit index %d: "+
		"entries %d..%d were committed through this node and raft would panic on start (tocommit(%d) is out of range [lastIndex(%d)]); %v",
		e.Group, e.LastIndex, e.Commit, e.LastIndex+1, e.Commit, e.Commit, e.LastIndex, e.Problem)
}

// Repair makes the log in dir openable by cutting it after the last good
// record: the damaged segment is truncated at the first problem, and every
// later segment is removed (newest first, so a crash midway leaves a log
// that is still a prefix). It holds the directory lock, so it fails while a
// WAL has the log open. Writes after the cut are lost from this log; the
// Report says exactly what went. Unless opts allow it, Repair refuses,
// changing nothing, with a *CutsCommittedError when the cut would drop
// entries the log records as committed.
func Repair(dir string, opts RepairOptions) (*Report, error) {
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	in, err := inspect(dir)
	if err != nil {
		return nil, err
	}
	r := in.report(dir)
	if in.problem == nil {
		return r, nil
	}
	if g := r.cutsCommitted(); g != nil && !opts.AllowCommittedLoss {
		return r, &CutsCommittedError{Problem: in.problem, Group: g.Group, LastIndex: g.LastIndex, Commit: g.Commit}
	}
	fs := osFS{}
	k := in.problemSeg
	for i := len(in.segs) - 1; i > k; i-- {
		s := in.segs[i]
		if err := fs.Remove(s.path); err != nil {
			return r, fmt.Errorf("wal: repair: remove %s: %w", s.path, err)
		}
		if err := fs.SyncDir(dir); err != nil {
			return r, fmt.Errorf("wal: repair: sync %s: %w", dir, err)
		}
		r.Dropped = append(r.Dropped, Dropped{File: s.path, Removed: true, Bytes: s.dataEnd, Records: len(s.records) + s.laterValid})
	}

	s := in.segs[k]
	cut := in.problem.Offset
	dropped := Dropped{File: s.path, Offset: cut, Bytes: max(0, s.dataEnd-cut), Records: s.laterValid}
	for _, off := range s.records {
		if off >= cut {
			dropped.Records++
		}
	}
	if cut < segmentHeaderBytes {
		// Without a good header the segment holds nothing usable.
		dropped.Offset, dropped.Removed = 0, true
		if err := fs.Remove(s.path); err != nil {
			return r, fmt.Errorf("wal: repair: remove %s: %w", s.path, err)
		}
		if err := fs.SyncDir(dir); err != nil {
			return r, fmt.Errorf("wal: repair: sync %s: %w", dir, err)
		}
	} else if err := truncateDurably(s.path, cut); err != nil {
		return r, err
	}
	r.Dropped = append(r.Dropped, dropped)

	after, err := inspect(dir)
	if err != nil {
		return r, err
	}
	if after.problem != nil {
		return r, fmt.Errorf("wal: repair: log still damaged after the cut: %w", after.problem)
	}
	return r, nil
}

func truncateDurably(path string, size int64) error {
	f, err := osFS{}.OpenWrite(path)
	if err != nil {
		return fmt.Errorf("wal: repair: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("wal: repair: truncate %s to %d: %w", path, size, err)
	}
	if err := f.Datasync(); err != nil {
		return fmt.Errorf("wal: repair: sync %s: %w", path, err)
	}
	return nil
}

// String renders the report for the `tidal-server wal verify|repair`
// commands.
func (r *Report) String() string {
	var b []byte
	b = fmt.Appendf(b, "wal %s: %d segment(s), %d good record(s), last index %d, commit index %d\n", r.Dir, len(r.Segments), r.Records, r.LastIndex, r.Commit)
	for _, s := range r.Segments {
		b = fmt.Appendf(b, "  %s seq=%d version=%d size=%d records=%d last_good_offset=%d data_end=%d",
			filepath.Base(s.File), s.Seq, s.Version, s.Size, s.Records, s.LastGoodOffset, s.DataEnd)
		if s.Problem != "" {
			b = fmt.Appendf(b, " problem=%q", s.Problem)
		}
		b = append(b, '\n')
	}
	if len(r.Groups) > 1 || (len(r.Groups) == 1 && r.Groups[0].Group != DefaultGroup) {
		for _, g := range r.Groups {
			b = fmt.Appendf(b, "  group %d: records=%d snapshot=%d last_index=%d commit=%d\n", g.Group, g.Records, g.Snapshot, g.LastIndex, g.Commit)
		}
	}
	switch {
	case r.Problem == nil:
		b = append(b, "ok: no damage\n"...)
	case r.TornTail != nil:
		b = fmt.Appendf(b, "torn tail (open truncates it): %s at offset %d, %d byte(s)\n", r.TornTail.File, r.TornTail.Offset, r.TornTail.Bytes)
	default:
		b = fmt.Appendf(b, "damaged: %v\n", r.Problem)
	}
	for _, d := range r.Dropped {
		if d.Removed {
			b = fmt.Appendf(b, "dropped: removed %s (%d byte(s), %d decodable record(s))\n", d.File, d.Bytes, d.Records)
		} else {
			b = fmt.Appendf(b, "dropped: truncated %s at offset %d (%d byte(s), %d decodable record(s))\n", d.File, d.Offset, d.Bytes, d.Records)
		}
	}
	return string(b)
}
