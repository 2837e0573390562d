package workload

import (
	"context"
	"sync"
)

// Gate holds the workload's clients before their next op while it is
// closed; ops already in flight go on. The nemesis closes it for a
// moment before a power cut (nemesis.Quieter), so the newest writes are
// acknowledged and synced when the cut lands rather than in flight. The
// zero Gate is open.
type Gate struct {
	mu     sync.Mutex
	closed chan struct{} // non-nil while closed; closed by Open
}

// Close holds every client at its next op until Open.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

// Open lets the held clients go.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// Wait returns once the gate is open or ctx ends.
func (g *Gate) Wait(ctx context.Context) {
	g.mu.Lock()
	ch := g.closed
	g.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}
