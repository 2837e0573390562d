package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeGoldenScenario writes a fixed single-group history through the
// single-group API: batches across several segments, a snapshot mark, a
// truncating re-append, a reopen and a compaction. It is the scenario the
// files in testdata/v1log were written from by the release before group
// tagging.
func writeGoldenScenario(t *testing.T, dir string) {
	t.Helper()
	opts := Options{SegmentSize: 4096, Logger: quiet}
	w, _ := mustOpen(t, dir, opts)
	data := func(i, term uint64) []byte {
		return fmt.Appendf(nil, "golden entry %d term %d %s", i, term, bytes.Repeat([]byte{'g'}, int(i%40)+100))
	}
	ents := func(first, last, term uint64) []Entry {
		var es []Entry
		for i := first; i <= last; i++ {
			es = append(es, Entry{Index: i, Term: term, Type: uint8(i % 3), Data: data(i, term)})
		}
		return es
	}
	mustSave(t, w, Batch{Entries: ents(1, 10, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 5}})
	for i := uint64(11); i <= 60; i += 5 {
		mustSave(t, w, Batch{Entries: ents(i, i+4, 2), HardState: &HardState{Term: 2, Vote: 1, Commit: i}})
	}
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 30, Term: 2}})
	mustSave(t, w, Batch{Entries: ents(50, 55, 3), HardState: &HardState{Term: 3, Vote: 2, Commit: 52}})
	mustClose(t, w)
	w, _ = mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: ents(56, 70, 3), HardState: &HardState{Term: 3, Vote: 2, Commit: 65}})
	if err := w.Compact(31); err != nil {
		t.Fatal(err)
	}
	mustSave(t, w, Batch{Entries: ents(71, 72, 3)})
	mustClose(t, w)
}

// A log of one group written by this build is byte for byte the log the
// release before group tagging wrote for the same calls (the files in
// testdata/v1log), so that release still opens a `--shards 1` data dir.
func TestSingleGroupLogIsByteIdenticalToThePreviousFormat(t *testing.T) {
	dir := t.TempDir()
	writeGoldenScenario(t, dir)
	golden := filepath.Join("testdata", "v1log")
	want, err := listSegments(golden)
	if err != nil {
		t.Fatal(err)
	}
	got, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("segments: expected %v (testdata/v1log), this build left %v", want, got)
	}
	for _, seq := range want {
		g, err := os.ReadFile(filepath.Join(golden, segmentName(seq)))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, segmentName(seq)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(g, b) {
			i := 0
			for i < min(len(g), len(b)) && g[i] == b[i] {
				i++
			}
			t.Fatalf("%s: differs from the previous format's file from offset %d (sizes %d and %d)", segmentName(seq), i, len(g), len(b))
		}
	}
}

// copyDir copies the segment files of src into a fresh directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	seqs, err := listSegments(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range seqs {
		b, err := os.ReadFile(filepath.Join(src, segmentName(seq)))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, segmentName(seq)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// A log of the previous format opens as group 1: its untagged records are
