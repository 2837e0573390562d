package relay

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// server is a real TCP server on 127.0.0.1. It echoes (or, with sink,
// counts and discards). A connection is closed when its peer has finished
// (EOF, error) or when the server stops, so long benchmarks do not pile
// up descriptors.
type server struct {
	ln       net.Listener
	ended    chan error // how each connection ended: its last read or write error
	received atomic.Int64
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{} // open connections, closed on cleanup
}

func startServer(t testing.TB, sink bool) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, ended: make(chan error, 1024), conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					c.Close()
				}()
				buf := make([]byte, 64<<10)
				err := error(nil)
				for err == nil {
					var n int
					n, err = c.Read(buf)
					s.received.Add(int64(n))
					if n > 0 && !sink {
						if _, werr := c.Write(buf[:n]); werr != nil {
							err = werr
						}
					}
				}
				select {
				case s.ended <- err:
				default:
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

func startRelay(t testing.TB, upstream string) *Relay {
	t.Helper()
	r, err := Listen(Config{Name: "test", Listen: "127.0.0.1:0", Upstream: upstream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func dial(t testing.TB, r *Relay) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustFault(t testing.TB, s Spec) Fault {
	t.Helper()
	f, err := s.Fault()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func add(t testing.TB, r *Relay, s Spec) time.Time {
	t.Helper()
	at, err := r.AddFault(mustFault(t, s))
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// roundTrip writes msg and reads the echo, failing after timeout.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo differs: sent %d bytes, got back different content", len(msg))
	}
	return nil
}

func mustEcho(t testing.TB, c net.Conn) {
	t.Helper()
	if err := roundTrip(c, []byte("ping"), 5*time.Second); err != nil {
		t.Fatalf("echo through relay: %v", err)
	}
}

// checkNoLeak fails if goroutines started during the test outlive it.
func checkNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}

func TestForwardsLargeStreamBothWays(t *testing.T) {
	checkNoLeak(t)
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	msg := make([]byte, 8<<20)
	rand.Read(msg)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); c.CloseWrite(); errc <- err }()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echoed stream differs: sent %d bytes, got %d", len(msg), len(got))
	}
	st := r.Stats()
	if st.BytesUpstream != uint64(len(msg)) || st.BytesDownstream != uint64(len(msg)) || st.ConnectionsTotal != 1 {
		t.Fatalf("stats: expected 1 connection and %d bytes each way, found %+v", len(msg), st)
	}
}

