package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// TestSingleBitErrorMatchesBruteForce checks the linear search for a
// flipped bit against flipping every bit and recomputing the checksum, and
// that it says -1 when two bits differ.
func TestSingleBitErrorMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 9, 33, 100, 600} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		want := crc32.Checksum(msg, castagnoli)
		for pos := range 8 * n {
			bad := bytes.Clone(msg)
			bad[pos/8] ^= 1 << (pos % 8)
			got := crc32.Checksum(bad, castagnoli)
			if at := singleBitError(bad, got^want); at != pos {
				t.Fatalf("%d-byte message, bit %d flipped: singleBitError says %d", n, pos, at)
			}
		}
		if n >= 2 {
			bad := bytes.Clone(msg)
			bad[0] ^= 1
			bad[n-1] ^= 0x80
			if at := singleBitError(bad, crc32.Checksum(bad, castagnoli)^want); at != -1 {
				t.Fatalf("%d-byte message, two bits flipped: singleBitError says bit %d alone explains it", n, at)
			}
		}
	}
}

// tornLog is a closed one-segment log whose last batch spans several
// sectors: a batch of small entries and a HardState, then a batch of three
// entries of about 1.5 KiB each, written and fdatasynced by Save.
type tornLog struct {
	dir     string
	opts    Options
	data    []byte
	records []scannedRecord
	end     int64
	last    int // index in records of the last batch's first record
	written []Entry
}

func writeTornLog(t *testing.T) tornLog {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 16 << 10
	w, _ := mustOpen(t, dir, opts)
	first := entries(1, 3, 1)
	mustSave(t, w, Batch{Entries: first, HardState: &HardState{Term: 1, Vote: 1, Commit: 3}})
	var big []Entry
	for i := uint64(4); i <= 6; i++ {
		big = append(big, Entry{Index: i, Term: 1, Data: bytes.Repeat(fmt.Appendf(nil, "big entry %d ", i), 120)})
	}
	mustSave(t, w, Batch{Entries: big})
	mustClose(t, w)
	data, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	scan := scanSegment("", 0, data)
	if scan.problem != nil || len(scan.records) != 7 {
		t.Fatalf("fixture: expected 7 clean records, scan found %d and problem %v", len(scan.records), scan.problem)
	}
	return tornLog{dir: dir, opts: opts, data: data, records: scan.records, end: scan.end, last: 4, written: append(first, big...)}
}

func (l tornLog) recordEnd(i int) int64 {
	if i+1 < len(l.records) {
		return l.records[i+1].offset
	}
	return l.end
}

// recordAt is the index of the record that holds offset off.
func (l tornLog) recordAt(off int64) int {
	for i := range l.records {
		if off < l.recordEnd(i) {
			return i
		}
	}
	return -1
}

// entriesBefore counts the written entries whose records end at or before
// off.
func (l tornLog) entriesBefore(off int64) int {
	n := 0
	for i, r := range l.records {
		if r.typ == recEntry && l.recordEnd(i) <= off {
			n++
		}
	}
	return n
}

// openDamaged writes data as the log's only segment and opens it, with the
// log's lines captured.
func (l tornLog) openDamaged(t *testing.T, data []byte) (*Recovered, string, error) {
	t.Helper()
	dir := writeSegment(t, data)
	var logged bytes.Buffer
	opts := l.opts
	opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	w, rec, err := Open(dir, opts)
	if err == nil {
		mustClose(t, w)
	}
	return rec, logged.String(), err
}