// DefaultGroup's, in Recovered's top-level fields and in Groups.
func TestPreviousFormatLogOpensAsGroupOne(t *testing.T) {
	dir := copyDir(t, filepath.Join("testdata", "v1log"))
	w, rec := mustOpen(t, dir, Options{SegmentSize: 4096, Logger: quiet})
	if len(rec.Groups) != 1 {
		t.Fatalf("groups: expected only group 1, recovered %v", slices.Sorted(mapsKeys(rec.Groups)))
	}
	one := rec.Groups[DefaultGroup]
	if rec.Snapshot != (SnapshotMark{Index: 30, Term: 2}) || rec.HardState != (HardState{Term: 3, Vote: 2, Commit: 65}) {
		t.Fatalf("expected mark {30 2} and hard state {3 2 65}, recovered %+v and %+v", rec.Snapshot, rec.HardState)
	}
	if one.Snapshot != rec.Snapshot || one.HardState != rec.HardState || len(one.Entries) != len(rec.Entries) {
		t.Fatalf("Groups[1] %+v differs from the top-level fields", one)
	}
	var idx []uint64
	for _, e := range rec.Entries {
		idx = append(idx, e.Index)
		want := uint64(2)
		if e.Index >= 50 {
			want = 3
		}
		if e.Term != want {
			t.Fatalf("entry %d: expected term %d, recovered %d", e.Index, want, e.Term)
		}
	}
	if len(idx) != 42 || idx[0] != 31 || idx[41] != 72 {
		t.Fatalf("expected entries 31..72, recovered %d from %v", len(idx), idx[:min(3, len(idx))])
	}
	// Writing on as group 1 keeps the log in the previous format.
	mustSave(t, w, Batch{Entries: []Entry{{Index: 73, Term: 3}}})
	mustClose(t, w)
	previousRelease(t, func() {
		if rec := reopen(t, dir, Options{SegmentSize: 4096, Logger: quiet}); len(rec.Entries) != 43 {
			t.Fatalf("the previous release reading it back: expected 43 entries, recovered %d", len(rec.Entries))
		}
	})
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// previousRelease runs fn as the release before group tagging reads
// segments: version 1 only.
func previousRelease(t *testing.T, fn func()) {
	t.Helper()
	defer func() { readVersion = FormatVersion }()
	readVersion = untaggedVersion
	fn()
}

// The first record of a group other than 1 starts a new segment in the
// tagged version; the untagged segments before it are left as they were,
// and the release before tagging refuses the log cleanly, naming the
// first tagged segment and its version.
func TestFirstOtherGroupStartsATaggedSegment(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	w, _ := mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Commit: 2}})
	before, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Group(2).Save(context.Background(), Batch{Entries: entries(1, 2, 1)}, true); err != nil {
		t.Fatal(err)
	}
	mustSave(t, w, Batch{Entries: entries(4, 4, 1)})
	if got := w.Segments(); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("segments: expected [0 1] (the tagged batch rolled over), got %v", got)
	}
	mustClose(t, w)
	after, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("the untagged segment changed after the log became tagged")
	}
	r, err := Verify(dir)
	if err != nil || r.Problem != nil {
		t.Fatalf("Verify: %v %v", err, r.Problem)
	}
	if r.Segments[0].Version != 1 || r.Segments[1].Version != FormatVersion {
		t.Fatalf("segment versions: expected 1 and %d, got %d and %d", FormatVersion, r.Segments[0].Version, r.Segments[1].Version)
	}
	rec := reopen(t, dir, opts)
	equalEntries(t, "group 1", rec.Entries, entries(1, 4, 1))
	equalEntries(t, "group 2", rec.Groups[2].Entries, entries(1, 2, 1))

	previousRelease(t, func() {
		_, _, err := Open(dir, opts)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != segPath(dir, 1) || fe.Found != FormatVersion {
			t.Fatalf("the previous release opening a tagged log: expected a *FormatError for %s version %d, got %v", segPath(dir, 1), FormatVersion, err)
		}
		for _, want := range []string{segPath(dir, 1), fmt.Sprintf("format version %d is newer", FormatVersion), "versions 1 to 1"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("message %q does not say %q", err, want)
			}
		}
		if err := CheckFormat(dir); !errors.As(err, &fe) {
			t.Fatalf("CheckFormat under the previous release: expected a *FormatError, got %v", err)
		}
	})
	// Once tagged, tagged for good: group 1 alone keeps writing tagged
	// records.
	w, _ = mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(5, 5, 1)})
	mustClose(t, w)
	data, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment(segPath(dir, 1), 1, data)
	for _, r := range scan.records {
		if !r.tagged {
			t.Fatalf("an untagged record at %d of the tagged segment", r.offset)
		}
	}
}

