package faultfs

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSlowDiskStallReleasesEveryFsyncAtOnce: fsyncs stalled on several
// files stay blocked while the fault is armed, and one Clear releases all
// of them, each succeeding and making its file durable.
// Regression (slow-disk "a stall per operation kind"):
// healing a stall must release every blocked operation at once.
func TestSlowDiskStallReleasesEveryFsyncAtOnce(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	names := []string{"a", "b", "c"}
	fds := make([]int, len(names))
	for i, n := range names {
		durableFile(t, mnt, n, "durable")
		fds[i] = openRW(t, filepath.Join(mnt, n))
		if _, err := unix.Pwrite(fds[i], []byte("synced!"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Set(Faults{SlowDisk: []SlowDisk{{Ops: []Op{OpFsync}, Stall: true}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, len(fds))
	for _, fd := range fds {
		go func() { done <- unix.Fsync(fd) }()
	}
	waitFor(t, "every fsync to stall", func() bool { return f.Stats().Faults.Stalled == uint64(len(fds)) })
	select {
	case err := <-done:
		t.Fatalf("a stalled fsync returned (%v) before the fault was cleared", err)
	default:
	}
	// Other operation classes pass while fsync is held.
	if got := pread(t, fds[0], 100); got != "synced!" {
		t.Errorf("a read during an fsync stall: %q", got)
	}
	f.Clear(KindSlowDisk)
	for range fds {
		if err := <-done; err != nil {
			t.Errorf("a stalled fsync, released: %v", err)
		}
	}
	if _, err := f.PowerCut(PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if got := readFile(t, filepath.Join(mnt, n)); got != "synced!" {
			t.Errorf("%s after a cut following the released fsync: %q, want the synced write", n, got)
		}
	}
}

// TestSlowDiskStallBound: a stall with MaxStall releases its operation
// after the bound with the fault still armed; the next one stalls again.
// Regression: "block until the fault is cleared, or for
// a bound".
func TestSlowDiskStallBound(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "a", "x")
	fd := openRW(t, filepath.Join(mnt, "a"))
	if err := f.Set(Faults{SlowDisk: []SlowDisk{{Ops: []Op{OpWrite}, Stall: true, MaxStall: 20 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		if _, err := unix.Pwrite(fd, []byte("held"), 0); err != nil {
			t.Fatalf("write %d after a bounded stall: %v", i, err)
		}
		if got := f.Stats().Faults.Stalled; got != uint64(i) {
			t.Errorf("stalled after write %d: %d", i, got)
		}
	}
	if len(f.Faults().SlowDisk) != 1 {
		t.Errorf("the bound released the operation but must leave the fault armed: %+v", f.Faults())
	}
	// An unbounded stall on the same class outweighs the bounded one.
	if err := f.Set(Faults{SlowDisk: []SlowDisk{
		{Ops: []Op{OpWrite}, Stall: true, MaxStall: time.Millisecond},
		{Ops: []Op{OpWrite}, Stall: true},
	}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := unix.Pwrite(fd, []byte("late"), 0)
		done <- err
	}()
	waitFor(t, "the write to stall", func() bool { return f.Stats().Faults.Stalled == 3 })
	select {
	case err := <-done:
		t.Fatalf("a write under an unbounded stall returned (%v) before the clear", err)
	default:
	}
	f.Clear(KindSlowDisk)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestSlowDiskMaxStallNeedsStall(t *testing.T) {
	err := Faults{SlowDisk: []SlowDisk{{Latency: time.Millisecond, MaxStall: time.Second}}}.Validate()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "slow_disk[0].max_stall_ms" {
		t.Errorf("max stall without a stall: got %v, want a field error on max_stall_ms", err)
	}
	b, err := json.Marshal(SlowDisk{Ops: []Op{OpFsync}, Stall: true, MaxStall: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"ops":["fsync"],"stall":true,"max_stall_ms":1500}` {
		t.Errorf("SlowDisk JSON: %s", b)
	}
	var s SlowDisk
	if err := json.Unmarshal(b, &s); err != nil || s.MaxStall != 1500*time.Millisecond {
		t.Errorf("decoded %+v, %v", s, err)
	}
}

// TestDiskFullCountOverwrites: with CountOverwrites, writes into space
// the file already holds (a preallocated WAL segment) use up the quota
// too, so the fault bites a program that only appends into preallocated
// space. Regression ("ENOSPC past a quota"): the nemesis'
// disk-full with zero free bytes never bit a node whose WAL appended into
// its preallocated segment for the whole fault window.
func TestDiskFullCountOverwrites(t *testing.T) {
	f, _, mnt := mountForTest(t, Options{})
	durableFile(t, mnt, "seg", "")
	fd := openRW(t, filepath.Join(mnt, "seg"))
	if err := unix.Fallocate(fd, 0, 0, 1<<16); err != nil { // preallocated, as a WAL segment
		t.Fatal(err)
	}
	if err := f.Set(Faults{DiskFull: &DiskFull{FreeBytes: 10, CountOverwrites: true}}); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Pwrite(fd, []byte("12345678"), 0); n != 8 || err != nil {
		t.Fatalf("append into preallocated space that fits: %d, %v", n, err)
	}
	if n, err := unix.Pwrite(fd, []byte("abcdefgh"), 8); n != 2 || err != nil {
		t.Fatalf("append past the quota inside preallocated space: %d bytes, %v; want a short write of 2", n, err)
	}
	if _, err := unix.Pwrite(fd, []byte("z"), 10); !isErrno(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk inside preallocated space: %v, want ENOSPC", err)
	}
	if _, err := unix.Pwrite(fd, []byte("OVER"), 0); !isErrno(err, syscall.ENOSPC) {
		t.Errorf("overwrite on a full disk counting overwrites: %v, want ENOSPC", err)
	}
	if got := f.Faults().DiskFull; got == nil || got.FreeBytes != 0 || !got.CountOverwrites {
		t.Errorf("armed faults: %+v, want 0 free, counting overwrites", got)
	}
	if got := f.Stats().Faults.ENOSPC; got != 3 {
		t.Errorf("ENOSPC counted %d times, want 3 (short write, append, overwrite)", got)
	}
	f.Clear(KindDiskFull)
	if n, err := unix.Pwrite(fd, []byte(strings.Repeat("y", 100)), 10); n != 100 || err != nil {
		t.Errorf("append after the clear: %d, %v", n, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("room"), 0o644); err != nil {
		t.Errorf("create after the clear: %v", err)
	}
}
