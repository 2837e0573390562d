package wal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture is a closed one-segment log of three batches, with every record's
// place in the segment.
type fixture struct {
	data    []byte          // the whole segment file
	records []scannedRecord // after the header
	end     int64           // end of the last record
	// lastBatch is the index in records of the last batch's first record.
	lastBatch int
}

func writeFixture(t *testing.T) fixture {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 8192
	w, _ := mustOpen(t, dir, opts)
	mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 1}})
	mustSave(t, w, Batch{Entries: entries(4, 6, 1)})
	mustSave(t, w, Batch{Entries: entries(7, 8, 2), HardState: &HardState{Term: 2, Vote: 1, Commit: 8}})
	mustClose(t, w)
	data, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 0, data)
	if scan.problem != nil || len(scan.records) != 10 {
		t.Fatalf("fixture: expected 10 clean records, scan found %d and problem %v", len(scan.records), scan.problem)
	}
	return fixture{data: data, records: scan.records, end: scan.end, lastBatch: 7}
}

// recordEnd is where records[i] ends.
func (f fixture) recordEnd(i int) int64 {
	if i+1 < len(f.records) {
		return f.records[i+1].offset
	}
	return f.end
}

// expected replays the fixture's records that end at or before cut.
func (f fixture) expected(t *testing.T, cut int64) *logState {
	t.Helper()
	st := newLogState(true)
	for i, r := range f.records {
		if f.recordEnd(i) > cut {
			break
		}
		if err := st.apply(r.record); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// boundary is the largest record end at or before cut.
func (f fixture) boundary(cut int64) int64 {
	b := int64(segmentHeaderBytes)
	for i := range f.records {
		if e := f.recordEnd(i); e <= cut {
			b = e
		}
	}
	return b
}

func writeSegment(t *testing.T, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(segPath(dir, 0), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTornTailAtEveryOffset cuts the last batch as a short file at every
// byte, and as a crash into preallocated space (zeroes from the cut on) at
// every sector boundary — a write reaches the disk in whole sectors, so
// that is where such a tear can begin (TestTornWriteAtEverySector tears a
// larger batch at each of its sectors) — and checks that Open recovers
// exactly the records before the cut, reports the torn bytes, and really
// removes them: a record appended afterwards is recovered cleanly.
func TestTornTailAtEveryOffset(t *testing.T) {
	f := writeFixture(t)
	opts := testOptions()
	opts.SegmentSize = 8192
	start := f.records[f.lastBatch].offset
	for _, mode := range []string{"zeroed", "short"} {
		for cut := start; cut < f.end; cut++ {
			if mode == "zeroed" && cut%sectorSize != 0 {
				continue
			}
			var data []byte
			if mode == "zeroed" {
				data = append([]byte(nil), f.data...)
				clear(data[cut:])
			} else {
				data = append([]byte(nil), f.data[:cut]...)
			}
			dir := writeSegment(t, data)
			w, rec, err := Open(dir, opts)
			if err != nil {
				t.Fatalf("%s cut at %d: Open: %v", mode, cut, err)
			}
			// Zeroing bytes that were zero anyway (the high bytes of
			// the last integer) changes nothing.
			effective := cut
			if mode == "zeroed" && isZero(f.data[cut:f.end]) {
				effective = f.end
			}
			want := f.expected(t, effective)
			equalEntries(t, mode+" cut", rec.Entries, want.entries)
			if rec.HardState != want.hs {
				t.Fatalf("%s cut at %d: hard state: expected %+v, recovered %+v", mode, cut, want.hs, rec.HardState)
			}
			b := f.boundary(effective)
			junk := int64(lastNonZero(f.data[b:effective]))
			switch {
			case junk == 0 && rec.TornTail != nil:
				t.Fatalf("%s cut at %d: only zeroes after the last record at %d: expected no torn tail, got %+v", mode, cut, b, rec.TornTail)
			case junk > 0 && (rec.TornTail == nil || rec.TornTail.Offset != b || rec.TornTail.Bytes != junk || rec.TornTail.File != segPath(dir, 0)):
				t.Fatalf("%s cut at %d: expected torn tail {%s %d %d}, got %+v", mode, cut, segPath(dir, 0), b, junk, rec.TornTail)
			}

			next := want.last + 1
			mustSave(t, w, Batch{Entries: entries(next, next, 9)})
			mustClose(t, w)
			again := reopen(t, dir, opts)
			if again.TornTail != nil {
				t.Fatalf("%s cut at %d: torn bytes survived the truncation: %+v", mode, cut, again.TornTail)
			}
			equalEntries(t, mode+" cut, then append", again.Entries, append(want.entries, entries(next, next, 9)...))
		}
	}
}

// TestBitFlipAtEveryByte flips one bit in every byte of the log. Every
// flip is corruption reported at the damaged record's offset, the last
// record's included: it was written and fdatasynced whole, and taking it
// for a torn write would silently drop a durable HardState.
func TestBitFlipAtEveryByte(t *testing.T) {
	f := writeFixture(t)
	opts := testOptions()
	opts.SegmentSize = 8192
	for pos := int64(0); pos < f.end; pos++ {
		data := append([]byte(nil), f.data...)
		data[pos] ^= 1 << (pos % 8)
		dir := writeSegment(t, data)
		w, _, err := Open(dir, opts)

		recordAt := int64(0) // the header
		for _, r := range f.records {
			if r.offset <= pos {
				recordAt = r.offset
			}
		}
		var ce *CorruptionError
		if !errors.As(err, &ce) {
			if w != nil {
				w.Close()
			}
			t.Fatalf("flip at %d (record at %d): expected *CorruptionError, got %v", pos, recordAt, err)
		}
		if ce.File != segPath(dir, 0) || ce.Offset != recordAt {
			t.Fatalf("flip at %d: expected corruption reported at %s:%d, got %s:%d (%s)", pos, segPath(dir, 0), recordAt, ce.File, ce.Offset, ce.Reason)
		}
	}
}

// multiSegment writes a log over several small segments and returns its
// directory and the entries in it.
func multiSegment(t *testing.T) (string, Options, []Entry) {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 2048
	w, _ := mustOpen(t, dir, opts)
	var all []Entry
	for i := uint64(1); i <= 60; i += 3 {
		es := entries(i, i+2, 1)
		mustSave(t, w, Batch{Entries: es})
		all = append(all, es...)
	}
	mustClose(t, w)
	return dir, opts, all
}

func TestCorruptionInOlderSegment(t *testing.T) {
	dir, opts, _ := multiSegment(t)
	// The last record of segment 1 is followed only by zeroes, but the
	// segment is not the newest: it was synced before segment 2 was
	// written, so damage there is corruption, not a torn write.
	data, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 1, data)
	lastRec := scan.records[len(scan.records)-1].offset
	data[lastRec+20] ^= 0x40
	if err := os.WriteFile(segPath(dir, 1), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = Open(dir, opts)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != segPath(dir, 1) || ce.Offset != lastRec {
		t.Fatalf("expected *CorruptionError at %s:%d, got %v", segPath(dir, 1), lastRec, err)
	}
	if !strings.Contains(ce.Reason, "not the newest") {
		t.Fatalf("expected the reason to say why this is not a torn tail, got %q", ce.Reason)
	}
}

func TestMissingSegmentIsCorruption(t *testing.T) {
	dir, opts, _ := multiSegment(t)
	if err := os.Remove(segPath(dir, 2)); err != nil {
		t.Fatal(err)
	}
	_, _, err := Open(dir, opts)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != segPath(dir, 3) || !strings.Contains(ce.Reason, "missing") {
		t.Fatalf("expected *CorruptionError naming %s and a missing segment, got %v", segPath(dir, 3), err)
	}
}

func TestLeftoverTemporarySegmentIsRemoved(t *testing.T) {
	dir, opts, all := multiSegment(t)
	seqs, _ := listSegments(dir)
	tmp := segPath(dir, seqs[len(seqs)-1]+1) + tmpSuffix
	if err := os.WriteFile(tmp, []byte("half-made segment"), 0o644); err != nil {
		t.Fatal(err)
	}
	equalEntries(t, "with leftover tmp", reopen(t, dir, opts).Entries, all)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected %s removed, stat says %v", filepath.Base(tmp), err)
	}
}

func TestVerifyAndRepair(t *testing.T) {
	dir, opts, all := multiSegment(t)

	r, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Problem != nil || r.Records != len(all) {
		t.Fatalf("clean log: expected no problem and %d records, got %v and %d", len(all), r.Problem, r.Records)
	}
	n := len(r.Segments)
	if n < 4 {
		t.Fatalf("expected at least 4 segments, found %d", n)
	}

	// Damage a record in the middle of segment 1.
	data, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 1, data)
	bad := scan.records[1]
	data[bad.offset+recordHeaderSize+3] ^= 0xff
	if err := os.WriteFile(segPath(dir, 1), data, 0o644); err != nil {
		t.Fatal(err)
	}
	before := append([]byte(nil), data...)

	r, err = Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Problem == nil || r.TornTail != nil || r.Problem.File != segPath(dir, 1) || r.Problem.Offset != bad.offset {
		t.Fatalf("expected corruption at %s:%d and no torn tail, got %v / %+v", segPath(dir, 1), bad.offset, r.Problem, r.TornTail)
	}
	if s := r.Segments[1]; s.LastGoodOffset != bad.offset || s.Records != 1 || s.Problem == "" {
		t.Fatalf("segment 1 report: expected 1 good record ending at %d and a problem, got %+v", bad.offset, s)
	}
	if after, _ := os.ReadFile(segPath(dir, 1)); string(after) != string(before) {
		t.Fatal("Verify changed the segment")
	}
	if _, _, err := Open(dir, opts); err == nil {
		t.Fatal("Open of a corrupt log: expected an error, got nil")
	}

	origRecords := map[string]int{}
	for seq := range uint64(n) {
		sc, err := readSegment(dir, seq)
		if err != nil {
			t.Fatal(err)
		}
		origRecords[sc.path] = len(sc.records)
	}
	r, err = Repair(dir, RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Later segments are removed newest first, then segment 1 is cut.
	if len(r.Dropped) != n-1 {
		t.Fatalf("expected %d cuts (%d segments removed, one truncated), got %+v", n-1, n-2, r.Dropped)
	}
	for i, d := range r.Dropped[:n-2] {
		seq := uint64(n - 1 - i)
		if !d.Removed || d.File != segPath(dir, seq) || d.Records != origRecords[d.File] || d.Bytes <= segmentHeaderBytes {
			t.Fatalf("cut %d: expected removal of %s with its %d records, got %+v", i, segPath(dir, seq), origRecords[segPath(dir, seq)], d)
		}
		if _, err := os.Stat(d.File); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cut %d: %s still exists: %v", i, d.File, err)
		}
	}
	cut := r.Dropped[n-2]
	// Segment 1 held its good first record, the damaged one and the rest,
	// which still decode.
	if cut.Removed || cut.File != segPath(dir, 1) || cut.Offset != bad.offset || cut.Records != len(scan.records)-2 || cut.Bytes != scan.end-bad.offset {
		t.Fatalf("expected segment 1 cut at %d dropping %d bytes and %d decodable records, got %+v", bad.offset, scan.end-bad.offset, len(scan.records)-2, cut)
	}
	if !strings.Contains(r.String(), "truncated") {
		t.Fatalf("report text should say what was truncated:\n%s", r)
	}

	// Everything before the damaged record comes back.
	seg0, _ := readSegment(dir, 0)
	kept := len(seg0.records) + 1
	rec := reopen(t, dir, opts)
	equalEntries(t, "after repair", rec.Entries, all[:kept])
	if r, _ := Verify(dir); r.Problem != nil {
		t.Fatalf("after repair and reopen: expected a clean log, got %v", r.Problem)
	}
}

func TestVerifyReportsTornTail(t *testing.T) {
	f := writeFixture(t)
	data := append([]byte(nil), f.data...)
	tornAt := f.records[len(f.records)-1].offset
	dir := writeSegment(t, data[:tornAt+5]) // the file ends inside the last record's header
	r, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.TornTail == nil || r.TornTail.Offset != tornAt || r.TornTail.Bytes != 5 {
		t.Fatalf("expected a torn tail of 5 bytes at %d, got %+v (problem %v)", tornAt, r.TornTail, r.Problem)
	}
	r, err = Repair(dir, RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Dropped) != 1 || r.Dropped[0].Offset != tornAt || r.Dropped[0].Bytes != 5 || r.Dropped[0].Records != 0 {
		t.Fatalf("expected one cut of 5 bytes at %d with no decodable records, got %+v", tornAt, r.Dropped)
	}
	if rec := reopen(t, dir, testOptions()); rec.TornTail != nil {
		t.Fatalf("after repair: expected no torn tail, got %+v", rec.TornTail)
	}
}