// A record whose tagging does not match its segment's version is
// damage, and so is an untagged segment after a tagged one.
func TestTaggingMustMatchTheSegmentVersion(t *testing.T) {
	tagged := encoder{tagged: true, group: 5}
	for _, c := range []struct {
		name string
		seg  []byte
		want string
	}{
		{"tagged record in version 1", tagged.entry(appendSegmentHeader(nil, 0, untaggedVersion), Entry{Index: 1}), "expected untagged records only"},
		{"untagged record in version 2", appendEntryRecord(appendSegmentHeader(nil, 0, FormatVersion), Entry{Index: 1}), "expected group-tagged records only"},
	} {
		scan := scanSegment("seg", 0, append(c.seg, make([]byte, 64)...))
		if scan.problem == nil || !strings.Contains(scan.problem.Error(), c.want) || scan.end != segmentHeaderBytes {
			t.Fatalf("%s: expected a problem at %d saying %q, got %v at %d", c.name, segmentHeaderBytes, c.want, scan.problem, scan.end)
		}
	}
	segs := map[uint64][]byte{
		0: tagged.entry(appendSegmentHeader(nil, 0, FormatVersion), Entry{Index: 1}),
		1: appendEntryRecord(appendSegmentHeader(nil, 1, untaggedVersion), Entry{Index: 1}),
	}
	in, err := inspectSegments([]uint64{0, 1}, func(seq uint64) (*segmentScan, error) {
		return scanSegment(segmentName(seq), seq, segs[seq]), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if in.problem == nil || in.problem.File != segmentName(1) || !strings.Contains(in.problem.Reason, "expected a tagged segment") {
		t.Fatalf("an untagged segment after a tagged one: expected corruption in %s, got %v", segmentName(1), in.problem)
	}
}

// Replay checks the index rules per group, and its errors name the group
// along with the file and offset.
func TestCorruptionNamesTheGroup(t *testing.T) {
	g1, g4 := encoder{tagged: true, group: 1}, encoder{tagged: true, group: 4}
	seg := appendSegmentHeader(nil, 0, FormatVersion)
	seg = g1.entry(seg, Entry{Index: 1, Term: 1})
	seg = g4.entry(seg, Entry{Index: 1, Term: 1})
	seg = g1.entry(seg, Entry{Index: 2, Term: 1}) // group 1's index 2 after group 4's 1: fine
	bad := int64(len(seg))
	seg = g4.entry(seg, Entry{Index: 3, Term: 1}) // a gap in group 4
	dir := writeSegment(t, append(seg, make([]byte, 256)...))
	_, _, err := Open(dir, testOptions())
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != segPath(dir, 0) || ce.Offset != bad || !strings.Contains(ce.Reason, "group 4: entry index 3") {
		t.Fatalf("expected corruption in %s at %d naming group 4, got %v", segPath(dir, 0), bad, err)
	}
}

// groupModel is what a group's log must recover to.
type groupModel struct {
	entries []Entry
	mark    SnapshotMark
	hs      HardState
	last    uint64
}

func (m *groupModel) append(es []Entry) {
	first := es[0].Index
	for len(m.entries) > 0 && m.entries[len(m.entries)-1].Index >= first {
		m.entries = m.entries[:len(m.entries)-1]
	}
	m.entries = append(m.entries, es...)
	m.last = es[len(es)-1].Index
}

func (m *groupModel) snapshot(sm SnapshotMark) {
	m.mark = sm
	for len(m.entries) > 0 && m.entries[0].Index <= sm.Index {
		m.entries = m.entries[1:]
	}
	m.last = max(m.last, sm.Index)
}

// TestGroupsInterleavedRecoverExactly is a seeded property test: random
// interleavings of appends, truncating re-appends, hard states, snapshot
// marks and compactions of several groups in one log, across rollovers of
// small segments and reopens, recover every group exactly. Each run starts
// with group 1 alone (untagged segments), then the others join.
func TestGroupsInterleavedRecoverExactly(t *testing.T) {
	groups := []uint64{0, 1, 2, 3, 9, 300, 1 << 20}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			dir := t.TempDir()
			opts := Options{SegmentSize: 4096, NoSync: true, Logger: quiet}
			w, _ := mustOpen(t, dir, opts)
			models := map[uint64]*groupModel{}
			term := uint64(1)
			check := func(step int) {
				t.Helper()
				mustClose(t, w)
				var rec *Recovered
				w, rec = mustOpen(t, dir, opts)
				if len(rec.Groups) != len(models) {
					t.Fatalf("step %d: expected groups %v, recovered %v", step, slices.Sorted(mapsKeys(models)), slices.Sorted(mapsKeys(rec.Groups)))
				}
				for g, m := range models {
					got := rec.Groups[g]
					equalEntries(t, fmt.Sprintf("step %d group %d", step, g), got.Entries, m.entries)
					if got.HardState != m.hs || got.Snapshot != m.mark {
						t.Fatalf("step %d group %d: expected hard state %+v and mark %+v, recovered %+v and %+v", step, g, m.hs, m.mark, got.HardState, got.Snapshot)
					}
				}
				if m := models[DefaultGroup]; m != nil {
					equalEntries(t, fmt.Sprintf("step %d top level", step), rec.Entries, m.entries)
				}
				r, err := Verify(dir)
				if err != nil || r.Problem != nil {
					t.Fatalf("step %d: Verify: %v %v", step, err, r.Problem)
				}
				for _, gr := range r.Groups {
					if m := models[gr.Group]; m == nil || gr.LastIndex != m.last || gr.Snapshot != m.mark.Index {
						t.Fatalf("step %d: Verify's group line %+v, expected last index %d and mark %d", step, gr, m.last, m.mark.Index)
					}
				}
			}
			for step := range 700 {
				g := uint64(DefaultGroup)
				if step >= 60 {
					g = groups[rng.IntN(len(groups))]
				}
				m := models[g]
				if m == nil {
					m = &groupModel{}
				}
				var b Batch
				switch op := rng.IntN(20); {
				case op < 12: // append, sometimes over a suffix
					first := m.last + 1
					if len(m.entries) > 0 && rng.IntN(4) == 0 {
						first = m.entries[0].Index + rng.Uint64N(uint64(len(m.entries)))
						term++
					}
					for i := range 1 + rng.IntN(5) {
						idx := first + uint64(i)
						b.Entries = append(b.Entries, Entry{Index: idx, Term: term, Type: uint8(idx % 3), Data: bytes.Repeat([]byte{byte(g), byte(idx)}, rng.IntN(120))})
					}
					if rng.IntN(2) == 0 {
						b.HardState = &HardState{Term: term, Vote: g, Commit: rng.Uint64N(b.Entries[len(b.Entries)-1].Index + 1)}
					}
				case op < 14:
					b.HardState = &HardState{Term: term, Vote: 7, Commit: m.last}
				case op < 17: // a snapshot mark, sometimes past the last entry
					b.Snapshot = &SnapshotMark{Index: m.mark.Index + rng.Uint64N(m.last-m.mark.Index+3), Term: term}
				default: // compact this group below its mark
					if _, ok := models[g]; !ok {
						continue
					}
					if err := w.Group(g).Compact(rng.Uint64N(m.mark.Index + 2)); err != nil {
						t.Fatalf("step %d: group %d: Compact: %v", step, g, err)
					}
					continue
				}
				var err error
				if g == DefaultGroup && rng.IntN(2) == 0 {
					err = w.Save(context.Background(), b, true)
				} else {
					err = w.Group(g).Save(context.Background(), b, true)
				}
				if err != nil {
					t.Fatalf("step %d: group %d: Save: %v", step, g, err)
				}
				models[g] = m
				if b.Snapshot != nil {
					m.snapshot(*b.Snapshot)
				}
				if len(b.Entries) > 0 {
					m.append(b.Entries)
				}
				if b.HardState != nil {
					m.hs = *b.HardState
				}
				if rng.IntN(40) == 0 {
					check(step)
				}
			}
			check(700)
			if segs := w.Segments(); segs[0] == 0 {
				t.Logf("no segment was compacted away (%d live)", len(segs))
			}
			mustClose(t, w)
		})
	}
}

