package nemesis

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/faultfs"
)

// Where corrupt-read flips bits (CorruptPick.Where). The range is chosen
// when the fault is injected, from the target's files as they are then,
// and recorded in the history (the fault's params hold the ranges armed).
const (
	// CorruptWALRecord flips bytes inside the body of a WAL record that
	// has a good record after it in its segment: its checksum fails and,
	// with a record after it, tidal-server must call it corruption (a
	// last record could pass for a torn tail, which Open truncates).
	CorruptWALRecord = "wal-record"
	// CorruptSnapshot flips bytes inside the payload of the newest
	// snapshot file (the one a starting node loads); without one, a WAL
	// record is picked instead.
	CorruptSnapshot = "snapshot"
	// CorruptSegmentHeader flips the first bytes of every WAL segment.
	CorruptSegmentHeader = "segment-header"
)

// CorruptPick says where a corrupt-read fault's range goes.
type CorruptPick struct {
	Where string `json:"where"`
	Seed  int64  `json:"seed"`
}

// corruptSpan is how many bytes a picked range flips: a few, so the
// damage is a flipped field, not a wiped file.
const corruptSpan = 8

// The WAL and snapshot framing, as tidal-server/wal and
// tidal-server/replica write them (record: u32 length, u32 crc32c over
// type and payload, u8 type, payload; the first record of a segment is its
// header; snapshot: 24-byte header, then the payload). Kept here, not
// imported, because those packages keep it private; the tests check this
// copy against logs and snapshots tidal-server's packages write.
const (
	walRecordHeader  = 9
	walSegmentHeader = 1
	walMaxPayload    = 256 << 20
	snapFileHeader   = 24
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pickCorruptRange returns the range of the data dir under root that pick
// corrupts, and a sentence saying what it is. A pick that finds nothing to
// corrupt where it asks (no snapshot yet, no record with another after it)
// falls back: snapshot to WAL record, WAL record to segment headers.
func pickCorruptRange(root string, pick CorruptPick) (faultfs.CorruptRead, string, error) {
	r := rand.New(rand.NewPCG(uint64(pick.Seed), 0x636f7272757074))
	header := faultfs.CorruptRead{Path: "*.wal", Offset: 0, Length: 16}
	if root == "" {
		return header, "the first 16 bytes of every WAL segment (no data dir to pick from)", nil
	}
	switch pick.Where {
	case CorruptSegmentHeader, "":
		return header, "the first 16 bytes of every WAL segment", nil
	case CorruptSnapshot:
		cr, what, ok, err := pickSnapshotRange(root, r)
		if err != nil || ok {
			return cr, what, err
		}
		fallthrough
	case CorruptWALRecord:
		cr, what, ok, err := pickWALRecordRange(root, r)
		if err != nil || ok {
			return cr, what, err
		}
		return header, "the first 16 bytes of every WAL segment (no WAL record with another after it)", nil
	}
	return faultfs.CorruptRead{}, "", fmt.Errorf("corrupt-read: where %q: expected %s, %s or %s", pick.Where, CorruptWALRecord, CorruptSnapshot, CorruptSegmentHeader)
}

// pickSnapshotRange picks bytes inside the newest snapshot's payload.
func pickSnapshotRange(root string, r *rand.Rand) (faultfs.CorruptRead, string, bool, error) {
	names, err := filesWithSuffix(filepath.Join(root, "snap"), ".snap")
	if err != nil || len(names) == 0 {
		return faultfs.CorruptRead{}, "", false, err
	}
	newest := names[len(names)-1] // <term>-<index> in fixed-width hex
	st, err := os.Stat(filepath.Join(root, "snap", newest))
	if err != nil {
		return faultfs.CorruptRead{}, "", false, err
	}
	payload := st.Size() - snapFileHeader
	if payload <= 0 {
		return faultfs.CorruptRead{}, "", false, nil
	}
	off := snapFileHeader + r.Int64N(payload)
	n := min(corruptSpan, snapFileHeader+payload-off)
	rel := path.Join("snap", newest)
	return faultfs.CorruptRead{Path: rel, Offset: off, Length: n},
		fmt.Sprintf("%d bytes of %s's payload at offset %d", n, rel, off), true, nil
}

// walRecord is a record found in a segment: where its payload lies.
type walRecord struct {
	file          string
	offset        int64 // of the record header
	payload       int64 // payload bytes
	followedByOne bool  // a good record comes after it in the segment
}

// pickWALRecordRange picks bytes inside the payload of a record that a
// good record follows in its segment.
func pickWALRecordRange(root string, r *rand.Rand) (faultfs.CorruptRead, string, bool, error) {
	dir := filepath.Join(root, "wal")
	names, err := filesWithSuffix(dir, ".wal")
	if err != nil {
		return faultfs.CorruptRead{}, "", false, err
	}
	var candidates []walRecord
	for _, name := range names {
		recs, err := scanWALRecords(filepath.Join(dir, name))
		if err != nil {
			return faultfs.CorruptRead{}, "", false, err
		}
		for _, rec := range recs {
			if rec.followedByOne && rec.payload > 0 {
				rec.file = path.Join("wal", name)
				candidates = append(candidates, rec)
			}
		}
	}
	if len(candidates) == 0 {
		return faultfs.CorruptRead{}, "", false, nil
	}
	rec := candidates[r.IntN(len(candidates))]
	body := rec.offset + walRecordHeader
	off := body + r.Int64N(rec.payload)
	n := min(corruptSpan, body+rec.payload-off)
	return faultfs.CorruptRead{Path: rec.file, Offset: off, Length: n},
		fmt.Sprintf("%d bytes inside the body of the WAL record at offset %d of %s (one of %d with a record after them)", n, rec.offset, rec.file, len(candidates)), true, nil
}

// scanWALRecords walks a segment's records after its header, checking
// each checksum, up to the first that does not decode (a clean end,
// preallocated zeroes, or a record being written).
func scanWALRecords(file string) ([]walRecord, error) {
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil // removed by compaction meanwhile
		}
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	var recs []walRecord
	var off int64
	var hdr [walRecordHeader]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			break
		}
		length := binary.LittleEndian.Uint32(hdr[0:4])
		sum := binary.LittleEndian.Uint32(hdr[4:8])
		typ := hdr[8]
		if typ == 0 || length > walMaxPayload {
			break
		}
		payload := make([]byte, length)
		if _, err := io.ReadFull(br, payload); err != nil {
			break
		}
		crc := crc32.Update(0, castagnoli, hdr[8:9])
		if crc32.Update(crc, castagnoli, payload) != sum {
			break
		}
		if off > 0 || typ != walSegmentHeader {
			if n := len(recs); n > 0 {
				recs[n-1].followedByOne = true
			}
			recs = append(recs, walRecord{offset: off, payload: int64(length)})
		}
		off += walRecordHeader + int64(length)
	}
	return recs, nil
}

// filesWithSuffix lists dir's regular files ending in suffix, sorted; a
// missing dir has none.
func filesWithSuffix(dir, suffix string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), suffix) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}
