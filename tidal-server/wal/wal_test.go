package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testOptions() Options {
	return Options{SegmentSize: 64 << 10, Logger: quiet}
}

// payload is deterministic, ~100 bytes, and differs by index and term so a
// stale or misplaced entry cannot pass for the right one.
func payload(index, term uint64) []byte {
	return fmt.Appendf(nil, "entry index=%08d term=%04d %s", index, term, bytes.Repeat([]byte{'a' + byte(index%26)}, 64))
}

func entries(first, last, term uint64) []Entry {
	var es []Entry
	for i := first; i <= last; i++ {
		es = append(es, Entry{Index: i, Term: term, Type: uint8(i % 3), Data: payload(i, term)})
	}
	return es
}

func mustOpen(t testing.TB, dir string, opts Options) (*WAL, *Recovered) {
	t.Helper()
	w, rec, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return w, rec
}

func mustSave(t testing.TB, w *WAL, b Batch) {
	t.Helper()
	if err := w.Save(context.Background(), b, true); err != nil {
		t.Fatalf("Save: %v", err)
	}
}

func mustClose(t testing.TB, w *WAL) {
	t.Helper()
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// reopen closes nothing: it opens dir fresh and closes it again, returning
// what was recovered.
func reopen(t testing.TB, dir string, opts Options) *Recovered {
	t.Helper()
	w, rec := mustOpen(t, dir, opts)
	mustClose(t, w)
	return rec
}

func equalEntries(t testing.TB, what string, got, want []Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: expected %d entries (%s), recovered %d (%s)", what, len(want), span(want), len(got), span(got))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Index != w.Index || g.Term != w.Term || g.Type != w.Type || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("%s: entry %d: expected {%d %d %d %q}, recovered {%d %d %d %q}",
				what, i, w.Index, w.Term, w.Type, w.Data, g.Index, g.Term, g.Type, g.Data)
		}
	}
}

func span(es []Entry) string {
	if len(es) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d..%d", es[0].Index, es[len(es)-1].Index)
}

func segPath(dir string, seq uint64) string { return filepath.Join(dir, segmentName(seq)) }

func TestSaveAndRecover(t *testing.T) {
	dir := t.TempDir()
	w, rec := mustOpen(t, dir, testOptions())
	if len(rec.Entries) != 0 || rec.HardState != (HardState{}) || rec.Snapshot != (SnapshotMark{}) || rec.TornTail != nil {
		t.Fatalf("fresh log: expected nothing recovered, got %+v", rec)
	}
	mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Vote: 2, Commit: 0}})
	mustSave(t, w, Batch{Entries: entries(4, 10, 1), HardState: &HardState{Term: 1, Vote: 2, Commit: 7}})
	mustSave(t, w, Batch{HardState: &HardState{Term: 1, Vote: 2, Commit: 10}})
	mustClose(t, w)

	rec = reopen(t, dir, testOptions())
	equalEntries(t, "after reopen", rec.Entries, entries(1, 10, 1))
	if want := (HardState{Term: 1, Vote: 2, Commit: 10}); rec.HardState != want {
		t.Fatalf("hard state: expected %+v, recovered %+v", want, rec.HardState)
	}
	if rec.TornTail != nil {
		t.Fatalf("clean close: expected no torn tail, got %+v", rec.TornTail)
	}

	// Appending continues where the log ended.
	w, _ = mustOpen(t, dir, testOptions())
	mustSave(t, w, Batch{Entries: entries(11, 12, 2)})
	mustClose(t, w)
	rec = reopen(t, dir, testOptions())
	equalEntries(t, "after second session", rec.Entries, append(entries(1, 10, 1), entries(11, 12, 2)...))
}

