package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	segmentSuffix = ".wal"
	tmpSuffix     = ".tmp"
	lockName      = "LOCK"
)

func segmentName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, segmentSuffix) }

// parseSegmentName returns the sequence number of a segment file name, or
// false for any other name.
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, segmentSuffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(hex, 16, 64)
	return seq, err == nil
}

// listSegments returns the sequence numbers of dir's segments, ascending.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, e := range ents {
		if seq, ok := parseSegmentName(e.Name()); ok && e.Type().IsRegular() {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// scannedRecord is a record with its place in the segment.
type scannedRecord struct {
	record
	offset int64
}

// segmentScan is what a read-only pass over one segment found.
type segmentScan struct {
	seq     uint64
	path    string
	size    int64
	records []scannedRecord // after the header
	// end is the offset just past the last good record (the header
	// included); the segment's writable end.
	end int64
	// problem is non-nil when the bytes at end are neither a record nor
	// zeroes up to EOF.
	problem error
	// junkEnd is one past the last non-zero byte at or after end.
	junkEnd int64
	// laterValid counts records that decode cleanly somewhere after the
	// bad bytes; any at all means the damage is not a torn tail.
	laterValid int
	// laterValidAt is the offset of the first of them.
	laterValidAt int64
	// later are those records (replay cannot use them; the report counts
	// what they say was committed).
	later []record
	// notTorn, when the problem is after the header, says why the bad
	// bytes cannot be a write that did not complete ("" if they can be).
	notTorn string
	// format is set, and nothing else scanned, when the segment's header
	// is intact but names a format version this build does not read.
	format *FormatError
	// version is the format version its header names (0 if the header
	// is bad).
	version uint32
}

// scanSegment decodes data, the whole content of segment seq. It stops at
// the first offset where no record decodes; see the package documentation
// for how the caller classifies what it found there.
func scanSegment(path string, seq uint64, data []byte) *segmentScan {
	s := &segmentScan{seq: seq, path: path, size: int64(len(data))}
	off := 0
	for off < len(data) {
		rec, n, err := decodeRecord(data[off:])
		if err == nil && off == 0 {
			if rec.typ != recSegmentHeader {
				err = fmt.Errorf("first record: expected a segment header, found a %s record", typeName(rec.typ))
			} else if s.version, err = checkSegmentHeader(rec.payload, seq); err != nil {
				var fe *FormatError
				if errors.As(err, &fe) {
					fe.File = path
					s.format = fe
					return s
				}
			}
		} else if err == nil && rec.typ == recSegmentHeader {
			err = fmt.Errorf("segment header record after the start of the segment")
		} else if err == nil && rec.tagged != taggedVersion(s.version) {
			err = tagMismatch(rec, s.version)
		}
		if err != nil {
			if off > 0 && isZero(data[off:]) {
				break // preallocated space never written: clean end
			}
			s.problem = err
			s.junkEnd = int64(lastNonZero(data[off:]) + off)
			s.laterValidAt, s.later = validRecordsAfter(data, off+1)
			s.laterValid = len(s.later)
			if off > 0 {
				s.notTorn = notTorn(data, off)
			}
			break
		}
		if off > 0 {
			s.records = append(s.records, scannedRecord{record: rec, offset: int64(off)})
		}
		off += n
	}
	s.end = int64(off)
	if len(data) == 0 {
		s.problem = fmt.Errorf("segment is empty: expected a segment header")
	}
	return s
}

// lastNonZero returns one past the index of the last non-zero byte of b.
func lastNonZero(b []byte) int {
	i := len(b)
	for i >= len(zeroes) && isZero(b[i-len(zeroes):i]) {
		i -= len(zeroes)
	}
	for i > 0 && b[i-1] == 0 {
		i--
	}
	return i
}

// validRecordsAfter looks at every offset from start on for records that
// decode cleanly (other than segment headers), and returns the offset of the
// first and the records found by walking on from it. Zero runs are skipped
// quickly: no record header can begin with a zero length.
func validRecordsAfter(data []byte, start int) (int64, []record) {
	end := lastNonZero(data)
	for p := start; p < end; p++ {
		if p+recordHeaderSize > len(data) {
			break
		}
		typ := data[p+8]
		if typ < recEntry || typ > recTaggedSnapshotMark {
			continue
		}
		if _, _, err := decodeRecord(data[p:]); err != nil {
			continue
		}
		var recs []record
		for q := p; q < len(data); {
			rec, n, err := decodeRecord(data[q:])
			if err != nil || rec.typ == recSegmentHeader {
				break
			}
			recs = append(recs, rec)
			q += n
		}
		return int64(p), recs
	}
	return -1, nil
}

// readSegment reads one whole segment and scans it.
func readSegment(dir string, seq uint64) (*segmentScan, error) {
	path := filepath.Join(dir, segmentName(seq))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return scanSegment(path, seq, data), nil
}

// tagMismatch is the error for a record whose tagging does not match its
// segment's version: a version 1 segment holds untagged records only, a
// later one tagged records only.
func tagMismatch(rec record, version uint32) error {
	if rec.tagged {
		return fmt.Errorf("%s record of group %d in a version %d segment: expected untagged records only", typeName(rec.typ+taggedOffset), rec.group, version)
	}
	return fmt.Errorf("untagged %s record in a version %d segment: expected group-tagged records only", typeName(rec.typ), version)
}
