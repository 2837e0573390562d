package relay

import (
	"testing"
	"time"
)

// TestFaultActsOnNextByte adds a blackhole to a fresh, idle connection
// and writes right after the call returns, many times: not one byte may
// get through. (Deadlines alone leave a window between Go's deadline
// check and the read syscall; this caught it.)
func TestFaultActsOnNextByte(t *testing.T) {
	s := startServer(t, true)
	r := startRelay(t, s.addr())
	for i := 0; i < 200; i++ {
		c := dial(t, r)
		c.Write([]byte("w"))
		for s.received.Load() < int64(i+1) {
			time.Sleep(100 * time.Microsecond)
		}
		add(t, r, Spec{Type: "blackhole"})
		c.Write([]byte("p"))
		time.Sleep(2 * time.Millisecond)
		if got := s.received.Load(); got != int64(i+1) {
			t.Fatalf("iteration %d: a byte written after AddFault returned went through the blackhole", i)
		}
		r.RemoveAll()
		c.Close()
		for s.received.Load() < int64(i+2) {
			time.Sleep(100 * time.Microsecond)
		}
		s.received.Add(-1)
	}
}
