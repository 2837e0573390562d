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

// bulkEcho sends n bytes through c and reads their echo back, with a
// writer alongside so that neither side's buffers have to hold it all.
func bulkEcho(t testing.TB, c net.Conn, n int) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	msg := make([]byte, n)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); errc <- err }()
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		t.Fatalf("bulk echo through relay: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("bulk write through relay: %v", err)
	}
}

// TestSplicePathUsesPipes checks that bulk data on the no-fault path goes
// through splice(2) (a pump that has spliced holds a pipe) while small
// messages are copied (no pipe).
func TestSplicePathUsesPipes(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	drainPipePool()
	_, before := openFDs(t) // go test's own output pipes
	c := dial(t, r)
	mustEcho(t, c)
	if _, n := openFDs(t); n != before {
		t.Fatalf("expected small messages to be copied without pipes, found %d pipes, %d before", n, before)
	}
	bulkEcho(t, c, 4<<20)
	if _, n := openFDs(t); n <= before {
		t.Fatalf("expected the relayed connection to hold splice pipes after a bulk transfer, found %d pipes, as many as before it", n)
	}
	mustEcho(t, c) // and small messages after bulk ones still go through
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
		bulkEcho(t, c, 4*readSize) // so that both pumps splice
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

// The relay's sockets use a congestion control without pacing (see
// congestion_linux.go), both the accepted one and the upstream one.
func TestRelaySocketsAvoidPacedCongestionControl(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	want := congestionChoice.Load()
	if want == nil || *want == "" {
		t.Skip("this process may set neither cubic nor reno")
	}
	var found []string
	r.conns.Range(func(k, _ any) bool {
		rc := k.(*conn)
		for _, sock := range []*net.TCPConn{rc.client, rc.server} {
			raw, err := sock.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			raw.Control(func(fd uintptr) {
				cc, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
				if err != nil {
					t.Fatal(err)
				}
				found = append(found, cc)
			})
		}
		return true
	})
	if len(found) != 2 || found[0] != *want || found[1] != *want {
		t.Fatalf("expected the accepted and the upstream socket on %s, found %v", *want, found)
	}
}

// The accepted sockets keep Go's keep-alive probing (15 s idle, 15 s
// interval, 9 probes) now that they inherit it from the listener instead
// of Go setting it on each (keepalive_linux.go).
func TestAcceptedSocketsKeepGoKeepAlive(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	c := dial(t, r)
	mustEcho(t, c)
	checked := 0
	r.conns.Range(func(k, _ any) bool {
		rc := k.(*conn)
		raw, err := rc.client.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		raw.Control(func(fd uintptr) {
			for _, o := range []struct {
				name       string
				level, opt int
				want       int
			}{
				{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
				{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
				{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
				{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
			} {
				v, err := unix.GetsockoptInt(int(fd), o.level, o.opt)
				if err != nil {
					t.Fatal(err)
				}
				if v != o.want {
					t.Errorf("accepted socket: expected %s %d, found %d", o.name, o.want, v)
				}
			}
		})
		checked++
		return true
	})
	if checked != 1 {
		t.Fatalf("expected 1 relayed connection, found %d", checked)
	}
}
