package vectors

// dot returns the dot product of a and b, which must have equal lengths.
//
// The summation order is fixed, so the result is reproducible: 32
// partial sums, sum j taking the products of components i ≡ j (mod 32) in
// order of i, each product rounded to float32 and then added (no fused
// multiply-add), and then a fixed pairwise tree over the 32 sums. On amd64
// with AVX2 the 32 sums are four 8-lane registers (dot_amd64.s: an exact
// scan of 100,000 × 1536 vectors was 7× the memory-read bound with the
// scalar loop); elsewhere dotBlocks computes the same sums in
// the same order, so a query's scores do not depend on which of the two
// ran.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var acc [32]float32
	n := len(a) &^ 31
	if n > 0 {
		dotBlocks(a[:n], b[:n], &acc)
	}
	for i := n; i < len(a); i++ {
		acc[i&31] += a[i] * b[i]
	}
	for w := 16; w > 0; w /= 2 {
		for j := range w {
			acc[j] += acc[j+w]
		}
	}
	return acc[0]
}

// dotBlocksGeneric sets acc[j] to the sum of a[i]·b[i] over i ≡ j (mod
// 32), in order of i; len(a) = len(b) is a multiple of 32.
func dotBlocksGeneric(a, b []float32, acc *[32]float32) {
	*acc = [32]float32{}
	for i := 0; i+32 <= len(a); i += 32 {
		x := a[i : i+32 : i+32]
		y := b[i : i+32 : i+32]
		for j := range 32 {
			acc[j] += x[j] * y[j]
		}
	}
}
