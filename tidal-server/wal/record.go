package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Record types. Zero is deliberately not a type: a header of zeroes is what
// preallocated, never-written space looks like.
const (
	recSegmentHeader uint8 = 1
	recEntry         uint8 = 2
	recHardState     uint8 = 3
	recSnapshotMark  uint8 = 4

	// Tagged records: the same three kinds with the raft group they
	// belong to, for logs shared by several groups. Their payload is the
	// group as a canonical uvarint followed by the untagged kind's
	// payload. Only segments of a tagged format version hold them, and
	// such segments hold no untagged entry, hard state or mark.
	recTaggedEntry        uint8 = 5
	recTaggedHardState    uint8 = 6
	recTaggedSnapshotMark uint8 = 7

	// taggedOffset turns an untagged kind into its tagged type.
	taggedOffset = recTaggedEntry - recEntry
)

// DefaultGroup is the group of every untagged record: the only raft group
// of a single-group node, and what the single-group API (Save, Stage,
// Compact, Recovered's top-level fields) reads and writes.
const DefaultGroup uint64 = 1

const (
	// recordHeaderSize is length(4) + crc(4) + type(1).
	recordHeaderSize = 9
	// maxRecordPayload bounds what a decoder believes a length field. A
	// larger claim is corruption, not an allocation.
	maxRecordPayload = 256 << 20

	segmentMagic       = "TIDALWAL"
	segmentHeaderBody  = 8 + 4 + 8 // magic, version, sequence
	segmentHeaderBytes = recordHeaderSize + segmentHeaderBody

	entryFixedBody = 8 + 8 + 1 // index, term, type
	hardStateBody  = 8 + 8 + 8
	snapMarkBody   = 8 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func typeName(t uint8) string {
	switch t {
	case recSegmentHeader:
		return "segment header"
	case recEntry:
		return "entry"
	case recHardState:
		return "hard state"
	case recSnapshotMark:
		return "snapshot mark"
	case recTaggedEntry, recTaggedHardState, recTaggedSnapshotMark:
		return "tagged " + typeName(t-taggedOffset)
	}
	return fmt.Sprintf("unknown type %d", t)
}

// errZeroHeader means the bytes where a record header should be are all
// zero. Whether that is a clean end or damage depends on what follows, which
// only the segment scanner can see.
var errZeroHeader = errors.New("record header is all zeroes")

// record is one decoded record. For a tagged record typ is the untagged
// kind (recEntry, recHardState or recSnapshotMark), tagged is set, group is
// its tag and payload what follows the tag; an untagged record's group is
// DefaultGroup. payload aliases the buffer it was decoded from, and size is
// the whole record's length in bytes.
type record struct {
	typ     uint8
	tagged  bool
	group   uint64
	payload []byte
	size    int
}

// appendRecord frames payload as one record of type typ onto dst.
func appendRecord(dst []byte, typ uint8, payload []byte) []byte {
	var h [recordHeaderSize]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(payload)))
	crc := crc32.Update(0, castagnoli, []byte{typ})
	crc = crc32.Update(crc, castagnoli, payload)
	binary.LittleEndian.PutUint32(h[4:8], crc)
	h[8] = typ
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// decodeRecord decodes the record at the start of b and returns it with the
// number of bytes it occupies. It never allocates in proportion to what the
// bytes claim, and never panics, whatever b holds.
func decodeRecord(b []byte) (record, int, error) {
	if len(b) < recordHeaderSize {
		if isZero(b) {
			return record{}, 0, errZeroHeader
		}
		return record{}, 0, fmt.Errorf("record header needs %d bytes, found %d", recordHeaderSize, len(b))
	}
	length := binary.LittleEndian.Uint32(b[0:4])
	sum := binary.LittleEndian.Uint32(b[4:8])
	typ := b[8]
	if length == 0 && sum == 0 && typ == 0 {
		return record{}, 0, errZeroHeader
	}
	if typ < recSegmentHeader || typ > recTaggedSnapshotMark {
		return record{}, 0, fmt.Errorf("record type: expected 1..7, found %d", typ)
	}
	if length > maxRecordPayload {
		return record{}, 0, fmt.Errorf("record length %d exceeds the maximum %d", length, maxRecordPayload)
	}
	end := recordHeaderSize + int(length)
	if end > len(b) {
		return record{}, 0, fmt.Errorf("%s record claims %d payload bytes, only %d remain", typeName(typ), length, len(b)-recordHeaderSize)
	}
	if got := crc32.Checksum(b[8:end], castagnoli); got != sum {
		return record{}, 0, fmt.Errorf("%s record checksum: expected %#08x, computed %#08x", typeName(typ), sum, got)
	}
	rec := record{typ: typ, group: DefaultGroup, payload: b[recordHeaderSize:end], size: end}
	if typ >= recTaggedEntry {
		g, n := binary.Uvarint(rec.payload)
		if n <= 0 || n != uvarintLen(g) {
			return record{}, 0, fmt.Errorf("%s payload: expected a canonical uvarint group tag, found %x", typeName(typ), rec.payload[:min(len(rec.payload), binary.MaxVarintLen64)])
		}
		rec.typ, rec.tagged, rec.group, rec.payload = typ-taggedOffset, true, g, rec.payload[n:]
	}
	if err := checkPayloadSize(rec.typ, len(rec.payload)); err != nil {
		return record{}, 0, err
	}
	return rec, end, nil
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func checkPayloadSize(typ uint8, n int) error {
	want, exact := 0, true
	switch typ {
	case recSegmentHeader:
		want = segmentHeaderBody
	case recHardState:
		want = hardStateBody
	case recSnapshotMark:
		want = snapMarkBody
	case recEntry:
		want, exact = entryFixedBody, false
	}
	if exact && n != want {
		return fmt.Errorf("%s payload: expected %d bytes, found %d", typeName(typ), want, n)
	}
	if !exact && n < want {
		return fmt.Errorf("%s payload: expected at least %d bytes, found %d", typeName(typ), want, n)
	}
	return nil
}

func isZero(b []byte) bool {
	for len(b) >= len(zeroes) {
		if string(b[:len(zeroes)]) != string(zeroes[:]) {
			return false
		}
		b = b[len(zeroes):]
	}
	return string(b) == string(zeroes[:len(b)])
}

var zeroes [4096]byte

// Payload codecs. All integers are little-endian.

// encoder frames a group's records: untagged (the single-group format,
// group DefaultGroup only) or tagged with group.
type encoder struct {
	tagged bool
	group  uint64
}

var untagged = encoder{group: DefaultGroup}

// body returns a payload buffer for a record whose untagged payload is n
// bytes, with the group tag already in place when tagged, and the offset
// where the untagged payload starts.
func (c encoder) body(n int) ([]byte, int) {
	if !c.tagged {
		return make([]byte, n), 0
	}
	t := uvarintLen(c.group)
	b := make([]byte, t+n)
	binary.PutUvarint(b, c.group)
	return b, t
}

// frame appends the record of untagged kind typ with payload b (from body)
// to dst.
func (c encoder) frame(dst []byte, typ uint8, b []byte) []byte {
	if c.tagged {
		typ += taggedOffset
	}
	return appendRecord(dst, typ, b)
}

// size is the on-disk size of a record whose untagged payload is n bytes.
func (c encoder) size(n int) int {
	if c.tagged {
		n += uvarintLen(c.group)
	}
	return recordHeaderSize + n
}

func (c encoder) entry(dst []byte, e Entry) []byte {
	b, o := c.body(entryFixedBody + len(e.Data))
	binary.LittleEndian.PutUint64(b[o:o+8], e.Index)
	binary.LittleEndian.PutUint64(b[o+8:o+16], e.Term)
	b[o+16] = e.Type
	copy(b[o+entryFixedBody:], e.Data)
	return c.frame(dst, recEntry, b)
}

func (c encoder) hardState(dst []byte, hs HardState) []byte {
	b, o := c.body(hardStateBody)
	binary.LittleEndian.PutUint64(b[o:o+8], hs.Term)
	binary.LittleEndian.PutUint64(b[o+8:o+16], hs.Vote)
	binary.LittleEndian.PutUint64(b[o+16:o+24], hs.Commit)
	return c.frame(dst, recHardState, b)
}

func (c encoder) snapshotMark(dst []byte, m SnapshotMark) []byte {
	b, o := c.body(snapMarkBody)
	binary.LittleEndian.PutUint64(b[o:o+8], m.Index)
	binary.LittleEndian.PutUint64(b[o+8:o+16], m.Term)
	return c.frame(dst, recSnapshotMark, b)
}

func appendEntryRecord(dst []byte, e Entry) []byte { return untagged.entry(dst, e) }

// entrySize is the on-disk size of e's untagged record.
func entrySize(e Entry) int { return recordHeaderSize + entryFixedBody + len(e.Data) }

// decodeEntry returns an Entry whose Data aliases p.
func decodeEntry(p []byte) Entry {
	return Entry{
		Index: binary.LittleEndian.Uint64(p[0:8]),
		Term:  binary.LittleEndian.Uint64(p[8:16]),
		Type:  p[16],
		Data:  p[entryFixedBody:],
	}
}

func appendHardStateRecord(dst []byte, hs HardState) []byte { return untagged.hardState(dst, hs) }

func decodeHardState(p []byte) HardState {
	return HardState{
		Term:   binary.LittleEndian.Uint64(p[0:8]),
		Vote:   binary.LittleEndian.Uint64(p[8:16]),
		Commit: binary.LittleEndian.Uint64(p[16:24]),
	}
}

func appendSnapshotMarkRecord(dst []byte, m SnapshotMark) []byte {
	return untagged.snapshotMark(dst, m)
}

func decodeSnapshotMark(p []byte) SnapshotMark {
	return SnapshotMark{
		Index: binary.LittleEndian.Uint64(p[0:8]),
		Term:  binary.LittleEndian.Uint64(p[8:16]),
	}
}

// appendSegmentHeader appends the header of segment seq written in version.
func appendSegmentHeader(dst []byte, seq uint64, version uint32) []byte {
	var body [segmentHeaderBody]byte
	copy(body[0:8], segmentMagic)
	binary.LittleEndian.PutUint32(body[8:12], version)
	binary.LittleEndian.PutUint64(body[12:20], seq)
	return appendRecord(dst, recSegmentHeader, body[:])
}

// checkSegmentHeader verifies that p is the header of segment seq and
// returns the segment's format version.
func checkSegmentHeader(p []byte, seq uint64) (uint32, error) {
	if string(p[0:8]) != segmentMagic {
		return 0, fmt.Errorf("segment header magic: expected %q, found %q", segmentMagic, p[0:8])
	}
	v := binary.LittleEndian.Uint32(p[8:12])
	if v < MinFormatVersion || v > readVersion {
		return v, &FormatError{What: "WAL segment", Found: v, MinSupported: MinFormatVersion, Supported: readVersion}
	}
	if got := binary.LittleEndian.Uint64(p[12:20]); got != seq {
		return v, fmt.Errorf("segment header sequence: expected %d (from the file name), found %d", seq, got)
	}
	return v, nil
}
