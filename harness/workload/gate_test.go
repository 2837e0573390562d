package workload

import (
	"context"
	"testing"
	"time"
)

// A closed gate holds Wait until Open; an open one (the zero Gate) does
// not; a cancelled context releases a waiter too.
func TestGateHoldsUntilOpen(t *testing.T) {
	var g Gate
	g.Wait(context.Background()) // open: returns at once
	g.Close()
	released := make(chan struct{})
	go func() {
		g.Wait(context.Background())
		close(released)
	}()
	select {
	case <-released:
		t.Fatal("Wait returned while the gate was closed")
	case <-time.After(50 * time.Millisecond):
	}
	g.Open()
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Open")
	}
	g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.Wait(ctx) // cancelled: returns though closed
	g.Open()
}
