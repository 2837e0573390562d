package faultfs

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/wal"
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

// BenchmarkWALSave: tidal's own WAL (~100-byte entries, real fdatasync,
// group commit) from 1 and 16 concurrent appenders, directly on the
// backing disk and through faultfs, side by side: what the mount costs
// the load a chaos run can reach.
// Reports appends/s and appends per fsync (the group-commit factor,
// which must not fall through the mount).
func BenchmarkWALSave(b *testing.B) {
	for _, appenders := range []int{1, 16} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			benchTargets(b, func(b *testing.B, dir string) {
				w, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{SegmentSize: 64 << 20, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					b.Fatal(err)
				}
				data := make([]byte, 100)
				var mu sync.Mutex
				next, remaining := uint64(1), b.N
				b.ResetTimer()
				var wg sync.WaitGroup
				for range appenders {
					wg.Go(func() {
						for {
							mu.Lock()
							if remaining == 0 {
								mu.Unlock()
								return
							}
							remaining--
							p, err := w.Stage(wal.Batch{Entries: []wal.Entry{{Index: next, Term: 1, Data: data}}}, true)
							next++
							mu.Unlock()
							if err == nil {
								err = p.Wait(context.Background())
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				st := w.Stats()
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
				b.ReportMetric(float64(st.Batches)/float64(max(st.Fsyncs, 1)), "appends/fsync")
			})
		})
	}
}
