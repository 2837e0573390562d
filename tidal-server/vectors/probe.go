package vectors

// ReadProbe sums buf with the loads an exact scan uses (on amd64 with
// AVX2, four 32-byte loads per step) and nothing else, so timing it over
// a buffer far larger than the caches gives one core's memory-read rate
// as the scan can get it: the bound tidal-bench -embeddings reports query
// latency against. A plain Go loop reads 8 bytes per
// instruction and measured below the scan itself.
func ReadProbe(buf []float32) float32 {
	var acc [32]float32
	n := len(buf) &^ 31
	if n > 0 {
		sumBlocks(buf[:n], &acc)
	}
	var s float32
	for _, x := range acc {
		s += x
	}
	for _, x := range buf[n:] {
		s += x
	}
	return s
}

// sumBlocksGeneric sets acc[j] to the sum of a[i] over i ≡ j (mod 32).
func sumBlocksGeneric(a []float32, acc *[32]float32) {
	*acc = [32]float32{}
	for i := 0; i+32 <= len(a); i += 32 {
		x := a[i : i+32 : i+32]
		for j := range 32 {
			acc[j] += x[j]
		}
	}
}
