//go:build tidalbugs

package wal

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/bugs"
)

// The planted WAL defects, each shown switched off (the
// WAL's real behaviour) and on (the defect), so a hook that silently does
// nothing fails here rather than passing the chaos suite by luck. Run with
// `go test -tags tidalbugs ./tidal-server/wal/`.

func withDefect(t *testing.T, d bugs.Defect) {
	t.Helper()
	if bugs.Active(d) {
		t.Fatalf("defect %d is already on for this process (TIDAL_BUGS set?); the off half of the test would prove nothing", d)
	}
	t.Cleanup(bugs.Enable(d))
}

// ackBeforeFsync stages one batch while every fdatasync is held at a gate
// and reports whether its waiter was released before the sync went on.
func ackBeforeFsync(t *testing.T) (releasedEarly bool) {
	t.Helper()
	w, fs := openFault(t, t.TempDir(), testOptions())
	defer mustClose(t, w)
	entered, release := fs.gate()
	defer close(release)
	p, err := w.Stage(Batch{Entries: entries(1, 1, 1)}, true)
	if err != nil {
		t.Fatal(err)
	}
	<-entered // the writer is inside the fdatasync, held
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("waiter: expected nil, found %v", err)
		}
		return true
	default:
		return false
	}
}

func TestPlantedAckBeforeFsyncReleasesWaitersBeforeTheSync(t *testing.T) {
	if ackBeforeFsync(t) {
		t.Fatal("defect off: the waiter was released while its fdatasync was held; expected it to wait")
	}
	withDefect(t, bugs.AckBeforeFsync)
	if !ackBeforeFsync(t) {
		t.Fatal("ack-before-fsync on: expected the waiter released before its fdatasync, found it still waiting")
	}
}

// segmentCreation opens a fresh log through a recording file system and
// returns what it did after renaming the first segment into place.
func segmentCreation(t *testing.T) []string {
	t.Helper()
	root := t.TempDir()
	rfs := &recordingFS{root: root}
	w, _, err := open(filepath.Join(root, "wal"), testOptions(), rfs)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	ops := rfs.log()
	i := indexOf(ops, "rename wal/"+segmentName(0)+tmpSuffix)
	if i < 0 {
		t.Fatalf("expected the first segment renamed into place, found %q", ops)
	}
	return ops[i+1:]
}

func TestPlantedSkipDirFsyncLeavesTheNewSegmentsNameUnsynced(t *testing.T) {
	if after := segmentCreation(t); indexOf(after, "syncdir wal") < 0 {
		t.Fatalf("defect off: expected the wal directory fsynced after the rename, found %q", after)
	}
	withDefect(t, bugs.SkipDirFsync)
	if after := segmentCreation(t); indexOf(after, "syncdir wal") >= 0 {
		t.Fatalf("skip-dir-fsync on: expected no directory fsync after the rename, found %q", after)
	}
}

// recoverAfterFive saves five synced entries in two batches, closes the
// log cleanly, and returns the indexes Open recovers.
func recoverAfterFive(t *testing.T) []uint64 {
	t.Helper()
	dir := t.TempDir()
	w, _ := mustOpen(t, dir, testOptions())
	mustSave(t, w, Batch{Entries: entries(1, 3, 1), HardState: &HardState{Term: 1, Commit: 2}})
	mustSave(t, w, Batch{Entries: entries(4, 5, 1), HardState: &HardState{Term: 1, Commit: 4}})
	mustClose(t, w)
	rec := reopen(t, dir, testOptions())
	var got []uint64
	for _, e := range rec.Entries {
		got = append(got, e.Index)
	}
	return got
}

func TestPlantedDropLastRecordOnRecoveryLosesTheNewestSyncedEntry(t *testing.T) {
	if got := recoverAfterFive(t); len(got) != 5 || got[4] != 5 {
		t.Fatalf("defect off: expected entries 1..5 recovered, found %v", got)
	}
	withDefect(t, bugs.DropLastRecordOnRecovery)
	if got := recoverAfterFive(t); len(got) != 4 || got[3] != 4 {
		t.Fatalf("drop-last-record-on-recovery on: expected entries 1..4 (entry 5 cut as a torn tail), found %v", got)
	}
}

