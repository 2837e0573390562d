package vectors

import (
	"math/rand/v2"
	"testing"
)

var sinkF32 float32

func BenchmarkDot1536(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	x, y := randVec(r, 1536), randVec(r, 1536)
	b.SetBytes(2 * 4 * 1536)
	for b.Loop() {
		sinkF32 += dot(x, y)
	}
	// One multiply and one add per component.
	b.ReportMetric(2*1536*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkNearest(b *testing.B) {
	const n, dim, k = 10_000, 1536, 10
	r := rand.New(rand.NewPCG(2, 2))
	s := New(dim)
	for e := range uint64(n) {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			b.Fatal(err)
		}
	}
	q := randVec(r, dim)
	b.SetBytes(n * dim * 4)
	for b.Loop() {
		if _, err := s.Nearest(q, k); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "vectors/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "queries/s")
}

// BenchmarkPut times a replacement (validation plus an in-place copy) and
// a new entity (which also grows the arena; on hosts where first-touch page
// faults are expensive that growth dominates).
func BenchmarkPut(b *testing.B) {
	const dim = 1536
	r := rand.New(rand.NewPCG(3, 3))
	vecs := make([][]float32, 64)
	for i := range vecs {
		vecs[i] = randVec(r, dim)
	}
	b.Run("replace", func(b *testing.B) {
		s := New(dim)
		b.SetBytes(dim * 4)
		i := 0
		for b.Loop() {
			if err := s.Put(uint64(i%16), vecs[i%len(vecs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("new", func(b *testing.B) {
		s := New(dim)
		b.SetBytes(dim * 4)
		i := 0
		for b.Loop() {
			if err := s.Put(uint64(i), vecs[i%len(vecs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkScanBandwidth reads as many bytes as one BenchmarkNearest query
// scans (10,000 × 1536 float32s, far beyond the caches) with about the
// cheapest loop that touches them all (integer adds over 8-byte words, four
// independent sums): the memory-read bound an exact scan is held against
// (compare its MB/s with BenchmarkNearest's, run alternately).
func BenchmarkScanBandwidth(b *testing.B) {
	const n, dim = 10_000, 1536
	buf := make([]uint64, n*dim/2)
	for i := range buf {
		buf[i] = uint64(i)
	}
	b.SetBytes(n * dim * 4)
	for b.Loop() {
		var s0, s1, s2, s3 uint64
		for i := 0; i+4 <= len(buf); i += 4 {
			s0 += buf[i]
			s1 += buf[i+1]
			s2 += buf[i+2]
			s3 += buf[i+3]
		}
		sinkU64 += s0 + s1 + s2 + s3
	}
}

var sinkU64 uint64

// BenchmarkPutDuringScan times an overwrite while other goroutines run
// nearest scans back to back: with a scan holding the lock throughout, a
// Put waited for the rest of a scan; with QueryView it waits for at most
// one chunk (and saves the old vector when a view is pinned).
func BenchmarkPutDuringScan(b *testing.B) {
	const n, dim = 4_000, 1536
	r := rand.New(rand.NewPCG(4, 4))
	s := New(dim)
	for e := range uint64(n) {
		if err := s.Put(e, randVec(r, dim)); err != nil {
			b.Fatal(err)
		}
	}
	q, vec := randVec(r, dim), randVec(r, dim)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Nearest(q, 10); err != nil {
				panic(err)
			}
		}
	}()
	i := 0
	for b.Loop() {
		if err := s.Put(uint64(i%n), vec); err != nil {
			b.Fatal(err)
		}
		i++
	}
	close(stop)
	<-done
}