func TestConflictingSuffixIsReplaced(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 2048 // a few entries per segment: the rewrite lands in a later segment
	w, _ := mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(1, 40, 1)})
	mustSave(t, w, Batch{Entries: entries(41, 60, 1)})
	// A new leader at term 2 overwrites from index 25.
	mustSave(t, w, Batch{Entries: entries(25, 30, 2)})
	mustSave(t, w, Batch{Entries: entries(31, 33, 2)})
	if got := len(w.Segments()); got < 3 {
		t.Fatalf("expected the log to span at least 3 segments, it spans %d", got)
	}
	mustClose(t, w)

	want := append(entries(1, 24, 1), entries(25, 33, 2)...)
	rec := reopen(t, dir, opts)
	equalEntries(t, "after suffix rewrite", rec.Entries, want)

	// And again, truncating the truncation.
	w, _ = mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(28, 29, 3)})
	mustClose(t, w)
	rec = reopen(t, dir, opts)
	equalEntries(t, "after second rewrite", rec.Entries, append(want[:27:27], entries(28, 29, 3)...))
}

func TestSaveRejectsBrokenIndexes(t *testing.T) {
	w, _ := mustOpen(t, t.TempDir(), testOptions())
	defer mustClose(t, w)
	ctx := context.Background()

	if err := w.Save(ctx, Batch{Entries: entries(2, 3, 1)}, true); err == nil {
		t.Fatal("first entry at index 2 of an empty log: expected an error, got nil")
	}
	mustSave(t, w, Batch{Entries: entries(1, 5, 1)})
	if err := w.Save(ctx, Batch{Entries: entries(7, 8, 1)}, true); err == nil {
		t.Fatal("gap after 5: expected an error, got nil")
	}
	gappy := []Entry{{Index: 6, Term: 1}, {Index: 8, Term: 1}}
	if err := w.Save(ctx, Batch{Entries: gappy}, true); err == nil {
		t.Fatal("non-consecutive batch: expected an error, got nil")
	}
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 4, Term: 1}})
	if err := w.Save(ctx, Batch{Entries: entries(3, 3, 2)}, true); err == nil {
		t.Fatal("entry at or below the snapshot mark: expected an error, got nil")
	}
	if err := w.Save(ctx, Batch{Snapshot: &SnapshotMark{Index: 3, Term: 1}}, true); err == nil {
		t.Fatal("snapshot mark going backwards: expected an error, got nil")
	}
	// Rejected batches left no trace: the log is 1..5 with a mark at 4.
	mustSave(t, w, Batch{Entries: entries(6, 6, 1)})
}

func TestHardStateAndSnapshotMarkRecovery(t *testing.T) {
	dir := t.TempDir()
	w, _ := mustOpen(t, dir, testOptions())
	mustSave(t, w, Batch{Entries: entries(1, 20, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 5}})
	mustSave(t, w, Batch{HardState: &HardState{Term: 2, Vote: 3, Commit: 12}})
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 12, Term: 1}})
	mustClose(t, w)

	rec := reopen(t, dir, testOptions())
	if want := (SnapshotMark{Index: 12, Term: 1}); rec.Snapshot != want {
		t.Fatalf("snapshot mark: expected %+v, recovered %+v", want, rec.Snapshot)
	}
	if want := (HardState{Term: 2, Vote: 3, Commit: 12}); rec.HardState != want {
		t.Fatalf("hard state: expected %+v, recovered %+v", want, rec.HardState)
	}
	equalEntries(t, "entries above the mark", rec.Entries, entries(13, 20, 1))

	// A follower receives a snapshot beyond its log: the log empties and
	// continues after the mark.
	w, _ = mustOpen(t, dir, testOptions())
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 100, Term: 4}, HardState: &HardState{Term: 4, Commit: 100}})
	if err := w.Save(context.Background(), Batch{Entries: entries(21, 21, 4)}, true); err == nil {
		t.Fatal("entry 21 after a mark at 100: expected an error, got nil")
	}
	mustSave(t, w, Batch{Entries: entries(101, 103, 4)})
	mustClose(t, w)
	rec = reopen(t, dir, testOptions())
	if want := (SnapshotMark{Index: 100, Term: 4}); rec.Snapshot != want {
		t.Fatalf("snapshot mark: expected %+v, recovered %+v", want, rec.Snapshot)
	}
	equalEntries(t, "after a mark beyond the log", rec.Entries, entries(101, 103, 4))
}

