package ledger

import "math"

// exp2 returns 2**x and gives the same bits on every GOARCH.
//
// math.Exp2 does not: arm64 and loong64 use an assembly implementation,
// other architectures a Go one the compiler may fuse into FMA
// instructions. A cluster mixing architectures would then fold decayed
// sums that differ in the last bit and report different digests. This is
// the portable algorithm of math.exp2 (from FreeBSD's e_exp.c via the Go
// standard library, BSD licence) with every product wrapped in an explicit
// float64 conversion, which the Go spec says forbids fusion.
func exp2(x float64) float64 {
	const (
		ln2Hi     = 6.93147180369123816490e-01
		ln2Lo     = 1.90821492927058770002e-10
		overflow  = 1.0239999999999999e+03
		underflow = -1.0740e+03

		p1 = 1.66666666666666657415e-01
		p2 = -2.77777777770155933842e-03
		p3 = 6.61375632143793436117e-05
		p4 = -1.65339022054652515390e-06
		p5 = 4.13813679705723846039e-08
	)
	switch {
	case x != x:
		return x
	case x > overflow:
		return math.Inf(1)
	case x < underflow:
		return 0
	}
	// Argument reduction: x = k + t with |t| <= 1/2, then 2**t = e**(t·ln2)
	// with t·ln2 split into hi - lo for extra precision.
	var k int
	switch {
	case x > 0:
		k = int(x + 0.5)
	case x < 0:
		k = int(x - 0.5)
	}
	t := x - float64(k)
	hi := float64(t * ln2Hi)
	lo := float64(-t * ln2Lo)
	r := hi - lo
	rr := float64(r * r)
	c := r - float64(rr*(p1+float64(rr*(p2+float64(rr*(p3+float64(rr*(p4+float64(rr*p5)))))))))
	y := 1 - ((lo - float64(r*c)/(2-c)) - hi)
	return math.Ldexp(y, k)
}

// foldDecayed adds weight w at time ts to a decayed sum anchored at the
// newest timestamp folded so far. Keeping the anchor at the maximum means
// every stored term is w·2^-(anchor-ts)/h <= w: the stored sum can neither
// overflow nor depend on the order timestamps arrive in (beyond float
// rounding, which log order fixes identically on every node).
func foldDecayed(sum float64, anchor, ts int64, w, halfLifeMs float64) (float64, int64) {
	if ts > anchor {
		return float64(sum*exp2(-float64(ts-anchor)/halfLifeMs)) + w, ts
	}
	return sum + float64(w*exp2(-float64(anchor-ts)/halfLifeMs)), anchor
}

// decayedAt evaluates a sum anchored at anchor at time at: sum·2^-(at-anchor)/h.
// at may precede anchor (the score then grows); the result saturates at
// MaxFloat64 rather than +Inf, which JSON cannot carry. The mantissa and
// exponent are scaled separately so that a tiny sum read far before its
// anchor does not overflow spuriously.
func decayedAt(sum float64, anchor, at int64, halfLifeMs float64) float64 {
	if sum == 0 {
		return 0
	}
	x := -(float64(at) - float64(anchor)) / halfLifeMs
	whole := math.Floor(x)
	switch {
	case whole > 4096:
		return math.MaxFloat64
	case whole < -4096:
		return 0
	}
	frac, e := math.Frexp(sum)
	v := math.Ldexp(float64(frac*exp2(x-whole)), e+int(whole))
	if math.IsInf(v, 1) {
		return math.MaxFloat64
	}
	return v
}