func TestBlackholeStopsStreamingAndReleasesOnRemove(t *testing.T) {
	s := startServer(t, true)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	stop := make(chan struct{})
	var sent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			n, _ := c.Write(buf)
			sent.Add(int64(n))
		}
	}()
	defer func() { close(stop); <-done }()
	for s.received.Load() < 1<<20 {
		time.Sleep(time.Millisecond)
	}
	add(t, r, Spec{Type: "blackhole", Direction: Upstream})
	time.Sleep(50 * time.Millisecond)
	atCut := s.received.Load()
	time.Sleep(300 * time.Millisecond)
	if after := s.received.Load(); after != atCut {
		t.Fatalf("blackhole: server received %d bytes more between 50ms and 350ms after the fault was added", after-atCut)
	}
	if _, err := r.RemoveFault("blackhole_upstream"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.received.Load() == atCut {
		if time.Now().After(deadline) {
			t.Fatal("traffic did not resume after removing the blackhole")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBlackholeKeepsBytesNoHole(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	add(t, r, Spec{Type: "blackhole"})
	c.Write([]byte("held"))
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected no echo through a blackhole, read %d bytes, err %v", n, err)
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

func TestResetSendsRSTToBothEnds(t *testing.T) {
	s := startServer(t, false)
	// Not an echo: take the server side out of the echo loop's hands by
	// reading it ourselves.
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	add(t, r, Spec{Type: "reset"})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client side: expected ECONNRESET, found %v", err)
	}
	// The echo goroutine's read on the server side ends with the RST.
	select {
	case err := <-s.ended:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("server side: expected ECONNRESET, found %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server side: connection still open 5s after the reset")
	}
	// New connections are reset while the fault is installed.
	if err := firstRead(r); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("new connection: expected ECONNRESET, found %v", err)
	}
}

func TestRejectRefusesNewKeepsExisting(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	old := dial(t, r)
	mustEcho(t, old)
	add(t, r, Spec{Type: "reject"})
	if err := firstRead(r); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("expected the new connection reset at once, found %v", err)
	}
	mustEcho(t, old)
}

// firstRead connects to r and reads one byte; the RST of a rejected
// connection may already fail the connect itself.
func firstRead(r *Relay) error {
	c, err := net.DialTCP("tcp", nil, r.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
}

func rtt(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	if err := roundTrip(c, []byte{1}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func TestLatencyDelaysExistingConnection(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	add(t, r, Spec{Type: "latency", Direction: Upstream, LatencyMS: 60, JitterMS: 10})
	if d := rtt(t, c); d < 50*time.Millisecond || d > 2*time.Second {
		t.Fatalf("expected a round trip of about 60ms with upstream latency 60±10ms, found %v", d)
	}
	add(t, r, Spec{Type: "latency", Direction: Downstream, LatencyMS: 40})
	if d := rtt(t, c); d < 90*time.Millisecond || d > 2*time.Second {
		t.Fatalf("expected about 100ms with latency both ways, found %v", d)
	}
	r.RemoveAll()
	if d := rtt(t, c); d > 40*time.Millisecond {
		t.Fatalf("expected latency gone after removal, round trip took %v", d)
	}
}

func TestLatencyPreservesOrderAndData(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	add(t, r, Spec{Type: "latency", LatencyMS: 5, JitterMS: 5})
	c := dial(t, r)
	msg := make([]byte, 1<<20)
	rand.Read(msg)
	go func() {
		for i := 0; i < len(msg); i += 1000 {
			c.Write(msg[i:min(i+1000, len(msg))])
		}
		c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("expected the stream intact and in order, got %d of %d bytes (err %v)", len(got), len(msg), err)
	}
}

func TestBandwidthCapsThroughput(t *testing.T) {
	s := startServer(t, true)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	const rate, total = 1 << 20, 600 << 10
	add(t, r, Spec{Type: "bandwidth", Direction: Upstream, RateBytes: rate})
	start := time.Now()
	go c.Write(make([]byte, total))
	deadline := time.Now().Add(30 * time.Second)
	for s.received.Load() < total {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d bytes arrived", s.received.Load(), total)
		}
		time.Sleep(time.Millisecond)
	}
	// 600 KiB at 1 MiB/s takes ~586ms; the bound only has to exclude the
	// unthrottled case (well under 10 ms on loopback).
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("expected >= ~586ms for %d bytes at %d B/s, took %v", total, rate, d)
	}
}

func TestSlicerSplitsWrites(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	add(t, r, Spec{Type: "slicer", Direction: Downstream, AverageSize: 10, SizeVariation: 5, DelayUS: 3000})
	msg := make([]byte, 200)
	rand.Read(msg)
	c.Write(msg)
	got := make([]byte, 0, len(msg))
	reads := 0
	buf := make([]byte, 1024)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < len(msg) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		reads++
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("sliced stream differs from what was sent")
	}
	// 200 bytes in slices of 5..15 with 3ms gaps: at least 14 writes; a
	// reader may merge a few, never most.
	if reads < 5 {
		t.Fatalf("expected the 200 bytes in many small reads, got %d reads", reads)
	}
}

func TestLimitDataClosesAfterBytes(t *testing.T) {
	s := startServer(t, true)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustFault(t, Spec{Type: "limit_data", Bytes: 100})
	add(t, r, Spec{Type: "limit_data", Direction: Upstream, Bytes: 100})
	c.Write(make([]byte, 1000))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected the connection closed after 100 bytes, read err %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	if got := s.received.Load(); got != 100 {
		t.Fatalf("expected exactly 100 bytes upstream, server got %d", got)
	}
}

func TestTimeoutHoldsThenCloses(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	at := add(t, r, Spec{Type: "timeout", TimeoutMS: 150})
	c.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected close without data, read %d bytes, err %v", n, err)
	}
	if d := time.Since(at); d < 140*time.Millisecond {
		t.Fatalf("expected the close after 150ms, came after %v", d)
	}
}

