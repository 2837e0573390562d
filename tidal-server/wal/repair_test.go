package wal

import (
	"errors"
	"os"
	"testing"
)

// committedLog writes entries 1..60 over several small segments, each
// batch with a HardState whose commit index trails its entries by one
// batch, as a raft follower's does.
func committedLog(t *testing.T) (string, Options, []Entry) {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 2048
	w, _ := mustOpen(t, dir, opts)
	var all []Entry
	for i := uint64(1); i <= 60; i += 3 {
		es := entries(i, i+2, 1)
		mustSave(t, w, Batch{Entries: es, HardState: &HardState{Term: 1, Commit: i - 1}})
		all = append(all, es...)
	}
	mustClose(t, w)
	return dir, opts, all
}

// damage flips a byte inside the payload of record i of segment seq and
// returns that record's offset.
func damage(t *testing.T, dir string, seq uint64, i int) int64 {
	t.Helper()
	data, err := os.ReadFile(segPath(dir, seq))
	if err != nil {
		t.Fatal(err)
	}
	rec := scanSegment("", seq, data).records[i]
	data[rec.offset+recordHeaderSize+3] ^= 0xff
	if err := os.WriteFile(segPath(dir, seq), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return rec.offset
}

// Regression: repair used to cut below the commit index a
// node had recorded; raft on that node then panicked on every start
// ("tocommit(N) is out of range [lastIndex(M)]"). Repair now refuses and
// changes nothing.
func TestRepairRefusesToCutCommittedEntries(t *testing.T) {
	dir, _, _ := committedLog(t)
	damage(t, dir, 1, 1)
	before := map[uint64][]byte{}
	seqs, _ := listSegments(dir)
	for _, seq := range seqs {
		before[seq], _ = os.ReadFile(segPath(dir, seq))
	}

	v, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !v.CutsCommitted() || v.Commit != 57 || v.LastIndex >= v.Commit {
		t.Fatalf("expected the report to say a cut drops committed entries (commit 57, last index below it), got commit %d last index %d problem %v",
			v.Commit, v.LastIndex, v.Problem)
	}

	r, err := Repair(dir, RepairOptions{})
	var cut *CutsCommittedError
	if !errors.As(err, &cut) || cut.Commit != 57 || cut.LastIndex != v.LastIndex {
		t.Fatalf("expected *CutsCommittedError at commit 57 / last index %d, got %v", v.LastIndex, err)
	}
	if r == nil || len(r.Dropped) != 0 {
		t.Fatalf("expected a report with nothing dropped, got %+v", r)
	}
	for _, seq := range seqs {
		if after, _ := os.ReadFile(segPath(dir, seq)); string(after) != string(before[seq]) {
			t.Fatalf("refused repair changed segment %d", seq)
		}
	}

	// The only copy of the data: the operator may accept the loss.
	r, err = Repair(dir, RepairOptions{AllowCommittedLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Dropped) == 0 {
		t.Fatal("repair allowed to lose committed entries dropped nothing")
	}
	if after, err := Verify(dir); err != nil || after.Problem != nil {
		t.Fatalf("after repair: expected a clean log, got %v / %v", err, after.Problem)
	}
}

// Damage above the recorded commit index (the newest, unsynced write
// persisted out of order) is cut: nothing committed is lost, and the
// repaired log replays every committed entry.
func TestRepairCutsAboveTheCommitIndex(t *testing.T) {
	dir, opts, all := committedLog(t)
	seqs, _ := listSegments(dir)
	newest := seqs[len(seqs)-1]
	data, _ := os.ReadFile(segPath(dir, newest))
	recs := scanSegment("", newest, data).records
	// The last batch is entries 58..60 and a HardState (commit 57); damage
	// its first entry: valid records follow, so this is not a torn tail.
	damage(t, dir, newest, len(recs)-4)

	v, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v.Problem == nil || v.TornTail != nil || v.CutsCommitted() || v.Commit != 57 || v.LastIndex != 57 {
		t.Fatalf("expected corruption that cuts nothing committed (commit 57, last index 57), got problem %v torn %+v commit %d last %d",
			v.Problem, v.TornTail, v.Commit, v.LastIndex)
	}
	if _, err := Repair(dir, RepairOptions{}); err != nil {
		t.Fatal(err)
	}
	equalEntries(t, "after repair", reopen(t, dir, opts).Entries, all[:57])
}
