package wal

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// recordingFS is the real file system that writes down every change it
// makes, in order, with paths relative to root; failSync makes Datasync of
// files whose name ends with its value fail.
type recordingFS struct {
	osFS
	root     string
	failSync string

	mu  sync.Mutex
	ops []string
}

func (r *recordingFS) note(op, path string) {
	rel, err := filepath.Rel(r.root, path)
	if err != nil {
		rel = path
	}
	r.mu.Lock()
	r.ops = append(r.ops, op+" "+rel)
	r.mu.Unlock()
}

func (r *recordingFS) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

func (r *recordingFS) CreateExclusive(path string) (segmentFile, error) {
	r.note("create", path)
	f, err := r.osFS.CreateExclusive(path)
	if err != nil {
		return nil, err
	}
	return &recordingFile{segmentFile: f, fs: r, path: path}, nil
}

func (r *recordingFS) Rename(from, to string) error {
	r.note("rename", from)
	return r.osFS.Rename(from, to)
}

func (r *recordingFS) Remove(path string) error {
	err := r.osFS.Remove(path)
	if err == nil {
		r.note("remove", path)
	}
	return err
}

func (r *recordingFS) Mkdir(path string) error {
	r.note("mkdir", path)
	return r.osFS.Mkdir(path)
}

func (r *recordingFS) SyncDir(dir string) error {
	r.note("syncdir", dir)
	return r.osFS.SyncDir(dir)
}

type recordingFile struct {
	segmentFile
	fs   *recordingFS
	path string
}

func (f *recordingFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.note("write", f.path)
	return f.segmentFile.WriteAt(p, off)
}

func (f *recordingFile) Datasync() error {
	f.fs.note("datasync", f.path)
	if f.fs.failSync != "" && strings.HasSuffix(f.path, f.fs.failSync) {
		return &os.PathError{Op: "fdatasync", Path: f.path, Err: syscall.EIO}
	}
	return f.segmentFile.Datasync()
}

// indexOf returns the position of op in ops, or -1.
func indexOf(ops []string, op string) int { return slices.Index(ops, op) }

// Regression: a metadata file is written to a temporary
// name, synced, renamed and its directory synced — in that order — so a
// crash can never leave it empty or half-written.
func TestWriteFileAtomicIsTmpSyncRenameSyncDir(t *testing.T) {
	root := t.TempDir()
	fsys := &recordingFS{root: root}
	path := filepath.Join(root, "schema.fingerprint")
	if err := writeFileAtomic(fsys, path, []byte("v1\n")); err != nil {
		t.Fatal(err)
	}
	want := []string{"create schema.fingerprint.tmp", "write schema.fingerprint.tmp", "datasync schema.fingerprint.tmp",
		"rename schema.fingerprint.tmp", "syncdir ."}
	if got := fsys.log(); !slices.Equal(got, want) {
		t.Fatalf("operations:\n got  %q\n want %q", got, want)
	}
	if got, _ := os.ReadFile(path); string(got) != "v1\n" {
		t.Fatalf("content: expected %q, found %q", "v1\n", got)
	}
}

