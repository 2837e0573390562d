package replica_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// BenchmarkPropose times quorum writes through the whole Ready loop of three
// replicas (real WAL, real fdatasync) over the in-process transport, so the
// network costs nothing and what is left is raft, the WAL's group commit
// and apply. Proposals go to the leader; "clients" is the number of
// concurrent proposers; "pack" is Config.PackProposals. Reports writes/s,
// latency percentiles and the process's CPU per write (all three replicas
// run in this process).
func BenchmarkPropose(b *testing.B) {
	for _, pack := range []bool{false, true} {
		for _, clients := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("pack=%v/clients=%d", pack, clients), func(b *testing.B) {
				benchPropose(b, pack, clients)
			})
		}
	}
}

// BenchmarkProposeViaFollower is BenchmarkPropose with the proposals made
// on a follower, which forwards them to the leader: the path the forward
// loop (forward.go) takes.
func BenchmarkProposeViaFollower(b *testing.B) {
	for _, pack := range []bool{false, true} {
		b.Run(fmt.Sprintf("pack=%v/clients=64", pack), func(b *testing.B) {
			benchProposeOn(b, pack, 64, true)
		})
	}
}

func benchPropose(b *testing.B, pack bool, clients int) { benchProposeOn(b, pack, clients, false) }

func benchProposeOn(b *testing.B, pack bool, clients int, follower bool) {
	c := newCluster(b, 3, func(cfg *replica.Config) { cfg.PackProposals = pack })
	lead := c.waitLeader()
	on := lead
	if follower {
		on = lead%3 + 1
	}
	r := c.node(on).r
	payload := make([]byte, 100)
	var (
		mu   sync.Mutex
		lats []time.Duration
		next atomic.Int64
	)
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
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
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(len(lats)), "cpu-us/write")
}

// processCPU is this process's user + system CPU time: steadier than
// wall-clock rates on a shared machine.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
