package faultfs

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// benchTargets runs bench against the backing directory directly and
// through faultfs (with and without passing syncs to the backing disk),
// side by side. See README.md for figures.
func benchTargets(b *testing.B, bench func(b *testing.B, dir string)) {
	b.Run("target=direct", func(b *testing.B) { bench(b, b.TempDir()) })
	b.Run("target=faultfs", func(b *testing.B) {
		_, _, mnt := mountForTest(b, Options{})
		bench(b, mnt)
	})
	b.Run("target=faultfs-skip-backing-sync", func(b *testing.B) {
		_, _, mnt := mountForTest(b, Options{SkipBackingSync: true})
		bench(b, mnt)
	})
}

func benchFile(b *testing.B, dir string, prealloc int64) int {
	b.Helper()
	fd, err := unix.Open(filepath.Join(dir, "bench"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	if prealloc > 0 {
		if err := unix.Fallocate(fd, 0, 0, prealloc); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fsync(fd); err != nil {
			b.Fatal(err)
		}
	}
	return fd
}

// BenchmarkFsync: fsync latency (ns/op) of a file with one 4 KiB page
// rewritten since the last sync.
func BenchmarkFsync(b *testing.B) {
	benchTargets(b, func(b *testing.B, dir string) {
		fd := benchFile(b, dir, 0)
		page := make([]byte, 4096)
		for b.Loop() {
			if _, err := unix.Pwrite(fd, page, 0); err != nil {
				b.Fatal(err)
			}
			if err := unix.Fsync(fd); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAppendFdatasync: 4 KiB appends, each followed by fdatasync,
// into a growing file ("grow") and into preallocated space as the WAL
// writes ("prealloc"); reports appends/s.
func BenchmarkAppendFdatasync(b *testing.B) {
	for _, mode := range []struct {
		name     string
		prealloc int64
	}{{"grow", 0}, {"prealloc", 256 << 20}} {
		b.Run("file="+mode.name, func(b *testing.B) {
			benchTargets(b, func(b *testing.B, dir string) {
				fd := benchFile(b, dir, mode.prealloc)
				page := make([]byte, 4096)
				off := int64(0)
				b.SetBytes(int64(len(page)))
				for b.Loop() {
					if _, err := unix.Pwrite(fd, page, off); err != nil {
						b.Fatal(err)
					}
					if err := unix.Fdatasync(fd); err != nil {
						b.Fatal(err)
					}
					off += int64(len(page))
					if mode.prealloc > 0 && off+int64(len(page)) > mode.prealloc {
						off = 0
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
			})
		})
	}
}