// A segment is removed only when no group needs it: an idle group whose
// entries sit in an old segment keeps it (and every segment after it)
// alive until that group compacts too.
func TestIdleGroupPinsItsSegments(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 4096, Logger: quiet}
	w, _ := mustOpen(t, dir, opts)
	ctx := context.Background()
	mustSave(t, w, Batch{Entries: entries(1, 3, 1)}) // segment 0, untagged
	idle := w.Group(2)
	if err := idle.Save(ctx, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Commit: 3}}, true); err != nil {
		t.Fatal(err)
	}
	for i := uint64(4); i <= 200; i += 5 {
		mustSave(t, w, Batch{Entries: entries(i, i+4, 1)})
	}
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 190, Term: 1}})
	all := w.Segments()
	if len(all) < 5 {
		t.Fatalf("fixture: expected at least 5 segments, got %v", all)
	}
	if err := w.Compact(191); err != nil {
		t.Fatal(err)
	}
	if got := w.Segments(); !slices.Equal(got, all[1:]) {
		t.Fatalf("group 1 compacted while group 2 is idle in segment 1: expected segments %v, got %v", all[1:], got)
	}
	if err := idle.Compact(1); err != nil {
		t.Fatal(err)
	}
	if got := w.Segments(); !slices.Equal(got, all[1:]) {
		t.Fatalf("group 2 compacted below 1: expected segments %v kept, got %v", all[1:], got)
	}
	if err := idle.Compact(4); err == nil {
		t.Fatal("group 2 compacting past entries no snapshot covers: expected an error")
	}
	if err := idle.Save(ctx, Batch{Snapshot: &SnapshotMark{Index: 3, Term: 1}}, true); err != nil {
		t.Fatal(err)
	}
	if err := idle.Compact(4); err != nil {
		t.Fatal(err)
	}
	got := w.Segments()
	if len(got) != 1 || got[0] != all[len(all)-1] {
		t.Fatalf("both groups compacted: expected only the newest segment %d, got %v", all[len(all)-1], got)
	}
	mustClose(t, w)
	rec := reopen(t, dir, opts)
	equalEntries(t, "group 1", rec.Entries, entries(191, 203, 1))
	two := rec.Groups[2]
	if len(two.Entries) != 0 || two.Snapshot != (SnapshotMark{Index: 3, Term: 1}) || two.HardState != (HardState{Term: 1, Commit: 3}) {
		t.Fatalf("group 2: expected mark {3 1}, hard state {1 0 3} and no entries, recovered %+v", two)
	}
}

