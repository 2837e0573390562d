package wal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SegmentRecords finds every record the writer wrote, where it wrote it:
// the spans tile each segment from its header to the zeroes after the last
// record, each span's payload is an entry's fixed fields and data or a
// hard state, and every entry written is the payload of exactly one span.
func TestSegmentRecordsMatchTheWriter(t *testing.T) {
	dir := t.TempDir()
	w, _, err := Open(dir, Options{SegmentSize: 1 << 14})
	if err != nil {
		t.Fatal(err)
	}
	written := map[string]int{} // entry data → times found
	for i := 1; i <= 3000; i += 10 {
		var b Batch
		for j := i; j < i+10; j++ {
			d := fmt.Sprintf("entry %d %s", j, strings.Repeat("x", j%50))
			written[d] = 0
			b.Entries = append(b.Entries, Entry{Index: uint64(j), Term: 1, Data: []byte(d)})
		}
		if i%40 == 1 {
			b.HardState = &HardState{Term: 1, Commit: uint64(i)}
		}
		if err := w.Save(context.Background(), b, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	seqs, err := listSegments(dir)
	if err != nil || len(seqs) < 3 {
		t.Fatalf("expected several segments, found %v (%v)", seqs, err)
	}
	for _, seq := range seqs {
		path := filepath.Join(dir, segmentName(seq))
		spans, err := SegmentRecords(path)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		next := int64(segmentHeaderBytes)
		for _, s := range spans {
			if s.Offset != next {
				t.Fatalf("%s: expected a record at %d, found one at %d", path, next, s.Offset)
			}
			next = s.Offset + RecordHeaderSize + s.Length
			if next > int64(len(data)) {
				t.Fatalf("%s: span %+v past the file's end %d", path, s, len(data))
			}
			payload := data[s.Offset+RecordHeaderSize : next]
			if s.Length == hardStateBody {
				continue
			}
			d := string(payload[min(entryFixedBody, len(payload)):])
			n, ok := written[d]
			if !ok || s.Length < entryFixedBody {
				t.Fatalf("%s: span %+v: expected an entry written or a hard state, found payload %q", path, s, payload)
			}
			written[d] = n + 1
		}
		if !isZero(data[next:]) {
			t.Fatalf("%s: expected nothing but zeroes after the last span (at %d)", path, next)
		}
	}
	for d, n := range written {
		if n != 1 {
			t.Errorf("entry %q: expected in exactly one span, found in %d", d, n)
		}
	}
	if _, err := SegmentRecords(filepath.Join(dir, "LOCK")); err == nil {
		t.Error("a file not named as a segment: expected an error")
	}
}
