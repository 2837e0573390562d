package nemesis

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// writeWAL writes a small real log under root/wal with tidal-server's
// wal package: entries, and a hard state after every few.
func writeWAL(t *testing.T, root string, entries int) {
	t.Helper()
	w, _, err := wal.Open(filepath.Join(root, "wal"), wal.Options{SegmentSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= entries; i++ {
		b := wal.Batch{Entries: []wal.Entry{{Index: uint64(i), Term: 1, Data: []byte(fmt.Sprintf("entry %d %s", i, strings.Repeat("x", i%50)))}}}
		if i%4 == 0 {
			b.HardState = &wal.HardState{Term: 1, Commit: uint64(i)}
		}
		if err := w.Save(context.Background(), b, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// flipCopy copies root to a new directory with cr applied to the bytes on
// disk, as faultfs applies it to what reads return.
func flipCopy(t *testing.T, root string, cr faultfs.CorruptRead) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if filepath.ToSlash(rel) == cr.Path {
			mask := cr.Mask
			if mask == 0 {
				mask = 0x01
			}
			for i := cr.Offset; i < cr.Offset+cr.Length && i < int64(len(b)); i++ {
				b[i] ^= mask
			}
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestPickCorruptRangeInsideAWALRecordBody: the range corrupt-read picks
// for wal-record lies inside a record's body, and tidal-server's WAL,
// reading it flipped, refuses the log as corruption naming the file and
// the record's offset — never a torn tail it would cut off and carry on
// without. Regression: corrupt-read flipped only segment
// headers.
func TestPickCorruptRangeInsideAWALRecordBody(t *testing.T) {
	root := t.TempDir()
	writeWAL(t, root, 200) // several 64 KiB segments
	seen := map[string]bool{}
	for seed := int64(1); seed <= 12; seed++ {
		cr, what, err := pickCorruptRange(root, CorruptPick{Where: CorruptWALRecord, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(cr.Path, "wal/") || !strings.HasSuffix(cr.Path, ".wal") || cr.Offset < 29 || cr.Length < 1 || cr.Length > corruptSpan {
			t.Fatalf("seed %d: picked %+v (%s), want a few bytes past the segment header of one segment", seed, cr, what)
		}
		seen[fmt.Sprintf("%s@%d", cr.Path, cr.Offset)] = true
		_, err = wal.Read(filepath.Join(flipCopy(t, root, cr), "wal"))
		var ce *wal.CorruptionError
		if !errors.As(err, &ce) {
			t.Fatalf("seed %d: %s flipped: wal.Read = %v, want a *CorruptionError", seed, what, err)
		}
		if filepath.Base(ce.File) != filepath.Base(cr.Path) || ce.Offset > cr.Offset || cr.Offset-ce.Offset > 9+60 {
			t.Errorf("seed %d: corruption reported at %s offset %d, want the record holding %s offset %d", seed, ce.File, ce.Offset, cr.Path, cr.Offset)
		}
	}
	if len(seen) < 6 {
		t.Errorf("12 seeds picked only %d ranges: %v", len(seen), seen)
	}
	// Unflipped, the same copy reads clean: the refusal is the flip's.
	if _, err := wal.Read(filepath.Join(flipCopy(t, root, faultfs.CorruptRead{}), "wal")); err != nil {
		t.Fatalf("the copy without a flip: %v", err)
	}
}

// The picker's WAL ranges lie inside the payloads of records the real WAL
// writer wrote, never in a header, never in the last record of a segment,
// and reach every segment: the framing is the WAL's own
// (wal.SegmentRecords), checked there against what the writer wrote
// (TestSegmentRecordsMatchTheWriter); here, that the picker aims within it.
func TestPickCorruptRangeMatchesTheWALWritersRecords(t *testing.T) {
	root := t.TempDir()
	w, _, err := wal.Open(filepath.Join(root, "wal"), wal.Options{SegmentSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4000; i += 10 { // several 64 KiB segments
		var b wal.Batch
		for j := i; j < i+10; j++ {
			b.Entries = append(b.Entries, wal.Entry{Index: uint64(j), Term: 1, Data: []byte(fmt.Sprintf("entry %d %s", j, strings.Repeat("x", j%50)))})
		}
		b.HardState = &wal.HardState{Term: 1, Commit: uint64(i)}
		if err := w.Save(context.Background(), b, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "wal")
	names, err := filesWithSuffix(dir, ".wal")
	if err != nil || len(names) < 2 {
		t.Fatalf("expected several segments, found %v (%v)", names, err)
	}
	spans := map[string][]wal.RecordSpan{}
	for _, name := range names {
		if spans["wal/"+name], err = wal.SegmentRecords(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]bool{}
	for seed := int64(1); seed <= 64; seed++ {
		cr, what, err := pickCorruptRange(root, CorruptPick{Where: CorruptWALRecord, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		recs := spans[cr.Path]
		inside := -1
		for i, sp := range recs {
			body := sp.Offset + wal.RecordHeaderSize
			if cr.Offset >= body && cr.Offset+cr.Length <= body+sp.Length {
				inside = i
			}
		}
		if inside < 0 || inside == len(recs)-1 || cr.Length < 1 {
			t.Fatalf("seed %d: picked %+v (%s): expected a range inside the payload of a record with another after it in %s", seed, cr, what, cr.Path)
		}
		files[cr.Path] = true
	}
	if len(files) < 2 {
		t.Errorf("64 seeds picked in %d segment(s) of %d: %v", len(files), len(names), files)
	}
}

// TestPickCorruptRangeSnapshotAndFallbacks: a snapshot pick lands inside
// the newest snapshot's payload; without a snapshot it picks a WAL record,
// and without a record that has another after it, segment headers.
func TestPickCorruptRangeSnapshotAndFallbacks(t *testing.T) {
	root := t.TempDir()
	cr, what, err := pickCorruptRange(root, CorruptPick{Where: CorruptSnapshot, Seed: 7})
	if err != nil || cr.Path != "*.wal" || cr.Offset != 0 || cr.Length != 16 {
		t.Fatalf("empty data dir: picked %+v (%s, %v), want the segment headers", cr, what, err)
	}
	writeWAL(t, root, 20)
	cr, what, err = pickCorruptRange(root, CorruptPick{Where: CorruptSnapshot, Seed: 7})
	if err != nil || !strings.HasPrefix(cr.Path, "wal/") {
		t.Fatalf("no snapshot: picked %+v (%s, %v), want a WAL record", cr, what, err)
	}
	snap := filepath.Join(root, "snap")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	// Snapshot files as tidal-server/replica frames them: a 24-byte
	// header (magic, version, checksum, payload length), then the payload.
	const snapFileHeader = 24
	for i, size := range []int{100, 300} { // the newest by name is the second
		b := make([]byte, snapFileHeader+size)
		copy(b, "TIDALSNP")
		binary.LittleEndian.PutUint64(b[16:], uint64(size))
		name := fmt.Sprintf("%016x-%016x.snap", 1, 10*(i+1))
		if err := os.WriteFile(filepath.Join(snap, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for seed := int64(1); seed <= 8; seed++ {
		cr, what, err = pickCorruptRange(root, CorruptPick{Where: CorruptSnapshot, Seed: seed})
		if err != nil || cr.Path != fmt.Sprintf("snap/%016x-%016x.snap", 1, 20) || cr.Offset < snapFileHeader || cr.Offset+cr.Length > snapFileHeader+300 || cr.Length < 1 {
			t.Fatalf("seed %d: picked %+v (%s, %v), want bytes inside the newest snapshot's payload", seed, cr, what, err)
		}
	}
	if _, _, err := pickCorruptRange(root, CorruptPick{Where: "everywhere"}); err == nil {
		t.Error("an unknown where: expected an error")
	}
}

// corrupt-read arms the range it picked on the target's files and records
// it; the heal records what the fault did (its effect).
func TestCorruptReadArmsThePickedRangeAndRecordsIt(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	d, _ := f.disk("n3")
	d.dir = t.TempDir()
	writeWAL(t, d.dir, 30)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	st := stepFor(t, "corrupt-read", "n3")
	st.Disk.Corrupt = &CorruptPick{Where: CorruptWALRecord, Seed: 5}
	must(t, r.Inject(ctx, st))
	cr := d.faults().CorruptRead
	if len(cr) != 1 || !strings.HasPrefix(cr[0].Path, "wal/") || cr[0].Offset == 0 {
		t.Fatalf("n3's disk: expected a range inside a WAL record armed, found %+v", cr)
	}
	must(t, r.Heal(ctx, "corrupt-read"))
	rec.Close()
	var armed, healed diskParams
	for _, op := range readHistory(t, rec, path) {
		v, _ := history.Decode[history.FaultValue](op)
		switch {
		case op.F == FDisk && op.Type == history.OK:
			must(t, json.Unmarshal(v.Params, &armed))
		case op.F == history.HealOf(FDisk) && op.Type == history.OK:
			must(t, json.Unmarshal(v.Params, &healed))
		}
	}
	if p, ok := armed.Picked["n3"]; !ok || p.CorruptRead != cr[0] || !strings.Contains(p.What, "inside the body of the WAL record") {
		t.Fatalf("the fault's ok: expected n3's picked range recorded, found %+v", armed)
	}
	if _, ok := healed.Effect["n3"]; !ok {
		t.Fatalf("the heal's ok: expected n3's effect recorded, found %+v", healed)
	}
}

// disk-full charges overwrites from the moment it is armed, so the next
// WAL append bites; slow-disk-stall holds one node's writes and fsyncs
// until the heal.
func TestDiskFullAndStallSpecs(t *testing.T) {
	full := stepFor(t, "disk-full")
	if df := full.Disk.Faults.DiskFull; df == nil || df.FreeBytes != 0 || !df.CountOverwrites {
		t.Fatalf("disk-full spec: %+v, want zero free bytes counting overwrites", full.Disk.Faults)
	}
	stall := stepFor(t, "slow-disk-stall")
	sd := stall.Disk.Faults.SlowDisk
	if len(sd) != 1 || !sd[0].Stall || sd[0].MaxStall != 0 || !slices.Equal(sd[0].Ops, []faultfs.Op{faultfs.OpWrite, faultfs.OpFsync}) || len(stall.Targets) != 1 {
		t.Fatalf("slow-disk-stall spec: %+v on %v, want writes and fsyncs stalled on one node", sd, stall.Targets)
	}
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	stall.Targets = []string{"n1"}
	must(t, r.Inject(ctx, stall))
	d, _ := f.disk("n1")
	if got := d.faults().SlowDisk; len(got) != 1 || !got[0].Stall {
		t.Fatalf("n1's disk: expected a stall armed, found %+v", d.faults())
	}
	must(t, r.Heal(ctx, "slow-disk-stall"))
	if d.faults().SlowDisk != nil {
		t.Fatalf("after the heal: expected the stall cleared, found %+v", d.faults())
	}
	rec.Close()
	kinds := map[string]bool{}
	for _, op := range readHistory(t, rec, path) {
		v, _ := history.Decode[history.FaultValue](op)
		kinds[op.F+"/"+v.Kind] = true
	}
	if !kinds[FDisk+"/slow-disk-stall"] || !kinds[history.HealOf(FDisk)+"/slow-disk-stall"] {
		t.Fatalf("history: expected the stall recorded as kind slow-disk-stall, found %v", kinds)
	}
}