// TestLastRecordDamage is the torn-or-corrupt rule for damage in the last
// write of the newest segment: what a write that did not complete leaves
// (the file cut short, sectors left zero) is truncated and logged; bytes
// that reached the disk whole and read back otherwise are corruption, and
// Open refuses the log naming file and offset.
func TestLastRecordDamage(t *testing.T) {
	l := writeTornLog(t)
	lastRec := l.records[len(l.records)-1]

	t.Run("Regression: flipped bit in the last record is corruption, not a torn tail", func(t *testing.T) {
		// The last record of a batch is usually its HardState: losing
		// it to a "torn tail" silently restores an older term and vote.
		dir := t.TempDir()
		opts := testOptions()
		w, _ := mustOpen(t, dir, opts)
		mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 2}})
		mustSave(t, w, Batch{Entries: entries(4, 4, 2), HardState: &HardState{Term: 2, Vote: 3, Commit: 3}})
		mustClose(t, w)
		path := segPath(dir, 0)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		scan := scanSegment(path, 0, data)
		hs := scan.records[len(scan.records)-1]
		if hs.typ != recHardState {
			t.Fatalf("fixture: expected the last record to be a hard state, found a %s", typeName(hs.typ))
		}
		data[hs.offset+recordHeaderSize+8] ^= 0x02 // the vote: 3 -> 1
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		w, rec, err := Open(dir, opts)
		if err == nil {
			w.Close()
			t.Fatalf("Open of a log whose synced hard state has a flipped bit: expected *CorruptionError at %s:%d, "+
				"opened with torn tail %+v and hard state %+v", path, hs.offset, rec.TornTail, rec.HardState)
		}
		var ce *CorruptionError
		if !errors.As(err, &ce) || ce.File != path || ce.Offset != hs.offset {
			t.Fatalf("expected *CorruptionError at %s:%d, got %v", path, hs.offset, err)
		}
		if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, fmt.Sprint(hs.offset)) {
			t.Fatalf("the error should name the file and the offset: %v", err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(after, data) {
			t.Fatal("a refused Open changed the segment")
		}
		r, err := Verify(dir)
		if err != nil || r.Problem == nil || r.TornTail != nil || r.Problem.Offset != hs.offset {
			t.Fatalf("Verify: expected corruption at %d and no torn tail, got %+v / %v", hs.offset, r, err)
		}
		if !strings.Contains(r.String(), "damaged: ") {
			t.Fatalf("the verify report should call it damage, not a torn tail:\n%s", r)
		}
		// Repair is the explicit way on: it cuts at the same offset and
		// says so.
		r, err = Repair(dir, RepairOptions{})
		if err != nil || len(r.Dropped) != 1 || r.Dropped[0].File != path || r.Dropped[0].Offset != hs.offset {
			t.Fatalf("Repair: expected one cut of %s at %d, got %+v / %v", path, hs.offset, r, err)
		}
		if rec := reopen(t, dir, opts); rec.TornTail != nil || rec.HardState != (HardState{Term: 1, Vote: 1, Commit: 2}) {
			t.Fatalf("after repair: expected the previous hard state and no torn tail, got %+v / %+v", rec.HardState, rec.TornTail)
		}
	})

	torn := []struct {
		name   string
		damage func(data []byte) []byte
		at     int64 // where the torn tail starts
	}{
		{"the file ends inside the last record", func(d []byte) []byte { return d[:lastRec.offset+200] }, lastRec.offset},
		{"the file ends inside the last record's header", func(d []byte) []byte { return d[:lastRec.offset+5] }, lastRec.offset},
		{"zeroes from a sector boundary inside the last record", func(d []byte) []byte {
			clear(d[(lastRec.offset/sectorSize+2)*sectorSize:])
			return d
		}, lastRec.offset},
		{"one zeroed sector inside the last record", func(d []byte) []byte {
			s := (lastRec.offset/sectorSize + 1) * sectorSize
			clear(d[s : s+sectorSize])
			return d
		}, lastRec.offset},
		{"the last record's header is zero, its payload written", func(d []byte) []byte {
			clear(d[lastRec.offset : lastRec.offset+recordHeaderSize])
			return d
		}, lastRec.offset},
	}
	for _, tc := range torn {
		t.Run("torn: "+tc.name, func(t *testing.T) {
			rec, logged, err := l.openDamaged(t, tc.damage(bytes.Clone(l.data)))
			if err != nil {
				t.Fatalf("expected a torn tail at %d, Open failed: %v", tc.at, err)
			}
			if rec.TornTail == nil || rec.TornTail.Offset != tc.at {
				t.Fatalf("expected a torn tail at %d, got %+v", tc.at, rec.TornTail)
			}
			equalEntries(t, tc.name, rec.Entries, l.written[:l.entriesBefore(tc.at)])
			if !strings.Contains(logged, "truncated torn tail") || !strings.Contains(logged, fmt.Sprintf("offset=%d", tc.at)) {
				t.Fatalf("expected the truncation logged with its offset %d, the log says:\n%s", tc.at, logged)
			}
		})
	}

	corrupt := []struct {
		name   string
		damage func(data []byte)
		why    string
	}{
		{"a flipped bit in the last record's payload", func(d []byte) { d[lastRec.offset+700] ^= 0x10 }, "one flipped bit"},
		{"a flipped bit in the last record's checksum", func(d []byte) { d[lastRec.offset+5] ^= 0x01 }, "exactly one bit"},
		{"a flipped bit in the last record's type", func(d []byte) { d[lastRec.offset+8] ^= 0x01 }, "one flipped bit"},
		{"a flipped low bit in the last record's length", func(d []byte) { d[lastRec.offset] ^= 0x04 }, "length field flipped"},
		{"a flipped high bit in the last record's length (past the end of the file)", func(d []byte) { d[lastRec.offset+3] ^= 0x08 }, "length field flipped"},
		{"garbled bytes in a complete last record", func(d []byte) {
			for i := range int64(16) {
				d[lastRec.offset+300+i] ^= 0x5a
			}
		}, "none of its 512-byte sectors is zeroed"},
	}
	for _, tc := range corrupt {
		t.Run("corrupt: "+tc.name, func(t *testing.T) {
			data := bytes.Clone(l.data)
			tc.damage(data)
			rec, _, err := l.openDamaged(t, data)
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Offset != lastRec.offset {
				var torn *TornTail
				if rec != nil {
					torn = rec.TornTail
				}
				t.Fatalf("expected *CorruptionError at offset %d, got %v (torn tail %+v)", lastRec.offset, err, torn)
			}
			if !strings.Contains(ce.Reason, tc.why) {
				t.Fatalf("expected the reason to say %q, got %q", tc.why, ce.Reason)
			}
		})
	}
}

