package ledger

import (
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// benchEvents returns n events over 100,000 entities with mostly
// increasing timestamps and some jitter, as a node would log them.
func benchEvents(n int) []Event {
	rng := rand.New(rand.NewPCG(1, 1))
	signals := []string{"view", "view", "view", "like", "share", "skip"}
	events := make([]Event, n)
	for i := range events {
		events[i] = Event{
			ID:     fmt.Sprintf("bench-%d", i),
			Entity: uint64(rng.IntN(100000)),
			Signal: signals[rng.IntN(len(signals))],
			Weight: 1,
			TS:     t0 + int64(i)*10 - rng.Int64N(60000),
		}
	}
	return events
}

// BenchmarkApply measures folding cost per event with a realistic id
// memory (the default generation size), for single-event entries and
// 100-event entries.
func BenchmarkApply(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			events := benchEvents(1 << 20)
			l := New(DefaultSchema(), Options{})
			b.ReportAllocs()
			b.ResetTimer()
			index, next := uint64(0), 0
			for i := 0; i < b.N; i += batch {
				if next+batch > len(events) {
					// Fresh ids: reusing them would measure the
					// duplicate path instead.
					b.StopTimer()
					for j := range events {
						events[j].ID = fmt.Sprintf("bench-%d-%d", index, j)
					}
					next = 0
					b.StartTimer()
				}
				index++
				if _, err := l.Apply(index, 1, events[next:next+batch]); err != nil {
					b.Fatal(err)
				}
				next += batch
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/event")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func loadedLedger(b *testing.B, n int) (*Ledger, int64) {
	b.Helper()
	l := New(DefaultSchema(), Options{})
	events := benchEvents(n)
	var maxTS int64
	for i := 0; i < n; i += 1000 {
		if _, err := l.Apply(uint64(i/1000+1), 1, events[i:min(i+1000, n)]); err != nil {
			b.Fatal(err)
		}
	}
	for _, e := range events {
		maxTS = max(maxTS, e.TS)
	}
	return l, maxTS
}

// BenchmarkTop ranks ~100,000 entities exhaustively.
func BenchmarkTop(b *testing.B) {
	l, at := loadedLedger(b, 500000)
	for _, window := range []string{"", "1h", "all"} {
		b.Run("window="+window, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Top("view", window, 100, at+int64(time.Minute/time.Millisecond)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(l.Stats().Entities), "entities")
		})
	}
}

// BenchmarkSnapshot encodes a ledger with 500,000 events (and as many
// remembered ids); bytes/op is the snapshot size.
func BenchmarkSnapshot(b *testing.B) {
	l, _ := loadedLedger(b, 500000)
	var size countingWriter
	if err := l.Snapshot(&size); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Snapshot(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size), "snapshot-bytes")
}

// BenchmarkCapture is the part of BenchmarkSnapshot's ledger that a
// periodic snapshot now costs the apply path: the capture,
// without the encoding.
func BenchmarkCapture(b *testing.B) {
	l, _ := loadedLedger(b, 500000)
	b.ReportAllocs()
	for b.Loop() {
		if c := l.Capture(); c.AppliedIndex() == 0 {
			b.Fatal("empty capture")
		}
	}
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

// BenchmarkIDMemory inserts a generation's worth of ids and looks each up
// again (the id memory alone, without folding): the cost per id of the
// open-addressing index and the chunk arenas.
func BenchmarkIDMemory(b *testing.B) {
	const n = 1 << 18
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("client-7-req-%d", i)
	}
	b.Run("add", func(b *testing.B) {
		b.ReportAllocs()
		g := newGeneration(n)
		for i := 0; b.Loop(); i++ {
			if i == n {
				g, i = newGeneration(n), 0
			}
			g.add(ids[i], idRecord{index: uint64(i)})
		}
	})
	b.Run("get", func(b *testing.B) {
		g := newGeneration(n)
		for i, id := range ids {
			g.add(id, idRecord{index: uint64(i)})
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, ok := g.get(ids[i%n]); !ok {
				b.Fatal("missing id")
			}
		}
	})
}

// BenchmarkApplySteady is BenchmarkApply on a ledger that already holds
// every entity of the workload and a full id generation, so what it
// measures is the steady state of a long-running node (folding into
// existing cells, id memory at its working size) rather than the first
// event of each entity.
func BenchmarkApplySteady(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			const n = 1 << 20
			events := benchEvents(n)
			l := New(DefaultSchema(), Options{})
			index := uint64(0)
			for i := 0; i < n; i += 1000 {
				index++
				if _, err := l.Apply(index, 1, events[i:min(i+1000, n)]); err != nil {
					b.Fatal(err)
				}
			}
			round := 0
			renew := func() {
				round++
				for j := range events {
					events[j].ID = fmt.Sprintf("steady-%d-%d", round, j)
				}
			}
			renew()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			next := 0
			for i := 0; i < b.N; i += batch {
				if next+batch > n {
					b.StopTimer()
					renew()
					next = 0
					b.StartTimer()
				}
				index++
				if _, err := l.Apply(index, 1, events[next:next+batch]); err != nil {
					b.Fatal(err)
				}
				next += batch
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/event")
			reportCPU(b, cpu0, b.N, "event")
		})
	}
}
