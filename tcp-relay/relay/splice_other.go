//go:build !linux

package relay

type kernelPipe struct{}

func (*kernelPipe) close() {}

// splice is Linux-only; elsewhere the fault-aware loop copies.
func (p *pump) splice() bool {
	p.noSplice = true
	return true
}