// TestTornWriteAtEverySector tears the last write at every sector it
// covers, the two ways a power loss can: everything from a sector boundary
// on left zero, or one sector left zero with the ones after it written. A
// tear within the last record, or with nothing that decodes after it, is
// truncated exactly before the damaged record; a zeroed sector followed by
// a later record that reached the disk is corruption (the write was not a
// prefix).
func TestTornWriteAtEverySector(t *testing.T) {
	l := writeTornLog(t)
	start := l.records[l.last].offset
	for s := (start/sectorSize + 1) * sectorSize; s < l.end; s += sectorSize {
		damaged := l.recordAt(s)
		at := l.records[damaged].offset
		if at == s {
			continue // a tear between two records is a clean end, TestTornTailAtEveryOffset's case
		}
		for _, mode := range []string{"prefix", "hole"} {
			data := bytes.Clone(l.data)
			if mode == "prefix" {
				clear(data[s:])
			} else {
				clear(data[s:min(s+sectorSize, int64(len(data)))])
			}
			rec, _, err := l.openDamaged(t, data)
			laterWhole := false
			for i := damaged + 1; i < len(l.records); i++ {
				if l.records[i].offset >= s+sectorSize {
					laterWhole = true
				}
			}
			if mode == "hole" && laterWhole {
				var ce *CorruptionError
				if !errors.As(err, &ce) || ce.Offset != at || !strings.Contains(ce.Reason, "valid record(s) follow") {
					t.Fatalf("%s torn at sector %d: expected corruption at %d with records after it, got %v", mode, s, at, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s torn at sector %d: expected a torn tail at %d, Open failed: %v", mode, s, at, err)
			}
			if rec.TornTail == nil || rec.TornTail.Offset != at {
				t.Fatalf("%s torn at sector %d: expected a torn tail at %d, got %+v", mode, s, at, rec.TornTail)
			}
			equalEntries(t, fmt.Sprintf("%s torn at sector %d", mode, s), rec.Entries, l.written[:l.entriesBefore(at)])
		}
	}
}

// TestNotTornCanSayTorn is the classifier on its own, for what a zeroed
// piece at a record's edge means: a HardState whose zero high bytes fall
// in the next sector is still corruption when one bit is flipped, and torn
// when its written part was lost as a sector.
func TestNotTornCanSayTorn(t *testing.T) {
	hs := appendHardStateRecord(nil, HardState{Term: 7, Vote: 2, Commit: 40})
	// Place the record so that its last four bytes (the zero high bytes
	// of Commit) lie in the next sector.
	off := sectorSize - (len(hs) - 4)
	data := make([]byte, 2*sectorSize)
	for i := range off {
		data[i] = 0xee // earlier records
	}
	copy(data[off:], hs)
	if !hasZeroSector(data, off, off+len(hs)) {
		t.Fatal("fixture: expected the record's piece past the sector boundary to be zero")
	}

	flipped := bytes.Clone(data)
	flipped[off+recordHeaderSize+8] ^= 0x01 // the vote
	if why := notTorn(flipped, off); why == "" {
		t.Fatal("a flipped bit in a hard state whose last piece is zero: judged torn, expected corruption")
	}
	twoBits := bytes.Clone(data)
	twoBits[off+recordHeaderSize] ^= 0x03 // the term, two bits
	if why := notTorn(twoBits, off); why != "" {
		t.Fatalf("two flipped bits with a zeroed piece: expected torn (the rule cannot tell), got %q", why)
	}
	lost := bytes.Clone(data)
	binary.LittleEndian.PutUint64(lost[off+recordHeaderSize+16:], 0xabcd<<32|40) // a commit whose high bytes were written...
	binary.LittleEndian.PutUint32(lost[off+4:], crc32.Checksum(lost[off+8:off+len(hs)], castagnoli))
	clear(lost[sectorSize:]) // ...and lost with their sector
	if why := notTorn(lost, off); why != "" {
		t.Fatalf("a hard state whose second sector was lost: expected torn, got %q", why)
	}
	// A lost sector whose only set bit a single flip would explain is
	// still a lost sector: the commit's byte 2 is 1, the rest of its
	// suffix zero.
	oneBit := appendHardStateRecord(nil, HardState{Term: 7, Vote: 2, Commit: 1<<16 | 40})
	at := sectorSize - (len(oneBit) - 6)
	single := make([]byte, 2*sectorSize)
	copy(single[at:], oneBit)
	clear(single[sectorSize:])
	if why := notTorn(single, at); why != "" {
		t.Fatalf("a hard state whose lost sector held one set bit: expected torn, got %q", why)
	}
	if why := notTorn(data[:off+len(hs)-1], off); why != "" {
		t.Fatalf("a record cut by the end of the file: expected torn, got %q", why)
	}
	whole := bytes.Clone(data)
	whole[off+2] = 0xff // a length far past the end, more than one bit off
	if why := notTorn(whole, off); why != "" {
		t.Fatalf("a length past the end of the file: expected torn, got %q", why)
	}
}

// TestTearsAreTornFlipsAreCorrupt writes seeded random batches the way the
// writer does (one contiguous write into preallocated zeroes) and checks
// both directions of the rule on each: the write torn at every sector
// boundary inside it (the rest left zero, as a power cut leaves it) is
// never called corruption, and every single-bit flip in its last record,
// a HardState, is never called a torn tail — save a flip that clears the
// only set bit of a sector piece, which is what a lost sector looks like.
func TestTearsAreTornFlipsAreCorrupt(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	classify := func(data []byte) *inspection {
		in, err := inspectSegments([]uint64{0}, func(uint64) (*segmentScan, error) {
			return scanSegment(segmentName(0), 0, data), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	tears, flips := 0, 0
	for trial := range 200 {
		seg := appendSegmentHeader(nil, 0, untaggedVersion)
		index := uint64(1)
		for range rng.IntN(6) {
			seg = appendEntryRecord(seg, Entry{Index: index, Term: 1, Data: bytes.Repeat([]byte{'p'}, rng.IntN(300))})
			index++
		}
		start := len(seg)
		for range 1 + rng.IntN(4) {
			d := make([]byte, rng.IntN(700))
			for i := range d {
				d[i] = byte(rng.Uint32() | 1)
			}
			seg = appendEntryRecord(seg, Entry{Index: index, Term: 2, Data: d})
			index++
		}
		hsAt := len(seg)
		seg = appendHardStateRecord(seg, HardState{Term: 2 + rng.Uint64N(1<<rng.IntN(40)), Vote: rng.Uint64N(8), Commit: rng.Uint64N(1 << rng.IntN(40))})
		end := len(seg)
		whole := append(seg, make([]byte, 8192)...)
		if in := classify(whole); in.problem != nil {
			t.Fatalf("trial %d: the untouched segment: %v", trial, in.problem)
		}

		for b := (start/sectorSize + 1) * sectorSize; b < end; b += sectorSize {
			data := bytes.Clone(whole)
			clear(data[b:end])
			if in := classify(data); in.problem != nil && in.torn == nil {
				t.Fatalf("trial %d: the write [%d,%d) torn at sector %d: called corruption: %v", trial, start, end, b, in.problem)
			}
			tears++
		}

		for pos := hsAt * 8; pos < end*8; pos++ {
			data := bytes.Clone(whole)
			data[pos/8] ^= 1 << (pos % 8)
			if inZeroPiece(data, hsAt, end, pos/8) {
				continue
			}
			in := classify(data)
			if in.torn != nil || in.problem == nil || in.problem.Offset != int64(hsAt) {
				t.Fatalf("trial %d: bit %d of the hard state at %d flipped: expected corruption there, got problem %v, torn %+v", trial, pos-hsAt*8, hsAt, in.problem, in.torn)
			}
			flips++
		}
	}
	t.Logf("%d tears, %d flips", tears, flips)
}