func TestTimeoutZeroHoldsUntilRemoved(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	add(t, r, Spec{Name: "t", Type: "timeout"})
	c.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected the data held, found %v", err)
	}
	r.RemoveFault("t")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("expected the held byte after removal: %v", err)
	}
}

func TestToxicity(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	zero, half := 0.0, 0.5
	add(t, r, Spec{Name: "never", Type: "blackhole", Toxicity: &zero})
	c := dial(t, r)
	mustEcho(t, c)
	r.RemoveAll()

	add(t, r, Spec{Name: "always", Type: "blackhole"})
	if err := roundTrip(c, []byte("x"), 100*time.Millisecond); err == nil {
		t.Fatal("toxicity 1: expected the echo blocked")
	}
	r.RemoveAll()

	add(t, r, Spec{Name: "half", Type: "blackhole", Toxicity: &half})
	blocked := 0
	const n = 40
	for i := 0; i < n; i++ {
		if roundTrip(dial(t, r), []byte("x"), 50*time.Millisecond) != nil {
			blocked++
		}
	}
	// P(0 or 40 of 40) = 2^-39.
	if blocked == 0 || blocked == n {
		t.Fatalf("toxicity 0.5: expected some of %d connections blocked and some not, %d blocked", n, blocked)
	}
}

func TestApplyErrors(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	add(t, r, Spec{Name: "a", Type: "blackhole"})
	if _, err := r.AddFault(mustFault(t, Spec{Name: "a", Type: "latency", LatencyMS: 1})); !errors.Is(err, ErrFaultExists) {
		t.Fatalf("expected ErrFaultExists, found %v", err)
	}
	if _, err := r.RemoveFault("nope"); !errors.Is(err, ErrNoFault) {
		t.Fatalf("expected ErrNoFault, found %v", err)
	}
	if f := r.Faults(); len(f) != 1 || f[0].Name != "a" {
		t.Fatalf("expected only fault a after failed changes, found %v", f)
	}
	if _, err := Listen(Config{Name: "dup", Listen: r.Addr().String(), Upstream: s.addr()}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("expected EADDRINUSE listening on a taken port, found %v", err)
	}
}

func TestSpecValidation(t *testing.T) {
	neg := -0.1
	cases := []struct {
		s     Spec
		field string
	}{
		{Spec{}, "type"},
		{Spec{Type: "gremlin"}, "type"},
		{Spec{Type: "latency", Direction: "sideways"}, "direction"},
		{Spec{Type: "latency", Toxicity: &neg}, "toxicity"},
		{Spec{Type: "latency", LatencyMS: -1}, "latency_ms"},
		{Spec{Type: "latency", LatencyMS: 1, JitterMS: 5}, "jitter_ms"},
		{Spec{Type: "bandwidth"}, "rate_bytes"},
		{Spec{Type: "bandwidth", RateBytes: 1, JitterMS: 1}, "jitter_ms"},
		{Spec{Type: "slicer"}, "average_size"},
		{Spec{Type: "slicer", AverageSize: 5, SizeVariation: 5}, "size_variation"},
		{Spec{Type: "blackhole", Name: "a b"}, "name"},
	}
	for _, tc := range cases {
		_, err := tc.s.Fault()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: expected an error naming %q, found %v", tc.s, tc.field, err)
		}
	}
	f := mustFault(t, Spec{Type: "slicer", AverageSize: 10, SizeVariation: 2, DelayUS: 7})
	if s := f.Spec(); s.Name != "slicer_both" || s.AverageSize != 10 || s.SizeVariation != 2 || s.DelayUS != 7 || *s.Toxicity != 1 {
		t.Fatalf("round trip of spec lost attributes: %+v", s)
	}
}

