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
