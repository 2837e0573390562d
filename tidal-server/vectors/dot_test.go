package vectors

import (
	"math"
	"math/rand/v2"
	"testing"
)

// dotReference is dot's contract written out plainly: 32 partial sums by
// component index mod 32, then the fixed pairwise tree.
func dotReference(a, b []float32) float32 {
	var acc [32]float32
	for i := range a {
		acc[i%32] += a[i] * b[i]
	}
	for w := 16; w > 0; w /= 2 {
		for j := range w {
			acc[j] += acc[j+w]
		}
	}
	return acc[0]
}

// The vectorised dot product returns bit for bit
// what the plain summation order gives, at every length, with and without
// AVX2, so a query's scores do not depend on the CPU's features.
func TestDotBitIdenticalToItsSummationOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	lengths := []int{0, 1, 7, 31, 32, 33, 63, 64, 65, 100, 255, 256, 1000, 1536, 1537, 4096}
	for _, n := range lengths {
		for range 20 {
			a, b := randVec(r, n), randVec(r, n)
			for i := range a { // magnitudes far apart, so order matters
				a[i] *= float32(math.Pow(2, float64(r.IntN(40)-20)))
			}
			want := dotReference(a, b)
			if got := dot(a, b); math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("n=%d: dot %v (%08x), reference %v (%08x)", n, got, math.Float32bits(got), want, math.Float32bits(want))
			}
			if n >= 32 {
				m := n &^ 31
				var x, y [32]float32
				dotBlocks(a[:m], b[:m], &x)
				dotBlocksGeneric(a[:m], b[:m], &y)
				if x != y {
					t.Fatalf("n=%d: dotBlocks %v, generic %v (AVX2 %v)", n, x, y, haveAVX2)
				}
			}
		}
	}
}

// ReadProbe sums what it reads, with or without AVX2.
func TestReadProbeSums(t *testing.T) {
	for _, n := range []int{0, 5, 32, 100, 4096} {
		buf := make([]float32, n)
		for i := range buf {
			buf[i] = float32(i % 7)
		}
		var want float32
		for _, x := range buf {
			want += x
		}
		var acc, gen [32]float32
		if m := n &^ 31; m > 0 {
			sumBlocks(buf[:m], &acc)
			sumBlocksGeneric(buf[:m], &gen)
		}
		if got := ReadProbe(buf); got != want || acc != gen {
			t.Fatalf("n=%d: ReadProbe %v, want %v (blocks %v, generic %v)", n, got, want, acc, gen)
		}
	}
}
