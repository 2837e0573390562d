package relay

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// A message and the FIN right behind it must both be forwarded. The
// small-message path once waited for the poller after a read that
// returned less than its buffer; the poller merges an edge arriving while
// it wakes the reader into that wake-up, and the read returns the data
// without the FIN behind it, so the FIN was never seen and the
// connection hung (found by TestChurnUnderLoad and
// TestHeldByteSurvivesRemovalThenClientClose).
func TestFINBehindDataIsForwarded(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	for i := range 200 {
		c, err := net.DialTCP("tcp", nil, r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte(fmt.Sprintf("message %d", i))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != string(msg) {
			t.Fatalf("connection %d: expected the echo %q and then EOF (the client's FIN passed on to the server, the server's back), found %q, %v", i, msg, got, err)
		}
	}
}

// busyConns opens n connections through r that ping-pong one byte as
// fast as they can until the returned stop is called.
func busyConns(t *testing.T, r *Relay, n int) (stop func()) {
	t.Helper()
	var wg sync.WaitGroup
	var conns []net.Conn
	for range n {
		c := dial(t, r)
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			one := []byte{1}
			for {
				if _, err := c.Write(one); err != nil {
					return
				}
				if _, err := io.ReadFull(c, one); err != nil {
					return
				}
			}
		}()
	}
	return func() {
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}
}

// A fault changes nothing after its call returns — no
// byte moves once the call has answered. A pump that had checked the
// fault set and was about to write when Apply swapped it used to write
// after Apply returned. The hook holds a pump in exactly that window
// while a blackhole is added: Apply must wait for the write (and the
// relay's byte counters, which count bytes written, must not move after
// it returned).
func TestNoByteMovesAfterApplyReturns(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	stop := busyConns(t, r, 1)
	defer stop()

	applied := make(chan struct{})
	waiting := make(chan struct{}, 1)
	hookDone := make(chan struct{})
	var once sync.Once
	var early bool
	hook := func(p *pump) {
		if p.c.r != r {
			return
		}
		once.Do(func() {
			defer close(hookDone)
			go func() {
				if _, err := r.AddFault(mustFault(t, Spec{Type: "blackhole"})); err != nil {
					t.Errorf("AddFault: %v", err)
				}
				close(applied)
			}()
			// Either Apply waits for this pump (fixed) or it returns
			// while the pump still has a write to make (the bug).
			select {
			case <-waiting:
			case <-applied:
				early = true
			case <-time.After(30 * time.Second):
				t.Errorf("AddFault neither returned nor waited for the announced write within 30s")
			}
		})
	}
	settle := func(c *conn) {
		if c.r == r {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}
	testHookAnnounced.Store(&hook)
	testHookSettleWaits.Store(&settle)
	t.Cleanup(func() { testHookAnnounced.Store(nil); testHookSettleWaits.Store(nil) })

	for _, ch := range []chan struct{}{hookDone, applied} {
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
			t.Fatal("the hook did not run or AddFault did not return within 60s")
		}
	}
	if early {
		t.Fatal("AddFault returned while a pump was about to write under the old fault set")
	}
	st := r.Stats()
	time.Sleep(20 * time.Millisecond)
	if now := r.Stats(); now.BytesUpstream != st.BytesUpstream || now.BytesDownstream != st.BytesDownstream {
		t.Fatalf("bytes moved after AddFault(blackhole) returned: %d up and %d down at the return, %d and %d later",
			st.BytesUpstream, st.BytesDownstream, now.BytesUpstream, now.BytesDownstream)
	}
}

// The same, statistically and for every kind of write (small messages,
// bulk splice, the fault-aware loop under latency): busy connections,
// a blackhole added over and over, and the relay's byte counters read
// when the call returns and again after a while.
func TestNoByteMovesAfterBlackholeOnBusyConnections(t *testing.T) {
	s := startServer(t, false)
	r := startRelay(t, s.addr())
	stop := busyConns(t, r, 4)
	defer stop()
	bulk := dial(t, r)
	go func() {
		buf := make([]byte, 256<<10)
		for {
			if _, err := bulk.Write(buf); err != nil {
				return
			}
		}
	}()
	go func() { io.Copy(io.Discard, bulk) }()
	for i := range 40 {
		if i%2 == 1 {
			add(t, r, Spec{Name: "slow", Type: "latency", LatencyMS: 1})
		}
		time.Sleep(5 * time.Millisecond)
		add(t, r, Spec{Name: "cut", Type: "blackhole"})
		st := r.Stats()
		time.Sleep(5 * time.Millisecond)
		if now := r.Stats(); now.BytesUpstream != st.BytesUpstream || now.BytesDownstream != st.BytesDownstream {
			t.Fatalf("round %d: bytes moved after AddFault(blackhole) returned: %d up and %d down at the return, %d and %d 5ms later",
				i, st.BytesUpstream, st.BytesDownstream, now.BytesUpstream, now.BytesDownstream)
		}
		if _, err := r.RemoveAll(); err != nil {
			t.Fatal(err)
		}
	}
}