// Concurrent Saves of 64 groups held behind one fdatasync go out
// together: fewer syncs than Saves, and every Save durable.
func TestConcurrentGroupSavesShareSyncs(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	w, fs := openFault(t, dir, opts)
	entered, release := fs.gate()
	first := make(chan error, 1)
	go func() { first <- w.Group(0).Save(context.Background(), Batch{Entries: entries(1, 1, 1)}, true) }()
	<-entered // the writer is inside an fdatasync on group 0's behalf
	errs := make(chan error, 63)
	var wg sync.WaitGroup
	for g := uint64(1); g < 64; g++ {
		wg.Go(func() {
			errs <- w.Group(g).Save(context.Background(), Batch{Entries: entries(1, 1, g), HardState: &HardState{Term: g, Commit: 1}}, true)
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		n := len(w.queue)
		w.mu.Unlock()
		if n == 63 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of 63 Saves queued", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	go func() {
		for range entered { // later syncs pass the open gate; keep its buffer from filling
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := w.Stats()
	mustClose(t, w)
	close(entered)
	if st.Batches != 64 || st.Fsyncs >= st.Batches {
		t.Fatalf("expected 64 Saves committed with fewer fdatasyncs, got %+v", st)
	}
	t.Logf("64 Saves, %d fdatasyncs, %d writes", st.Fsyncs, st.Writes)
	rec := reopen(t, dir, opts)
	for g := uint64(0); g < 64; g++ {
		term := max(g, 1)
		equalEntries(t, fmt.Sprint("group ", g), rec.Groups[g].Entries, entries(1, 1, term))
	}
}

// Regression: stale mark before compacted entries. Compaction keeps the
// segments from the first one holding an entry at or above its bound; the
// oldest kept segment can begin with a mark older than the entries after
// it (a mark at 1, then entries 31.. whose 2..30 went with the compacted
// segment). Replay must not anchor the log at that mark: the next entry
// would look like a gap, and Open would refuse a log the WAL itself wrote
// and compacted.
func TestStaleMarkBeforeCompactedEntriesReplays(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 4096, Logger: quiet}
	w, _ := mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(1, 30, 1)})
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 1, Term: 1}, Entries: entries(31, 35, 1)})
	mustSave(t, w, Batch{Entries: entries(36, 40, 1)})
	if got := w.Segments(); len(got) != 2 {
		t.Fatalf("fixture: expected the marked batch to start segment 1, segments %v", got)
	}
	mustSave(t, w, Batch{Snapshot: &SnapshotMark{Index: 38, Term: 1}})
	if err := w.Compact(39); err != nil {
		t.Fatal(err)
	}
	if got := w.Segments(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("fixture: expected only segment 1 left, segments %v", got)
	}
	mustClose(t, w)
	w, rec, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("reopening the compacted log: %v", err)
	}
	defer mustClose(t, w)
	if rec.Snapshot.Index != 38 {
		t.Fatalf("expected mark 38, recovered %+v", rec.Snapshot)
	}
	equalEntries(t, "after compaction", rec.Entries, entries(39, 40, 1))
	mustSave(t, w, Batch{Entries: entries(41, 41, 1)})
	if err := w.Save(context.Background(), Batch{Entries: entries(43, 43, 1)}, true); err == nil {
		t.Fatal("a gap after reopening: expected Save to refuse entry 43 after 41")
	}
}