func TestSegmentRollover(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 4096
	w, _ := mustOpen(t, dir, opts)
	var want []Entry
	for i := uint64(1); i <= 200; i += 5 {
		es := entries(i, i+4, 1)
		mustSave(t, w, Batch{Entries: es})
		want = append(want, es...)
	}
	// One batch larger than a whole segment is written alone and grows
	// its segment.
	big := entries(201, 260, 1)
	mustSave(t, w, Batch{Entries: big})
	want = append(want, big...)
	mustClose(t, w)

	seqs, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) < 6 {
		t.Fatalf("expected ~200 entries of ~130 bytes to fill at least 6 segments of 4 KiB, found %d", len(seqs))
	}
	for i, seq := range seqs {
		if seq != uint64(i) {
			t.Fatalf("segment sequence: expected %d, found %d", i, seq)
		}
		st, err := os.Stat(segPath(dir, seq))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() < opts.SegmentSize {
			t.Fatalf("segment %d: expected preallocation to %d bytes, size is %d", seq, opts.SegmentSize, st.Size())
		}
	}
	equalEntries(t, "across segments", reopen(t, dir, opts).Entries, want)
}

func TestConcurrentSaveAllRecovered(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 256 << 10
	w, _ := mustOpen(t, dir, opts)

	const writers, each = 32, 40
	// Index allocation and Stage under one lock; the wait outside it, so
	// writers share fdatasyncs.
	var mu sync.Mutex
	next := uint64(1)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Go(func() {
			for range each {
				mu.Lock()
				idx := next
				p, err := w.Stage(Batch{Entries: []Entry{{Index: idx, Term: 1, Data: payload(idx, uint64(g))}}}, true)
				if err == nil {
					next++
				}
				mu.Unlock()
				if err == nil {
					err = p.Wait(context.Background())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := w.Stats()
	mustClose(t, w)

	rec := reopen(t, dir, opts)
	if len(rec.Entries) != writers*each {
		t.Fatalf("expected %d entries, recovered %d", writers*each, len(rec.Entries))
	}
	for i, e := range rec.Entries {
		if e.Index != uint64(i+1) || !bytes.HasPrefix(e.Data, fmt.Appendf(nil, "entry index=%08d", i+1)) {
			t.Fatalf("entry %d: expected index %d with its own payload, recovered index %d data %q", i, i+1, e.Index, e.Data)
		}
	}
	if st.Batches != writers*each || st.Records != writers*each {
		t.Fatalf("stats: expected %d batches and records, got %+v", writers*each, st)
	}
	t.Logf("%d batches in %d fsyncs (%.1f per fsync)", st.Batches, st.Fsyncs, float64(st.Batches)/float64(st.Fsyncs))
}

func TestCompaction(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 4096
	w, _ := mustOpen(t, dir, opts)
	// The only hard state lives in segment 0; compaction must keep it.
	mustSave(t, w, Batch{Entries: entries(1, 5, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 3}})
	for i := uint64(6); i <= 300; i += 5 {
		mustSave(t, w, Batch{Entries: entries(i, i+4, 1)})
	}
	if err := w.Compact(10); err == nil {
		t.Fatal("compact with no snapshot mark: expected an error, got nil")
	}
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 150, Term: 1}})
	if err := w.Compact(152); err == nil {
		t.Fatal("compact above mark+1: expected an error, got nil")
	}
	before := w.Segments()
	if err := w.Compact(151); err != nil {
		t.Fatal(err)
	}
	after := w.Segments()
	if len(after) >= len(before) {
		t.Fatalf("expected segments to be removed: before %v, after %v", before, after)
	}
	// Every removed segment held only entries below 151, and the first
	// kept one holds some entry at or above it.
	for _, seq := range before[:len(before)-len(after)] {
		if _, err := os.Stat(segPath(dir, seq)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("segment %d: expected removed, stat says %v", seq, err)
		}
	}
	scan, err := readSegment(dir, after[0])
	if err != nil {
		t.Fatal(err)
	}
	maxIdx := uint64(0)
	for _, r := range scan.records {
		if r.typ == recEntry {
			maxIdx = max(maxIdx, decodeEntry(r.payload).Index)
		}
	}
	if maxIdx < 151 {
		t.Fatalf("first kept segment %d holds entries up to %d only; it should have been removed", after[0], maxIdx)
	}
	mustSave(t, w, Batch{Entries: entries(301, 305, 1)})
	mustClose(t, w)

	rec := reopen(t, dir, opts)
	equalEntries(t, "after compaction", rec.Entries, entries(151, 305, 1))
	if want := (HardState{Term: 1, Vote: 1, Commit: 3}); rec.HardState != want {
		t.Fatalf("hard state: expected %+v kept through compaction, recovered %+v", want, rec.HardState)
	}
	if want := (SnapshotMark{Index: 150, Term: 1}); rec.Snapshot != want {
		t.Fatalf("snapshot mark: expected %+v, recovered %+v", want, rec.Snapshot)
	}

	// Compacting everything but the active segment, twice over reopen.
	w, _ = mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 305, Term: 1}})
	if err := w.Compact(306); err != nil {
		t.Fatal(err)
	}
	if got := w.Segments(); len(got) != 1 {
		t.Fatalf("expected only the active segment left, found %v", got)
	}
	mustSave(t, w, Batch{Entries: entries(306, 310, 2)})
	mustClose(t, w)
	rec = reopen(t, dir, opts)
	equalEntries(t, "after full compaction", rec.Entries, entries(306, 310, 2))
	if rec.HardState.Commit != 3 || rec.Snapshot.Index != 305 {
		t.Fatalf("expected hard state commit 3 and mark 305 to survive, recovered %+v %+v", rec.HardState, rec.Snapshot)
	}
}

