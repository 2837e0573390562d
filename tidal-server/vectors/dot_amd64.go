package vectors

import "golang.org/x/sys/cpu"

var haveAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasAVX

// dotBlocksAVX2 is dotBlocksGeneric in four 8-lane registers
// (VMULPS then VADDPS: the same roundings). n is a multiple of 32.
//
//go:noescape
func dotBlocksAVX2(a, b *float32, n int, acc *[32]float32)

func dotBlocks(a, b []float32, acc *[32]float32) {
	if haveAVX2 {
		dotBlocksAVX2(&a[0], &b[0], len(a), acc)
		return
	}
	dotBlocksGeneric(a, b, acc)
}

//go:noescape
func sumBlocksAVX2(a *float32, n int, acc *[32]float32)

func sumBlocks(a []float32, acc *[32]float32) {
	if haveAVX2 {
		sumBlocksAVX2(&a[0], len(a), acc)
		return
	}
	sumBlocksGeneric(a, acc)
}
