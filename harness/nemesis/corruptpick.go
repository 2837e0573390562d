package nemesis

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// Where corrupt-read flips bits (CorruptPick.Where). The range is chosen
// when the fault is injected, from the target's files as they are then,
// and recorded in the history (the fault's params hold the ranges armed).
const (
	// CorruptWALRecord flips bytes inside the body of a WAL record that
	// has a good record after it in its segment: its checksum fails and,
	// with a record after it, tidal-server must call it corruption
	// whatever the bytes (damage to a last record is judged by the WAL's
	// torn-write rule, under which a record left with a zeroed sector is
	// a torn tail that Open truncates).
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
	start, payload, err := replica.SnapshotPayload(filepath.Join(root, "snap", newest))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return faultfs.CorruptRead{}, "", false, nil // pruned meanwhile
		}
		return faultfs.CorruptRead{}, "", false, err
	}
	if payload <= 0 {
		return faultfs.CorruptRead{}, "", false, nil
	}
	off := start + r.Int64N(payload)
	n := min(corruptSpan, start+payload-off)
	rel := path.Join("snap", newest)
	return faultfs.CorruptRead{Path: rel, Offset: off, Length: n},
		fmt.Sprintf("%d bytes of %s's payload at offset %d", n, rel, off), true, nil
}

// walRecord is a record found in a segment: where its payload lies.
type walRecord struct {
	file string
	wal.RecordSpan
}

// pickWALRecordRange picks bytes inside the payload of a record that a
// good record follows in its segment. The records are the WAL's own
// reading of the segments (wal.SegmentRecords): the good ones, up to the
// first that does not decode.
func pickWALRecordRange(root string, r *rand.Rand) (faultfs.CorruptRead, string, bool, error) {
	dir := filepath.Join(root, "wal")
	names, err := filesWithSuffix(dir, ".wal")
	if err != nil {
		return faultfs.CorruptRead{}, "", false, err
	}
	var candidates []walRecord
	for _, name := range names {
		spans, err := wal.SegmentRecords(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by compaction meanwhile
		}
		if err != nil {
			return faultfs.CorruptRead{}, "", false, err
		}
		for i, sp := range spans {
			if i+1 < len(spans) && sp.Length > 0 { // a good record after it
				candidates = append(candidates, walRecord{file: path.Join("wal", name), RecordSpan: sp})
			}
		}
	}
	if len(candidates) == 0 {
		return faultfs.CorruptRead{}, "", false, nil
	}
	rec := candidates[r.IntN(len(candidates))]
	body := rec.Offset + wal.RecordHeaderSize
	off := body + r.Int64N(rec.Length)
	n := min(corruptSpan, body+rec.Length-off)
	return faultfs.CorruptRead{Path: rec.file, Offset: off, Length: n},
		fmt.Sprintf("%d bytes inside the body of the WAL record at offset %d of %s (one of %d with a record after them)", n, rec.Offset, rec.file, len(candidates)), true, nil
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
