//go:build !amd64

package vectors

func dotBlocks(a, b []float32, acc *[32]float32) { dotBlocksGeneric(a, b, acc) }

func sumBlocks(a []float32, acc *[32]float32) { sumBlocksGeneric(a, acc) }

const haveAVX2 = false