// Regression: when the write cannot be made durable the
// old content stays and no temporary file is left behind.
func TestWriteFileAtomicFailureKeepsOldContent(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "meta")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	fsys := &recordingFS{root: root, failSync: "meta.tmp"}
	err := writeFileAtomic(fsys, path, []byte("new content"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("expected the fdatasync error, got %v", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("after a failed write: expected the old content %q, found %q", "old", got)
	}
	if _, err := os.Stat(path + tmpSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected no %s left, stat says %v", filepath.Base(path)+tmpSuffix, err)
	}
}

// Regression: a WAL directory created by Open is made
// durable in its parent (the data dir) before anything is written in it.
func TestOpenSyncsTheParentOfANewWALDirectory(t *testing.T) {
	root := t.TempDir()
	dataDir := filepath.Join(root, "n1")
	fsys := &recordingFS{root: root}
	w, _, err := open(filepath.Join(dataDir, "wal"), testOptions(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	ops := fsys.log()
	for _, pair := range [][2]string{{"mkdir n1", "syncdir ."}, {"mkdir n1/wal", "syncdir n1"}} {
		made, synced := indexOf(ops, pair[0]), indexOf(ops, pair[1])
		if made < 0 || synced < made {
			t.Fatalf("expected %q followed by %q; operations were %q", pair[0], pair[1], ops)
		}
	}
	first := slices.IndexFunc(ops, func(op string) bool { return strings.HasPrefix(op, "create n1/wal/") })
	if first < indexOf(ops, "syncdir n1") {
		t.Fatalf("a file was created in the WAL directory before its entry was synced: %q", ops)
	}
}

// Regression: even when the WAL directory already exists
// (an earlier run made it and may have crashed before syncing), Open syncs
// its parent.
func TestOpenSyncsTheParentOfAnExistingWALDirectory(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "n1", "wal"), 0o755); err != nil {
		t.Fatal(err)
	}
	fsys := &recordingFS{root: root}
	w, _, err := open(filepath.Join(root, "n1", "wal"), testOptions(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	if ops := fsys.log(); indexOf(ops, "syncdir n1") < 0 {
		t.Fatalf("expected the data dir synced; operations were %q", ops)
	}
}

// Regression: leftover temporary files are removed at
// start with a log line naming each, and the removal is made durable.
func TestOpenRemovesAndLogsLeftoverTemporaries(t *testing.T) {
	dir := t.TempDir()
	w, _ := mustOpen(t, dir, testOptions())
	mustClose(t, w)
	tmp := filepath.Join(dir, segmentName(7)+tmpSuffix)
	if err := os.WriteFile(tmp, []byte("half-made segment"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	opts := testOptions()
	opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	fsys := &recordingFS{root: dir}
	w, _, err := open(dir, opts, fsys)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, w)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected %s removed, stat says %v", filepath.Base(tmp), err)
	}
	if !strings.Contains(logged.String(), "removed a temporary file") || !strings.Contains(logged.String(), filepath.Base(tmp)) {
		t.Fatalf("expected a log line naming %s, log was:\n%s", filepath.Base(tmp), logged.String())
	}
	ops := fsys.log()
	if removed, synced := indexOf(ops, "remove "+filepath.Base(tmp)), indexOf(ops, "syncdir ."); removed < 0 || synced < removed {
		t.Fatalf("expected the removal followed by a directory sync; operations were %q", ops)
	}
}

func TestMkdirAllDurableRefusesAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllDurable(path); err == nil || !strings.Contains(err.Error(), "expected a directory") {
		t.Fatalf("expected an error saying a directory was expected, got %v", err)
	}
}

// A file written in pieces is their concatenation, synced after every
// syncEvery bytes and once more at the end, then renamed (a
// 131 MB snapshot synced once held the WAL's fdatasyncs behind it).
func TestWriteFileAtomicPiecesSyncsInPieces(t *testing.T) {
	root := t.TempDir()
	fsys := &recordingFS{root: root}
	path := filepath.Join(root, "big")
	pieces := [][]byte{[]byte("abc"), []byte("defghij"), nil, []byte("k")}
	if err := writeFileAtomicPieces(fsys, path, pieces, 4); err != nil {
		t.Fatal(err)
	}
	var syncs, writes int
	for _, op := range fsys.log() {
		switch op {
		case "datasync big.tmp":
			syncs++
		case "write big.tmp":
			writes++
		}
	}
	// 11 bytes, a sync after bytes 4 and 8, and the final one.
	if syncs != 3 || writes != 5 {
		t.Fatalf("expected 5 writes and 3 fdatasyncs, found %d and %d: %q", writes, syncs, fsys.log())
	}
	if got, _ := os.ReadFile(path); string(got) != "abcdefghijk" {
		t.Fatalf("content: expected %q, found %q", "abcdefghijk", got)
	}
}