// saveThroughFailedSync fails every fdatasync and returns what Save says,
// and what a Save after it says.
func saveThroughFailedSync(t *testing.T) (first, next error) {
	t.Helper()
	w, fs := openFault(t, t.TempDir(), testOptions())
	defer w.Close()
	eio := error(syscall.EIO)
	fs.failSync.Store(&eio)
	ctx := context.Background()
	first = w.Save(ctx, Batch{Entries: entries(1, 1, 1)}, true)
	next = w.Save(ctx, Batch{Entries: entries(2, 2, 1)}, true)
	return first, next
}

func TestPlantedIgnoreFsyncErrorCarriesOnAfterEIO(t *testing.T) {
	first, next := saveThroughFailedSync(t)
	if !errors.Is(first, ErrFenced) || !errors.Is(next, ErrFenced) {
		t.Fatalf("defect off: expected both Saves to fail with ErrFenced after EIO, found %v and %v", first, next)
	}
	withDefect(t, bugs.IgnoreFsyncError)
	first, next = saveThroughFailedSync(t)
	if first != nil || next != nil {
		t.Fatalf("ignore-fsync-error on: expected both Saves to succeed despite EIO, found %v and %v", first, next)
	}
}

// ack-before-fsync must not answer a waiter twice when the sync it raced
// then fails: the WAL still fences, and the next Save says so.
func TestPlantedAckBeforeFsyncStillFencesOnEIO(t *testing.T) {
	withDefect(t, bugs.AckBeforeFsync)
	w, fs := openFault(t, t.TempDir(), testOptions())
	defer w.Close()
	eio := error(syscall.EIO)
	fs.failSync.Store(&eio)
	ctx := context.Background()
	if err := w.Save(ctx, Batch{Entries: entries(1, 1, 1)}, true); err != nil {
		t.Fatalf("ack-before-fsync: expected the first Save answered before its failing sync, found %v", err)
	}
	var err error
	for i := uint64(2); err == nil && i < 1000; i++ {
		// The writer may not have fenced yet when the next Stage runs;
		// a Save admitted before the fence fails in its own group.
		err = w.Save(ctx, Batch{Entries: entries(i, i, 1)}, true)
	}
	if !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "fdatasync") {
		t.Fatalf("expected ErrFenced naming the fdatasync, found %v", err)
	}
}

// never-fsync: the group commit answers Save without one fdatasync of the
// segment (a WAL only a power cut can tell from a correct one); switched
// off, every Save
// that asks for durability is followed by one.
func TestPlantedNeverFsyncNeverSyncsTheSegment(t *testing.T) {
	datasyncs := func() int {
		root := t.TempDir()
		rfs := &recordingFS{root: root}
		w, _, err := open(filepath.Join(root, "wal"), testOptions(), rfs)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(1); i <= 3; i++ {
			if err := w.Save(context.Background(), Batch{Entries: entries(i, i, 1)}, true); err != nil {
				t.Fatal(err)
			}
		}
		mustClose(t, w)
		// Count after the first segment is in place: its creation syncs
		// the new file (that is not the group commit's).
		ops := rfs.log()
		i := indexOf(ops, "rename wal/"+segmentName(0)+tmpSuffix)
		if i < 0 {
			t.Fatalf("expected the first segment renamed into place, found %q", ops)
		}
		n := 0
		for _, op := range ops[i+1:] {
			if strings.HasPrefix(op, "datasync wal/") {
				n++
			}
		}
		return n
	}
	if n := datasyncs(); n == 0 {
		t.Fatal("defect off: expected the segment fdatasynced for the durable Saves, found none")
	}
	withDefect(t, bugs.NeverFsync)
	if n := datasyncs(); n != 0 {
		t.Fatalf("never-fsync on: expected no fdatasync of the segment, found %d", n)
	}
}