func TestOpenRefusesSecondOpener(t *testing.T) {
	dir := t.TempDir()
	w, _ := mustOpen(t, dir, testOptions())
	defer mustClose(t, w)
	if _, _, err := Open(dir, testOptions()); err == nil {
		t.Fatal("second Open of a locked log: expected an error, got nil")
	}
	if _, err := Repair(dir, RepairOptions{}); err == nil {
		t.Fatal("Repair of an open log: expected an error, got nil")
	}
}

func TestCloseStopsTheWriterAndRefusesSaves(t *testing.T) {
	w, _ := mustOpen(t, t.TempDir(), testOptions())
	mustSave(t, w, Batch{Entries: entries(1, 1, 1)})
	if n := writerGoroutines(); n < 1 {
		t.Fatalf("expected the writer goroutine to run while the log is open, found %d", n)
	}
	mustClose(t, w)
	// Close returns only after the writer goroutine has exited. Counting
	// all goroutines would also count other tests' winding down (it made
	// this test flaky); the writer's own frame is what must be gone.
	if n := writerGoroutines(); n != 0 {
		t.Fatalf("expected no writer goroutine after Close, found %d", n)
	}
	if err := w.Save(context.Background(), Batch{Entries: entries(1, 1, 1)}, true); !errors.Is(err, ErrClosed) {
		t.Fatalf("Save after Close: expected ErrClosed, got %v", err)
	}
}

func TestBatchTimeoutGathers(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.BatchTimeout = 50e6 // 50ms
	w, _ := mustOpen(t, dir, opts)
	var ps []*Pending
	for i := uint64(1); i <= 20; i++ {
		p, err := w.Stage(Batch{Entries: entries(i, i, 1)}, true)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, w)
	equalEntries(t, "with a batch timeout", reopen(t, dir, opts).Entries, entries(1, 20, 1))
}

// writerGoroutines counts goroutines running the WAL's writer loop.
func writerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "wal.(*WAL).run(")
}
