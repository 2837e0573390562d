package relay

import (
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openFDs counts this process's descriptors, and among them pipes.
func openFDs(t testing.TB) (all, pipes int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			pipes++
		}
	}
	return len(ents), pipes
}

// drainPipePool closes every pooled pipe, so that pipes counted after it
// belong to live connections.
func drainPipePool() {
	for {
		select {
		case k := <-pipePool:
			unix.Close(k.r)
			unix.Close(k.w)
		default:
			return
		}
	}
}

// waitIdle waits until no connection of r is active.
func waitIdle(t testing.TB, r *Relay) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().ConnectionsActive != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("expected every connection to end, %d still active after 10s", r.Stats().ConnectionsActive)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSplicePathUsesPipes checks the no-fault path really goes through
// splice(2): a pump blocked in splice holds a pipe, plain copying none.
func TestSplicePathUsesPipes(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	drainPipePool()
	_, before := openFDs(t) // go test's own output pipes
	c := dial(t, r)
	mustEcho(t, c)
	if _, n := openFDs(t); n <= before {
		t.Fatalf("expected the idle relayed connection to hold splice pipes, found %d pipes, as many as before it", n)
	}
}

// TestNoDescriptorLeakPerConnection is the regression test for the
// benchmark hang: every connection leaked its two splice pipes (four
// descriptors), so after ~4,000 connections the process ran out of
// descriptors (ulimit 20,000), the upstream stopped accepting and the
// benchmark's client waited for an echo forever. Many more connections
// than the pipe pool holds go through; afterwards at most the pool's
// pipes may remain.
func TestNoDescriptorLeakPerConnection(t *testing.T) {
	checkNoLeak(t)
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	one := []byte{1}
	cycle := func() {
		c, err := net.Dial("tcp", r.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(one); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			t.Fatalf("echo through relay: %v", err)
		}
	}
	cycle() // the server's and relay's lazily made descriptors (epoll, ...)
	waitIdle(t, r)
	before, _ := openFDs(t)
	conns := 4 * cap(pipePool)
	for range conns {
		cycle()
	}
	waitIdle(t, r)
	after, pipes := openFDs(t)
	if pooled := 2 * cap(pipePool); after-before > pooled {
		t.Fatalf("expected at most %d more descriptors (pooled pipes) after %d connections, found %d more (%d before, %d after, %d of them pipes)",
			pooled, conns, after-before, before, after, pipes)
	}
	if len(pipePool) == 0 {
		t.Fatal("expected ended connections to return their pipes to the pool, found it empty")
	}
}
