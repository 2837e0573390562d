package wal

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkSave measures durable appends of ~100-byte entries from 1, 16
// and 256 concurrent appenders with real fdatasync. Each appender allocates
// its index and stages under one shared lock, then waits outside it, the
// way the raft glue or the API would. b.N is the total number of appends.
//
// Reported: appends/s, and appends/fsync — the group-commit factor, which
// must grow with the number of appenders because everyone who queued while
// one fdatasync ran shares the next.
func BenchmarkSave(b *testing.B) {
	for _, appenders := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			w, _, err := Open(b.TempDir(), Options{Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 100)
			var mu sync.Mutex
			next := uint64(1)
			remaining := b.N
			b.SetBytes(int64(entrySize(Entry{Data: data})))
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
						idx := next
						p, err := w.Stage(Batch{Entries: []Entry{{Index: idx, Term: 1, Data: data}}}, true)
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
	}
}

// BenchmarkSaveGroups measures durable Saves of one ~100-byte entry each
// from 1, 16 and 256 raft groups sharing one log, each group saving from
// its own goroutine with its own index sequence (no lock between them),
// with real fdatasync. b.N is the total number of Saves.
//
// Reported: saves/s, and fsyncs/save — below 1 when the groups' Saves
// share fdatasyncs, which is the point of one WAL per node.
func BenchmarkSaveGroups(b *testing.B) {
	for _, groups := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			w, _, err := Open(b.TempDir(), Options{Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 100)
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := range groups {
				n := b.N / groups
				if g < b.N%groups {
					n++
				}
				log := w.Group(uint64(g + 1))
				wg.Go(func() {
					for i := range n {
						if err := log.Save(context.Background(), Batch{Entries: []Entry{{Index: uint64(i + 1), Term: 1, Data: data}}}, true); err != nil {
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
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "saves/s")
			b.ReportMetric(float64(st.Fsyncs)/float64(max(st.Batches, 1)), "fsyncs/save")
		})
	}
}
