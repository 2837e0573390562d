package workload

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// BenchmarkGenerate times drawing one op of each workload: the generator
// must stay far cheaper than a round trip to a node.
func BenchmarkGenerate(b *testing.B) {
	for _, k := range Kinds {
		b.Run(string(k), func(b *testing.B) {
			cfg, err := Config{Kind: k}.WithDefaults()
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			id := ids{proc: 1}
			g := newGenerator(&cfg)
			b.ReportAllocs()
			for b.Loop() {
				g.generate(k, rng, &id, 0)
			}
		})
	}
}

// BenchmarkPerform times the client side of one ledger write — generate,
// record the invoke, send over a real loopback socket to a server that
// acks at once, record the ok — from parallel workers, and reports the
// ops/s the harness itself sustains (the ceiling of any closed-loop run).
func BenchmarkPerform(b *testing.B) {
	fake := newFake(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		ack(w, 1)
	})
	rec, err := history.Create(filepath.Join(b.TempDir(), "history.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	w, err := New(Config{Kind: Ledger, MaxBatch: 4}, fake, rec)
	if err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(4) // 8 workers on 2 cores: more clients than CPUs, as in a run
	var seed atomic.Uint64
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		wk := &worker{w: w, rng: rand.New(rand.NewPCG(1, seed.Add(1)))}
		wk.retire()
		for pb.Next() {
			wk.step(context.Background())
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
	if err := rec.Close(); err != nil {
		b.Fatal(err)
	}
	if p := w.Progress().Total(); p.OK != int64(b.N) {
		b.Fatalf("expected %d ok ops, found %+v", b.N, p)
	}
}
