package vectors

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkQueryViewDigest hashes 20,000 1536-wide vectors through a
// pinned view: the work a GET /v1/audit/digest does outside the lock.
func BenchmarkQueryViewDigest(b *testing.B) {
	s := New(1536)
	r := rand.New(rand.NewPCG(1, 2))
	vec := make([]float32, 1536)
	for e := range uint64(20000) {
		for i := range vec {
			vec[i] = r.Float32() + 0.1
		}
		if err := s.Put(e, vec); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(20000 * (8 + 4*1536))
	b.ResetTimer()
	for range b.N {
		v := s.PinQuery()
		_ = v.Digest()
		v.Release()
	}
}