// TestTaggedTornTail applies the torn-or-corrupt rule to a tagged
// segment: the last write torn at every sector boundary inside it, or cut
// short at every byte, recovers every group to exactly the records before
// the tear; every single-bit flip in its last record, a group's tagged
// HardState, is corruption at that record (save a flip that clears the
// only set bit of a sector piece: a lost sector). Open then truncates a
// tear and the log takes appends again.
func TestTaggedTornTail(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 16 << 10, Logger: quiet}
	w, _ := mustOpen(t, dir, opts)
	ctx := context.Background()
	mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Commit: 2}})
	five, meta := w.Group(5), w.Group(0)
	if err := five.Save(ctx, Batch{Entries: entries(1, 4, 2), HardState: &HardState{Term: 2, Vote: 5, Commit: 1}}, true); err != nil {
		t.Fatal(err)
	}
	mustSave(t, w, Batch{Entries: entries(4, 5, 1)})
	if err := meta.Save(ctx, Batch{Snapshot: &SnapshotMark{Index: 9, Term: 1}, HardState: &HardState{Term: 1, Commit: 9}}, true); err != nil {
		t.Fatal(err)
	}
	var big []Entry
	for i := uint64(5); i <= 8; i++ {
		big = append(big, Entry{Index: i, Term: 2, Data: bytes.Repeat(fmt.Appendf(nil, "big entry %d ", i), 90)})
	}
	if err := five.Save(ctx, Batch{Entries: big, HardState: &HardState{Term: 2, Vote: 5, Commit: 3<<40 | 7}}, true); err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	first, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 1, whole)
	if scan.problem != nil || scan.version != FormatVersion || len(scan.records) != 14 {
		t.Fatalf("fixture: expected 14 clean records in a version %d segment, found %d (version %d, problem %v)", FormatVersion, len(scan.records), scan.version, scan.problem)
	}
	recs := scan.records
	lastWrite := recs[9].offset
	end := scan.end
	hsAt := recs[13].offset
	recordEnd := func(i int) int64 {
		if i+1 < len(recs) {
			return recs[i+1].offset
		}
		return end
	}
	classify := func(data []byte) *inspection {
		in, err := inspectSegments([]uint64{0, 1}, func(seq uint64) (*segmentScan, error) {
			if seq == 0 {
				return scanSegment(segmentName(0), 0, first), nil
			}
			return scanSegment(segmentName(1), 1, data), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	// expect is what recovers when the records ending after cut are lost.
	expect := func(cut int64) *groupsState {
		st := newGroupsState(true)
		for _, r := range scanSegment("", 0, first).records {
			if err := st.apply(r.record); err != nil {
				t.Fatal(err)
			}
		}
		for i, r := range recs {
			if recordEnd(i) <= cut {
				if err := st.apply(r.record); err != nil {
					t.Fatal(err)
				}
			}
		}
		return st
	}
	same := func(what string, got, want *groupsState) {
		t.Helper()
		for _, g := range []uint64{0, 1, 5} {
			a, b := got.recovered(g), want.recovered(g)
			equalEntries(t, fmt.Sprintf("%s: group %d", what, g), a.Entries, b.Entries)
			if a.HardState != b.HardState || a.Snapshot != b.Snapshot {
				t.Fatalf("%s: group %d: expected %+v %+v, recovered %+v %+v", what, g, b.HardState, b.Snapshot, a.HardState, a.Snapshot)
			}
		}
	}
	tears := 0
	for s := (lastWrite/sectorSize + 1) * sectorSize; s < end; s += sectorSize {
		data := bytes.Clone(whole)
		clear(data[s:end])
		in := classify(data)
		if in.problem != nil && in.torn == nil {
			t.Fatalf("torn at sector %d: called corruption: %v", s, in.problem)
		}
		same(fmt.Sprintf("torn at sector %d", s), in.state, expect(s))
		tears++
	}
	for cut := lastWrite; cut < end; cut++ {
		in := classify(bytes.Clone(whole[:cut]))
		if in.problem != nil && in.torn == nil {
			t.Fatalf("cut short at %d: called corruption: %v", cut, in.problem)
		}
		same(fmt.Sprintf("cut short at %d", cut), in.state, expect(cut))
	}
	flips := 0
	for pos := hsAt * 8; pos < end*8; pos++ {
		data := bytes.Clone(whole)
		data[pos/8] ^= 1 << (pos % 8)
		if inZeroPiece(data, int(hsAt), int(end), int(pos/8)) {
			continue
		}
		in := classify(data)
		if in.torn != nil || in.problem == nil || in.problem.Offset != hsAt {
			t.Fatalf("bit %d of group 5's tagged hard state at %d flipped: expected corruption there, got %v, torn %+v", pos-hsAt*8, hsAt, in.problem, in.torn)
		}
		flips++
	}
	t.Logf("%d tears, %d flips", tears, flips)

	// End to end: Open truncates a tear in the middle of the last write.
	s := (lastWrite/sectorSize + 2) * sectorSize
	data := bytes.Clone(whole)
	clear(data[s:end])
	if err := os.WriteFile(segPath(dir, 1), data, 0o644); err != nil {
		t.Fatal(err)
	}
	w, rec := mustOpen(t, dir, opts)
	if rec.TornTail == nil || rec.TornTail.File != segPath(dir, 1) {
		t.Fatalf("expected a torn tail in %s, got %+v", segPath(dir, 1), rec.TornTail)
	}
	got := rec.Groups[5].Entries
	next := got[len(got)-1].Index + 1
	if err := five.Save(ctx, Batch{}, true); !errors.Is(err, ErrClosed) {
		t.Fatalf("the closed WAL's group log: expected ErrClosed, got %v", err)
	}
	if err := w.Group(5).Save(ctx, Batch{Entries: entries(next, next, 3)}, true); err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	again := reopen(t, dir, opts)
	if again.TornTail != nil {
		t.Fatalf("torn bytes survived the truncation: %+v", again.TornTail)
	}
	equalEntries(t, "group 5 after the tear and an append", again.Groups[5].Entries, append(slices.Clone(got), entries(next, next, 3)...))
}

// Verify reports every group, and Repair refuses a cut that drops
// entries a group other than 1 recorded as committed, naming the group.
func TestVerifyAndRepairReportGroups(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 4096, Logger: quiet}
	w, _ := mustOpen(t, dir, opts)
	ctx := context.Background()
	three := w.Group(3)
	mustSave(t, w, Batch{Entries: entries(1, 2, 1), HardState: &HardState{Term: 1, Commit: 1}})
	if err := three.Save(ctx, Batch{Entries: entries(1, 5, 1)}, true); err != nil {
		t.Fatal(err)
	}
	for i := uint64(6); i <= 60; i += 5 {
		if err := three.Save(ctx, Batch{Entries: entries(i, i+4, 1), HardState: &HardState{Term: 1, Commit: i}}, true); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, w)
	r, err := Verify(dir)
	if err != nil || r.Problem != nil {
		t.Fatalf("Verify: %v %v", err, r.Problem)
	}
	want := []GroupReport{{Group: 1, Records: 3, LastIndex: 2, Commit: 1}, {Group: 3, Records: 71, LastIndex: 60, Commit: 56}}
	if !slices.Equal(r.Groups, want) {
		t.Fatalf("groups: expected %+v, got %+v", want, r.Groups)
	}
	if r.LastIndex != 2 || r.Commit != 1 {
		t.Fatalf("top level: expected group 1's last index 2 and commit 1, got %d and %d", r.LastIndex, r.Commit)
	}
	for _, line := range []string{"group 1: records=3 snapshot=0 last_index=2 commit=1", "group 3: records=71 snapshot=0 last_index=60 commit=56", "version=2"} {
		if !strings.Contains(r.String(), line) {
			t.Fatalf("report does not say %q:\n%s", line, r)
		}
	}

	// Damage group 3's first entry in segment 1 (the first tagged one).
	data, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 1, data)
	at := -1
	for _, rec := range scan.records {
		if rec.group == 3 && rec.typ == recEntry {
			at = int(rec.offset)
			break
		}
	}
	data[at+recordHeaderSize+20] ^= 0x10
	if err := os.WriteFile(segPath(dir, 1), data, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err = Verify(dir)
	if err != nil || r.Problem == nil || r.TornTail != nil || !r.CutsCommitted() {
		t.Fatalf("Verify of the damaged log: expected damage that cuts committed entries, got %v %+v", err, r)
	}
	_, err = Repair(dir, RepairOptions{})
	var cc *CutsCommittedError
	if !errors.As(err, &cc) || cc.Group != 3 || cc.LastIndex != 0 || cc.Commit != 56 || !strings.Contains(err.Error(), "group 3's log ending at index 0") {
		t.Fatalf("Repair: expected a *CutsCommittedError for group 3 (last 0, commit 56), got %v", err)
	}
	if _, err := Repair(dir, RepairOptions{AllowCommittedLoss: true}); err != nil {
		t.Fatal(err)
	}
	rec := reopen(t, dir, opts)
	equalEntries(t, "group 1 after repair", rec.Entries, entries(1, 2, 1))
	if len(rec.Groups[3].Entries) != 0 {
		t.Fatalf("group 3 after repair: expected no entries, recovered %d", len(rec.Groups[3].Entries))
	}
}

// Batches queued untagged before the first batch of another group are
// committed into the untagged segment, and those after it into the new
// tagged one, even when all of them wait behind the same fdatasync: a
// group commit never mixes the two encodings.
func TestQueuedUntaggedBatchesStayInTheUntaggedSegment(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	w, fs := openFault(t, dir, opts)
	entered, release := fs.gate()
	first, err := w.Stage(Batch{Entries: entries(1, 1, 1)}, true)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	var queued []*Pending
	for _, s := range []struct {
		group uint64
		b     Batch
	}{
		{1, Batch{Entries: entries(2, 3, 1)}},
		{1, Batch{HardState: &HardState{Term: 1, Commit: 3}}},
		{2, Batch{Entries: entries(1, 2, 1)}},
		{1, Batch{Entries: entries(4, 4, 1)}},
		{7, Batch{Snapshot: &SnapshotMark{Index: 5, Term: 1}}},
	} {
		p, err := w.Group(s.group).Stage(s.b, true)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, p)
	}
	close(release)
	for _, p := range append([]*Pending{first}, queued...) {
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, w)
	for seq, want := range map[uint64]struct {
		version uint32
		records int
	}{0: {untaggedVersion, 4}, 1: {FormatVersion, 4}} {
		data, err := os.ReadFile(segPath(dir, seq))
		if err != nil {
			t.Fatal(err)
		}
		scan := scanSegment("", seq, data)
		if scan.problem != nil || scan.version != want.version || len(scan.records) != want.records {
			t.Fatalf("segment %d: expected version %d with %d records, found version %d with %d (problem %v)", seq, want.version, want.records, scan.version, len(scan.records), scan.problem)
		}
	}
	rec := reopen(t, dir, opts)
	equalEntries(t, "group 1", rec.Entries, entries(1, 4, 1))
	equalEntries(t, "group 2", rec.Groups[2].Entries, entries(1, 2, 1))
	if rec.HardState.Commit != 3 || rec.Groups[7].Snapshot.Index != 5 {
		t.Fatalf("expected group 1's commit 3 and group 7's mark 5, recovered %+v and %+v", rec.HardState, rec.Groups[7].Snapshot)
	}
}
