package replica_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPropose times quorum writes through the whole Ready loop of three
// replicas (real WAL, real fdatasync) over the in-process transport, so the
// network costs nothing and what is left is raft, the WAL's group commit
// and apply. Proposals go to the leader; "clients" is the number of
// concurrent proposers. Reports writes/s and latency percentiles.
func BenchmarkPropose(b *testing.B) {
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			c := newCluster(b, 3, nil)
			lead := c.waitLeader()
			r := c.node(lead).r
			payload := make([]byte, 100)
			var (
				mu   sync.Mutex
				lats []time.Duration
				next atomic.Int64
			)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < clients; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					local := make([]time.Duration, 0, b.N/clients+1)
					for next.Add(1) <= int64(b.N) {
						t0 := time.Now()
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						_, err := r.Propose(ctx, payload)
						cancel()
						if err != nil {
							b.Errorf("propose: %v", err)
							return
						}
						local = append(local, time.Since(t0))
					}
					mu.Lock()
					lats = append(lats, local...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if len(lats) == 0 {
				return
			}
			sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
			pct := func(p float64) float64 {
				return float64(lats[int(p*float64(len(lats)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "writes/s")
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
		})
	}
}
