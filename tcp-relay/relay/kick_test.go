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
		for deadline := time.Now().Add(30 * time.Second); s.received.Load() < int64(i+1); {
			if time.Now().After(deadline) {
				t.Fatalf("iteration %d: the first byte never arrived", i)
			}
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
		// The held byte must arrive once the fault is gone. Bounded, so
		// a relay that dropped it fails here, naming the iteration, rather
		// than hanging the package until go test's timeout.
		for deadline := time.Now().Add(30 * time.Second); s.received.Load() < int64(i+2); {
			if time.Now().After(deadline) {
				t.Fatalf("iteration %d: the byte held by the blackhole never arrived after RemoveAll returned and the client closed", i)
			}
			time.Sleep(100 * time.Microsecond)
		}
		s.received.Add(-1)
	}
}
