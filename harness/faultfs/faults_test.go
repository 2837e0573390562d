package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// durableFile creates name in the mount with content and makes both the
// data and the name durable.
func durableFile(t *testing.T, mnt, name, content string) {
	t.Helper()
	p := filepath.Join(mnt, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	syncPath(t, p)
	syncPath(t, filepath.Dir(p))
}

func syncPath(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", p, err)
	}
}

func openRW(t *testing.T, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func pread(t *testing.T, fd int, n int) string {
	t.Helper()
	buf := make([]byte, n)
	k, err := unix.Pread(fd, buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:k])
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFsyncErrorReportsLostWritebackOnce pins the Linux semantics: the
// failing fsync returns EIO and drops the unsynced data (also from what
// reads return); another descriptor open at the time gets EIO once; later
// fsyncs succeed and the data stays lost, across a power cut too.
func TestFsyncErrorReportsLostWritebackOnce(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	p := filepath.Join(mnt, "a")
	durableFile(t, mnt, "a", "durable")
	fd1, fd2 := openRW(t, p), openRW(t, p)
	if _, err := unix.Pwrite(fd1, []byte("LOST"), 0); err != nil {
		t.Fatal(err)
	}
	if got := pread(t, fd2, 100); got != "LOSTble" {
		t.Fatalf("before the fsync, reads see the page cache: got %q, want %q", got, "LOSTble")
	}
	if err := f.Set(Faults{FsyncError: &FsyncError{Path: "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd1); !isErrno(err, syscall.EIO) {
		t.Fatalf("fsync with the fault armed: got %v, want EIO", err)
	}
	if got := pread(t, fd2, 100); got != "durable" {
		t.Errorf("after the failed fsync: read %q, want the durable %q (the dirty data is dropped)", got, "durable")
	}
	if err := unix.Fsync(fd1); err != nil {
		t.Errorf("second fsync on the descriptor that saw the error: got %v, want success (reported once)", err)
	}
	if err := unix.Fdatasync(fd2); !isErrno(err, syscall.EIO) {
		t.Errorf("first fdatasync on another descriptor open at the time: got %v, want EIO", err)
	}
	if err := unix.Fdatasync(fd2); err != nil {
		t.Errorf("second fdatasync on it: got %v, want success", err)
	}
	fd3 := openRW(t, p)
	if err := unix.Fsync(fd3); err != nil {
		t.Errorf("fsync on a descriptor opened after the error: got %v, want success", err)
	}
	if _, err := unix.Pwrite(fd3, []byte("+new"), 7); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd3); err != nil {
		t.Fatalf("fsync after the fault was spent: %v", err)
	}
	st := f.Stats().Faults
	if st.FsyncEIO != 1 || st.LostWritebackEIO != 1 || st.LostBytes != 4 {
		t.Errorf("stats: %+v, want 1 fsync EIO, 1 lost write-back reported, 4 bytes lost", st)
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p); got != "durable+new" {
		t.Errorf("after the power cut: %q, want %q", got, "durable+new")
	}
}

func TestFsyncErrorStickyFailsUntilCleared(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "x")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if err := f.Set(Faults{FsyncError: &FsyncError{Sticky: true}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := unix.Fsync(fd); !isErrno(err, syscall.EIO) {
			t.Fatalf("sticky fsync %d: got %v, want EIO", i, err)
		}
	}
	f.Clear(KindFsyncError)
	if err := unix.Fsync(fd); err != nil {
		t.Errorf("fsync after clear: %v", err)
	}
	if got := f.Stats().Faults.FsyncEIO; got != 3 {
		t.Errorf("fsync EIOs counted: %d, want 3", got)
	}
}

func TestFsyncErrorAfterNCallsAndGlob(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "x.log", "log")
	durableFile(t, mnt, "y.seg", "seg")
	logFd, segFd := openRW(t, filepath.Join(mnt, "x.log")), openRW(t, filepath.Join(mnt, "y.seg"))
	if err := f.Set(Faults{FsyncError: &FsyncError{Path: "*.seg", After: 2}}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := unix.Fsync(segFd); err != nil {
			t.Fatalf("matching fsync %d of the 2 let through: %v", i+1, err)
		}
		if err := unix.Fsync(logFd); err != nil {
			t.Fatalf("fsync of a file the glob does not match: %v", err)
		}
	}
	if err := unix.Fsync(segFd); !isErrno(err, syscall.EIO) {
		t.Fatalf("third matching fsync: got %v, want EIO", err)
	}
	if err := unix.Fsync(segFd); err != nil {
		t.Errorf("fsync after the one-shot fault: %v", err)
	}
	if f.Faults().FsyncError != nil {
		t.Errorf("a one-shot fsync error is spent once it fired, still armed: %+v", f.Faults().FsyncError)
	}
}

// TestFsyncErrorOnDirectories fails directory fsync only when Dirs is set,
// and a failed directory fsync makes nothing durable.
func TestFsyncErrorOnDirectories(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	if err := f.Set(Faults{FsyncError: &FsyncError{Sticky: true}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt) // Dirs unset: directories are not failed
	if err := f.Set(Faults{FsyncError: &FsyncError{Dirs: true, Sticky: true}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "b"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); !isErrno(err, syscall.EIO) {
		t.Fatalf("directory fsync with Dirs: got %v, want EIO", err)
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ := readTree(t, mnt)
	if _, ok := got["a"]; !ok {
		t.Errorf("a, made durable by a directory fsync the fault did not touch, is gone")
	}
	if _, ok := got["b"]; ok {
		t.Errorf("b survived though its directory's fsync failed")
	}
}

func TestDiskFull(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	p := filepath.Join(mnt, "a")
	durableFile(t, mnt, "a", "")
	fd := openRW(t, p)
	if err := f.Set(Faults{DiskFull: &DiskFull{FreeBytes: 10}}); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Pwrite(fd, []byte("12345678"), 0); n != 8 || err != nil {
		t.Fatalf("write that fits: %d, %v", n, err)
	}
	if n, err := unix.Pwrite(fd, []byte("abcdefgh"), 8); n != 2 || err != nil {
		t.Fatalf("write past the space left: got %d bytes, %v; want a short write of 2", n, err)
	}
	if _, err := unix.Pwrite(fd, []byte("z"), 10); !isErrno(err, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: got %v, want ENOSPC", err)
	}
	if n, err := unix.Pwrite(fd, []byte("OVER"), 0); n != 4 || err != nil {
		t.Errorf("overwrite inside the file on a full disk: %d, %v; want success", n, err)
	}
	if err := unix.Fallocate(fd, 0, 0, 1<<20); !isErrno(err, syscall.ENOSPC) {
		t.Errorf("fallocate on a full disk: got %v, want ENOSPC", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o644); !isErrno(err, syscall.ENOSPC) {
		t.Errorf("create on a full disk: got %v, want ENOSPC", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "dir"), 0o755); !isErrno(err, syscall.ENOSPC) {
		t.Errorf("mkdir on a full disk: got %v, want ENOSPC", err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Bavail != 0 {
		t.Errorf("statfs on a full disk: %d blocks available, want 0", sfs.Bavail)
	}
	if err := unix.Ftruncate(fd, 4); err != nil { // gives 6 bytes back
		t.Fatal(err)
	}
	if n, err := unix.Pwrite(fd, []byte("456789"), 4); n != 6 || err != nil {
		t.Errorf("write into space a truncate gave back: %d, %v", n, err)
	}
	if got := f.Stats().Faults.ENOSPC; got != 5 {
		t.Errorf("ENOSPC counted %d times, want 5 (short write, write, fallocate, create, mkdir)", got)
	}
	f.Clear(KindDiskFull)
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("room again"), 0o644); err != nil {
		t.Errorf("create after clear: %v", err)
	}
}

// TestSlowDiskDelaysOnlyItsOps checks that a latency fault happened (the
// operation took at least the latency; no upper bound is asserted) and
// applied to its operation class only.
func TestSlowDiskDelaysOnlyItsOps(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "x")
	fd := openRW(t, filepath.Join(mnt, "a"))
	const latency = 150 * time.Millisecond
	if err := f.Set(Faults{SlowDisk: []SlowDisk{{Ops: []Op{OpFsync}, Latency: latency}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if got := f.Stats().Faults.Delayed; got != 0 {
		t.Errorf("a write was delayed by a fsync-only fault (%d delayed)", got)
	}
	start := time.Now()
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < latency {
		t.Errorf("fsync took %s under a %s latency fault", took, latency)
	}
	if got := f.Stats().Faults.Delayed; got != 1 {
		t.Errorf("delayed operations: %d, want 1", got)
	}
}

func TestSlowDiskStallHoldsUntilClear(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "x")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if err := f.Set(Faults{SlowDisk: []SlowDisk{{Ops: []Op{OpWrite}, Stall: true}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := unix.Pwrite(fd, []byte("stalled"), 0)
		done <- err
	}()
	waitFor(t, "the write to stall", func() bool { return f.Stats().Faults.Stalled == 1 })
	select {
	case err := <-done:
		t.Fatalf("a stalled write returned (%v) before the fault was cleared", err)
	default:
	}
	f.Clear(KindSlowDisk)
	if err := <-done; err != nil {
		t.Fatalf("the stalled write, released: %v", err)
	}
	if got := pread(t, fd, 100); got != "stalled" {
		t.Errorf("after the stall: %q", got)
	}
}

// TestPowerCutReleasesStalledOps: a cut while an fsync is stalled fails
// that fsync, and the new mount works.
func TestPowerCutReleasesStalledOps(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "durable")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if _, err := unix.Pwrite(fd, []byte("unsynced"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Set(Faults{SlowDisk: []SlowDisk{{Ops: []Op{OpFsync}, Stall: true}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- unix.Fsync(fd) }()
	waitFor(t, "the fsync to stall", func() bool { return f.Stats().Faults.Stalled == 1 })
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Errorf("an fsync stalled across the power cut succeeded")
	}
	f.Clear(KindSlowDisk)
	if got := readFile(t, filepath.Join(mnt, "a")); got != "durable" {
		t.Errorf("after the cut: %q, want %q", got, "durable")
	}
}

func TestCorruptRead(t *testing.T) {
	f, backing, mnt := mountForTest(t, Options{})
	content := strings.Repeat("0123456789", 10)
	durableFile(t, mnt, "seg", content)
	durableFile(t, mnt, "other", content)
	if err := f.Set(Faults{CorruptRead: []CorruptRead{{Path: "seg", Offset: 10, Length: 5}}}); err != nil {
		t.Fatal(err)
	}
	got := readFile(t, filepath.Join(mnt, "seg"))
	if got == content {
		t.Fatalf("read of the corrupted range returned the backing bytes")
	}
	for i := range content {
		inRange := i >= 10 && i < 15
		if flipped := got[i] != content[i]; flipped != inRange {
			t.Errorf("byte %d: flipped %v, want flipped only in [10, 15)", i, flipped)
		} else if inRange && got[i] != content[i]^0x01 {
			t.Errorf("byte %d: %#x, want %#x (lowest bit flipped)", i, got[i], content[i]^0x01)
		}
	}
	if b := readFile(t, filepath.Join(backing, "seg")); b != content {
		t.Errorf("the backing file changed: corrupt reads must not write")
	}
	if o := readFile(t, filepath.Join(mnt, "other")); o != content {
		t.Errorf("a file the glob does not match read corrupt")
	}
	st := f.Stats().Faults
	if st.CorruptReads == 0 || st.CorruptBytes != 5 {
		t.Errorf("stats: %+v, want corrupt reads counted and 5 bytes", st)
	}
	f.Clear(KindCorruptRead)
	if got := readFile(t, filepath.Join(mnt, "seg")); got != content {
		t.Errorf("after clear the file still reads corrupt")
	}
}

// TestHandlesFromBeforeAPowerCutFail: a descriptor opened before the cut
// fails every operation; new opens see the rolled-back tree.
func TestHandlesFromBeforeAPowerCutFail(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "durable")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if _, err := unix.Pwrite(fd, []byte("unsynced"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	dead := func(what string, err error) {
		if !isErrno(err, syscall.EIO) && !isErrno(err, syscall.ENOTCONN) {
			t.Errorf("%s through a descriptor from before the cut: got %v, want EIO (or ENOTCONN)", what, err)
		}
	}
	_, err := unix.Pread(fd, make([]byte, 10), 0)
	dead("read", err)
	_, err = unix.Pwrite(fd, []byte("after"), 0)
	dead("write", err)
	dead("fsync", unix.Fsync(fd))
	if got := readFile(t, filepath.Join(mnt, "a")); got != "durable" {
		t.Errorf("a new open after the cut reads %q, want %q", got, "durable")
	}
}

func TestStateDirectoryIsHidden(t *testing.T) {
	_, backing, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "x")
	if err := os.Remove(filepath.Join(mnt, "a")); err != nil { // a grave now
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(backing, StateDirName, "graves")); err != nil {
		t.Fatalf("state directory in the backing directory: %v", err)
	}
	ents, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Errorf("the mount lists %v, want nothing", ents)
	}
	if _, err := os.Stat(filepath.Join(mnt, StateDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of the state directory through the mount: got %v, want not found", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, StateDirName), 0o755); !isErrno(err, syscall.EPERM) {
		t.Errorf("mkdir of the state directory's name: got %v, want EPERM", err)
	}
}

// TestMountInPlace mounts over the backing directory itself.
func TestMountInPlace(t *testing.T) {
	requireFUSE(t)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "before"), []byte("was here"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Mount(dir, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Unmount(); assertNotMounted(t, dir) })
	if got := readFile(t, filepath.Join(dir, "before")); got != "was here" {
		t.Fatalf("through the mount: %q", got)
	}
	durableFile(t, dir, "kept", "kept")
	if err := os.WriteFile(filepath.Join(dir, "lost"), []byte("lost"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.Unmount(); err != nil {
		t.Fatal(err)
	}
	got, _ := readTree(t, dir)
	want := map[string]mEntry{"before": {data: "was here"}, "kept": {data: "kept"}}
	if d := diffTrees(want, got); d != "" {
		t.Errorf("the directory after cut and unmount:\n%s", d)
	}
}

// TestUnmountWithOpenFile: a file still open makes the unmount lazy; the
// mount leaves the mount table either way.
func TestUnmountWithOpenFile(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "b"), filepath.Join(dir, "m")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Mount(backing, mnt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(mnt, "open"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		f.Unmount()
		t.Fatal(err)
	}
	if err := f.Unmount(); err != nil {
		t.Errorf("unmount with a file open: %v", err)
	}
	assertNotMounted(t, mnt)
	if _, err := unix.Pwrite(fd, []byte("x"), 0); err == nil {
		t.Errorf("write through a descriptor of an unmounted faultfs succeeded")
	}
	unix.Close(fd)
}

func TestOSyncWritesAreDurable(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "")
	fd, err := unix.Open(filepath.Join(mnt, "a"), unix.O_WRONLY|unix.O_DSYNC|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("dsync"), 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mnt, "a")); got != "dsync" {
		t.Errorf("an O_DSYNC write after a power cut: %q, want %q", got, "dsync")
	}
}

// TestFallocateIsRolledBack: preallocation (as the WAL does) is a size
// change like any other: lost unless synced.
func TestFallocateIsRolledBack(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "unsynced", "head")
	durableFile(t, mnt, "synced", "head")
	for _, name := range []string{"unsynced", "synced"} {
		fd := openRW(t, filepath.Join(mnt, name))
		if err := unix.Fallocate(fd, 0, 0, 1<<20); err != nil {
			t.Fatal(err)
		}
		if name == "synced" {
			if err := unix.Fdatasync(fd); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{"unsynced": 4, "synced": 1 << 20} {
		st, err := os.Stat(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != want {
			t.Errorf("%s: size %d after the cut, want %d", name, st.Size(), want)
		}
	}
}

// TestSyncfsMakesNothingDurable pins a documented limit: syncfs(2) never
// reaches a FUSE server, so only FS.Sync stands in for it.
func TestSyncfsMakesNothingDurable(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	fd, err := unix.Open(filepath.Join(mnt, "a"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if got := f.Stats().Unsynced; got.Files != 1 || got.Dirs != 1 {
		t.Errorf("after syncfs: unsynced %+v, want the file and its directory", got)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := f.Stats().Unsynced; got != (Unsynced{}) {
		t.Errorf("after FS.Sync: unsynced %+v, want nothing", got)
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mnt, "a")); got != "x" {
		t.Errorf("after FS.Sync and a cut: %q", got)
	}
}

// TestPowerCutReport checks the counters a cut reports.
func TestPowerCutReport(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "0123456789")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if _, err := unix.Pwrite(fd, bytes.Repeat([]byte("x"), 6), 2); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, 5); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "b"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	rep, err := f.PowerCut(PowerCutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// a: a 6-byte write and a truncate removing 5 bytes; d: one entry.
	if rep.Files != 1 || rep.ChangesUndone != 2 || rep.BytesDiscarded != 11 || rep.EntriesRolledBack != 1 {
		t.Errorf("report %+v, want 1 file, 2 changes, 11 bytes, 1 entry", rep)
	}
	if st := f.Stats(); st.PowerCuts != 1 || st.LastPowerCut == nil || *st.LastPowerCut != rep {
		t.Errorf("stats after the cut: %d cuts, last %+v; want 1 and %+v", st.PowerCuts, st.LastPowerCut, rep)
	}
}

// TestRootAttributes: the mount's root shows and changes the backing
// directory's attributes (not those of the descriptor faultfs reaches it
// through).
func TestRootAttributes(t *testing.T) {
	_, backing, mnt := mountForTest(t, Options{})
	if err := os.Chmod(mnt, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mnt, backing} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !st.IsDir() || st.Mode().Perm() != 0o750 {
			t.Errorf("%s: mode %s, want drwxr-x---", p, st.Mode())
		}
	}
}

// TestMountOverADeadMount: a faultfs whose process was killed leaves a
// dead FUSE mount; the next Mount on that mountpoint replaces it, and the
// backing directory holds everything the dead one was given.
func TestMountOverADeadMount(t *testing.T) {
	requireFUSE(t)
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "b"), filepath.Join(dir, "m")
	served := filepath.Join(dir, "served") // outside the mount
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestHelperServeUntilKilled$")
	child.Env = append(os.Environ(), "FAULTFS_HELPER_BACKING="+backing, "FAULTFS_HELPER_MOUNTPOINT="+mnt, "FAULTFS_HELPER_SERVED="+served)
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { child.Wait(); close(exited) }()
	t.Cleanup(func() {
		child.Process.Kill()
		killedChildExits(t, child.Process.Pid, mnt, exited)
		_ = unix.Unmount(mnt, unix.MNT_DETACH) // if the test failed before taking it over
	})
	// The helper says it serves through a file outside its mount, written
	// once its own write through the mount has closed: killed while its
	// close of that file waited for the FLUSH answer it serves itself, the
	// helper stayed in uninterruptible sleep (a FLUSH is a forced request)
	// and the test with it, until the go test timeout (seen under load).
	waitFor(t, "the helper to serve its mount", func() bool {
		_, err := os.Stat(served)
		return err == nil
	})
	if got := readFile(t, filepath.Join(mnt, "ready")); got != "ready" {
		t.Fatalf("through the helper's mount: %q", got)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killedChildExits(t, child.Process.Pid, mnt, exited)
	if _, err := os.Stat(mnt); !isErrno(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9 of the serving process, stat of the mountpoint: got %v, want ENOTCONN (a dead mount)", err)
	}
	f, err := Mount(backing, mnt, Options{})
	if err != nil {
		t.Fatalf("mount over the dead mount: %v", err)
	}
	defer func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
		assertNotMounted(t, mnt)
	}()
	if got := readFile(t, filepath.Join(mnt, "ready")); got != "ready" {
		t.Errorf("through the new mount: %q", got)
	}
	if _, err := os.Stat(filepath.Join(backing, StateDirName, "graves")); err != nil {
		t.Errorf("the new mount's state directory: %v", err)
	}
}

// killedChildExits waits for a child killed with SIGKILL to exit. A
// FUSE server killed while one of its own threads waits for a forced
// request (a FLUSH on close) to its own mount cannot exit: nobody is left
// to answer. After a minute (a deadlock detector, not a timing bound) the
// mount's connection is aborted through fusectl, which frees the child,
// and the test fails naming the cause instead of hanging to the timeout.
func killedChildExits(t *testing.T, pid int, mnt string, exited <-chan struct{}) {
	t.Helper()
	select {
	case <-exited:
		return
	case <-time.After(time.Minute):
	}
	var state string
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid)); err == nil {
		state = string(b)
	}
	ms, _ := mountInfos(mnt)
	for _, m := range ms {
		if m.Mountpoint == mnt {
			if err := abortConn(m.Conn); err != nil {
				t.Errorf("abort the dead mount's FUSE connection %d: %v", m.Conn, err)
			}
		}
	}
	<-exited
	t.Fatalf("the killed FUSE server (pid %d) did not exit for a minute, blocked in %q: it was waiting on a request to its own mount; its connection had to be aborted", pid, state)
}

// TestHelperServeUntilKilled is TestMountOverADeadMount's child process.
func TestHelperServeUntilKilled(t *testing.T) {
	backing, mnt := os.Getenv("FAULTFS_HELPER_BACKING"), os.Getenv("FAULTFS_HELPER_MOUNTPOINT")
	if backing == "" {
		t.Skip("helper process for TestMountOverADeadMount")
	}
	if _, err := Mount(backing, mnt, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "ready"), []byte("ready"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only now, with no request of its own to its mount in flight.
	if err := os.WriteFile(os.Getenv("FAULTFS_HELPER_SERVED"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {} // until kill -9
}
