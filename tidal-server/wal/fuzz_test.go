package wal

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// Seeds beyond the committed corpus in testdata/fuzz, so the targets have
// something to start from even if the corpus is pruned.
func recordSeeds() [][]byte {
	seeds := [][]byte{
		appendEntryRecord(nil, Entry{Index: 7, Term: 2, Type: 1, Data: []byte("hello")}),
		appendHardStateRecord(nil, HardState{Term: 3, Vote: 1, Commit: 9}),
		appendSnapshotMarkRecord(nil, SnapshotMark{Index: 100, Term: 4}),
		appendSegmentHeader(nil, 42),
		make([]byte, recordHeaderSize),
	}
	bad := appendEntryRecord(nil, Entry{Index: 1, Term: 1, Data: []byte("x")})
	bad[len(bad)-1] ^= 1
	return append(seeds, bad, bad[:5], []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 2})
}

// FuzzDecodeRecord: decoding arbitrary bytes never panics and never claims
// more bytes than it was given, and whatever decodes re-encodes to exactly
// the bytes it came from.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range recordSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := decodeRecord(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with n=%d", err, n)
			}
			return
		}
		if n < recordHeaderSize || n > len(b) {
			t.Fatalf("decoded %d bytes out of %d", n, len(b))
		}
		var again []byte
		switch rec.typ {
		case recEntry:
			again = appendEntryRecord(nil, decodeEntry(rec.payload))
		case recHardState:
			again = appendHardStateRecord(nil, decodeHardState(rec.payload))
		case recSnapshotMark:
			again = appendSnapshotMarkRecord(nil, decodeSnapshotMark(rec.payload))
		case recSegmentHeader:
			again = appendRecord(nil, recSegmentHeader, rec.payload)
		default:
			t.Fatalf("decoded unknown type %d", rec.typ)
		}
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("round trip: decoded %x, re-encoded %x", b[:n], again)
		}
	})
}

// fuzzSegment is a small valid segment: header, a few batches, zeroes.
func fuzzSegment() []byte {
	b := appendSegmentHeader(nil, 0)
	b = appendEntryRecord(b, Entry{Index: 1, Term: 1, Data: []byte("one")})
	b = appendEntryRecord(b, Entry{Index: 2, Term: 1, Data: []byte("two")})
	b = appendHardStateRecord(b, HardState{Term: 1, Commit: 2})
	b = appendSnapshotMarkRecord(b, SnapshotMark{Index: 1, Term: 1})
	b = appendEntryRecord(b, Entry{Index: 2, Term: 2, Data: []byte("two again")})
	return append(b, make([]byte, 64)...)
}

// FuzzOpen writes arbitrary bytes as the only segment of a log and opens
// it: Open never panics, and either refuses with a *CorruptionError or
// returns a log that obeys the index rules and that Verify then finds
// clean.
func FuzzOpen(f *testing.F) {
	seg := fuzzSegment()
	f.Add(seg)
	torn := append([]byte(nil), seg...)
	clear(torn[len(torn)-80:])
	f.Add(torn)
	flipped := append([]byte(nil), seg...)
	flipped[40] ^= 4
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(segPath(dir, 0), data, 0o644); err != nil {
			t.Fatal(err)
		}
		w, rec, err := Open(dir, Options{SegmentSize: 4096, Logger: quiet, NoSync: true})
		if err != nil {
			var ce *CorruptionError
			if !errors.As(err, &ce) {
				t.Fatalf("Open: expected nil or *CorruptionError, got %T %v", err, err)
			}
			return
		}
		defer w.Close()
		for i, e := range rec.Entries {
			if e.Index <= rec.Snapshot.Index || (i > 0 && e.Index != rec.Entries[i-1].Index+1) {
				t.Fatalf("recovered entries break the index rules at %d: %+v (mark %+v)", i, e, rec.Snapshot)
			}
		}
		r, err := Verify(dir)
		if err != nil {
			t.Fatal(err)
		}
		if r.Problem != nil {
			t.Fatalf("Verify after Open: expected a clean log, got %v", r.Problem)
		}
	})
}
