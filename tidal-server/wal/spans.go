package wal

import (
	"fmt"
	"os"
	"path/filepath"
)

// RecordHeaderSize is the bytes of a record's header (length u32, crc32c
// u32, type u8) before its payload; see the package documentation.
const RecordHeaderSize = recordHeaderSize

// RecordSpan is where one record lies in a segment file.
type RecordSpan struct {
	Offset int64 // of the record's header, from the start of the file
	Length int64 // of its payload, which follows the header
}

// SegmentRecords reads the segment file at path and returns where its
// records lie, after the segment header and in order: the records Open's
// scan finds good, up to the first offset where none decodes (a clean end,
// preallocated zeroes, a torn or damaged record). A segment whose header is
// bad has none. It decodes as Open does but judges nothing: it is for tools
// that aim at records (the chaos harness's corrupt-read picker), so that
// they do not keep a copy of the framing.
func SegmentRecords(path string) ([]RecordSpan, error) {
	seq, ok := parseSegmentName(filepath.Base(path))
	if !ok {
		return nil, fmt.Errorf("wal: %s: not a segment file name", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := scanSegment(path, seq, data)
	if s.format != nil {
		return nil, nil
	}
	spans := make([]RecordSpan, len(s.records))
	for i, r := range s.records {
		spans[i] = RecordSpan{Offset: r.offset, Length: int64(r.size - recordHeaderSize)}
	}
	return spans, nil
}
