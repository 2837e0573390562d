package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Regression: RemoveAll answered every error from Apply
// by calling itself, so on a closed relay (Apply: ErrClosed) it recursed
// until the stack overflowed — reachable through Mesh.Reset and the
// nemesis's HealAll after Close. It returns the error now.
func TestRemoveAllOnClosedRelay(t *testing.T) {
	// A small stack limit turns the old unbounded recursion into a quick
	// crash instead of a gigabyte of stack first.
	defer debug.SetMaxStack(debug.SetMaxStack(64 << 20))
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	add(t, r, Spec{Type: "blackhole"})
	r.Close()
	if _, err := r.RemoveAll(); !errors.Is(err, ErrClosed) {
		t.Fatalf("expected RemoveAll on a closed relay to fail with ErrClosed, found %v", err)
	}
}

// waitFor polls cond until it holds or the deadline passes; it reports
// the last state through describe.
func waitFor(t *testing.T, what string, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 20s: %s", what, describe())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connectAndLeave opens n connections through r, writes a request on
// each and closes it: half with FIN, half with RST (SO_LINGER 0), as
// clients that time out and give up do. It returns once every one was
// accepted and forwarded by the relay.
func connectAndLeave(t *testing.T, r *Relay, n int) {
	t.Helper()
	before := r.Stats().ConnectionsTotal
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTCP("tcp", nil, r.Addr())
			if err != nil {
				errs <- err
				return
			}
			if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
				errs <- err
			}
			if i%2 == 1 {
				_ = c.SetLinger(0)
			}
			c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("client: %v", err)
	}
	waitFor(t, "every connection accepted and dialled upstream",
		func() bool { return r.Stats().ConnectionsTotal-before == uint64(n) },
		func() string { return fmt.Sprintf("%d connections total", r.Stats().ConnectionsTotal-before) })
}

// Regression: a blackholed relay never noticed a client
// that went away — 200 clients that connected and closed under a two-way
// blackhole left 400 goroutines, 400 relay sockets and 200 upstream
// connections until the fault was removed. The held direction now watches
// its source for the hang-up and releases the connection, still
// forwarding nothing: the server receives no byte, and is reset rather
// than closed, so it cannot take a cut stream for a complete one.
func TestBlackholeReleasesClientsThatLeave(t *testing.T) {
	const clients = 200
	for _, dir := range []Direction{Both, Upstream} {
		t.Run(string(dir), func(t *testing.T) {
			s := startServer(t, true)
			r := startRelay(t, s.addr())
			add(t, r, Spec{Type: "blackhole", Direction: dir})
			goroutines := runtime.NumGoroutine()
			connectAndLeave(t, r, clients)
			waitFor(t, "every connection released while the blackhole is installed",
				func() bool { return r.Stats().ConnectionsActive == 0 },
				func() string { return fmt.Sprintf("%d connections still active", r.Stats().ConnectionsActive) })
			var reset int
			for range clients {
				select {
				case err := <-s.ended:
					if errors.Is(err, syscall.ECONNRESET) {
						reset++
					} else if !errors.Is(err, io.EOF) {
						t.Errorf("server side: expected the connection reset, found %v", err)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("server side: only %d of %d upstream connections ended 20s after their clients left", reset, clients)
				}
			}
			if reset != clients {
				t.Errorf("server side: expected all %d upstream connections reset (a cut stream must not look complete), found %d", clients, reset)
			}
			if got := s.received.Load(); got != 0 {
				t.Errorf("expected the blackhole to forward nothing, server received %d bytes", got)
			}
			waitFor(t, "the released connections' goroutines gone",
				func() bool { return runtime.NumGoroutine() <= goroutines },
				func() string { return fmt.Sprintf("%d goroutines, %d before", runtime.NumGoroutine(), goroutines) })
			if n := len(r.Faults()); n != 1 {
				t.Fatalf("expected the blackhole still installed, found %d faults", n)
			}
		})
	}
}

// A downstream-only blackhole: the client's request and FIN go through,
// the server answers and closes, the answer is held. Once both ends have
// hung up nobody waits on anything, so the connection is released; the
// client gets a reset, never the held answer.
func TestDownstreamBlackholeReleasesWhenBothEndsLeft(t *testing.T) {
	s := startServer(t, false) // echo: answers, then closes on the client's FIN
	r := startRelay(t, s.addr())
	add(t, r, Spec{Type: "blackhole", Direction: Downstream})
	c := dial(t, r)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := c.Read(make([]byte, 4))
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("expected a reset without the held answer once the server closed, read %d bytes, err %v", n, err)
	}
	waitFor(t, "the connection released", func() bool { return r.Stats().ConnectionsActive == 0 },
		func() string { return fmt.Sprintf("%d active", r.Stats().ConnectionsActive) })
	if got := r.Stats().BytesDownstream; got != 0 {
		t.Errorf("expected nothing forwarded downstream, found %d bytes", got)
	}
}

// A client that stays connected under a blackhole is not released, and
// gets every held byte after the heal: the watch never reads.
func TestBlackholeKeepsClientThatStays(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	add(t, r, Spec{Type: "blackhole"})
	other := dial(t, r) // a neighbour that leaves must not take c along
	other.Write([]byte("bye"))
	other.Close()
	waitFor(t, "the leaving neighbour released", func() bool { return r.Stats().ConnectionsActive == 1 },
		func() string { return fmt.Sprintf("%d active", r.Stats().ConnectionsActive) })
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RemoveFault("blackhole_both"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("expected the held bytes after the heal, got %q, %v", got, err)
	}
}