// TestChurnUnderLoad makes 100 fault changes, one every 10ms or slower,
// while 100 connections stream until the churn ends, and checks that no
// change hangs (a change taking 10s fails with every goroutine's stack),
// every stream comes through intact, and nothing leaks. The streams run as
// long as the churn does, however slow the machine, so no rate is assumed.
func TestChurnUnderLoad(t *testing.T) {
	checkNoLeak(t)
	s := startServer(t, false)
	r, err := Listen(Config{Name: "churn", Listen: "127.0.0.1:0", Upstream: s.addr()})
	if err != nil {
		t.Fatal(err)
	}
	const conns, changes = 100, 100
	pattern := make([]byte, 64<<10)
	rand.Read(pattern)
	var wg sync.WaitGroup
	errs := make(chan error, conns+changes)
	stop := make(chan struct{})
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTCP("tcp", nil, r.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			var sent atomic.Int64
			go func() {
				defer c.CloseWrite()
				for off := 0; ; off = (off + 4096) % len(pattern) {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := c.Write(pattern[off : off+4096]); err != nil {
						return
					}
					sent.Add(4096)
					// Paced (at most ~800 KB/s a stream), so what is in
					// flight when the churn stops drains in moments.
					time.Sleep(5 * time.Millisecond)
				}
			}()
			// Compare as we go: the echo of byte k is pattern[k mod len].
			var got int64
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				for j := 0; j < n; j++ {
					if buf[j] != pattern[(got+int64(j))%int64(len(pattern))] {
						errs <- fmt.Errorf("stream corrupted at byte %d", got+int64(j))
						return
					}
				}
				got += int64(n)
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- fmt.Errorf("stream ended after %d bytes: %v", got, err)
					return
				}
			}
			if got != sent.Load() {
				errs <- fmt.Errorf("stream lost bytes: sent %d, echoed %d", sent.Load(), got)
			}
		}()
	}
	specs := []Spec{
		{Type: "latency", LatencyMS: 2, JitterMS: 1},
		{Type: "bandwidth", RateBytes: 50 << 20},
		{Type: "slicer", AverageSize: 512, SizeVariation: 256},
		{Type: "blackhole", Direction: Upstream},
		{Type: "blackhole", Direction: Downstream},
		{Type: "timeout"},
	}
	tick := time.NewTicker(10 * time.Millisecond)
	for i := 0; i < changes; i++ {
		<-tick.C
		// A change that does not return is the hang Toxiproxy's users
		// report: keep every goroutine's stack from while it was stuck.
		stuck := make(chan []byte, 1)
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 4<<20)
			stuck <- buf[:runtime.Stack(buf, true)]
		})
		if i%2 == 0 {
			s := specs[mrand.IntN(len(specs))]
			s.Name = fmt.Sprintf("f%d", i)
			if _, err := r.AddFault(mustFault(t, s)); err != nil {
				t.Fatal(err)
			}
		} else {
			r.RemoveAll()
		}
		if !watchdog.Stop() {
			t.Fatalf("fault change %d did not return within 10s; goroutines then:\n%s", i, <-stuck)
		}
	}
	tick.Stop()
	close(stop)
	r.RemoveAll()
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 4<<20)
		t.Fatalf("streams hung after the faults were removed; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// At least: a stray connection from another process on this machine
	// may find the port.
	if st := r.Stats(); st.ConnectionsTotal < conns || st.ConnectionsActive != 0 {
		t.Fatalf("expected %d connections, none active, found %+v", conns, st)
	}
}
