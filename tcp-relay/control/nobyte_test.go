package control

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// A fault changes nothing after its API call returns — no byte
// moves once the call has answered. Through the HTTP API, on connections
// busy with small messages and a bulk stream: once AddFault(blackhole)
// has answered, the relay's byte counters (bytes it wrote) stay where
// they were. (relay's TestNoByteMovesAfterApplyReturns pins the window
// this closes deterministically.)
func TestNoByteMovesAfterFaultCallAnswers(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	info, err := c.CreateRelay(ctx, RelayConfig{Name: "busy", Listen: "127.0.0.1:0", Upstream: echoServer(t)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
		wg.Wait()
	}()
	for i := range 5 {
		conn, err := net.Dial("tcp", info.Listen)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		wg.Add(1)
		if i == 0 { // bulk, both ways
			go func() { io.Copy(io.Discard, conn) }()
			go func() {
				defer wg.Done()
				buf := make([]byte, 256<<10)
				for {
					if _, err := conn.Write(buf); err != nil {
						return
					}
				}
			}()
			continue
		}
		go func() { // 1-byte ping-pong
			defer wg.Done()
			one := []byte{1}
			for {
				if _, err := conn.Write(one); err != nil {
					return
				}
				if _, err := io.ReadFull(conn, one); err != nil {
					return
				}
			}
		}()
	}
	stats := func() relay.Stats {
		t.Helper()
		ri, err := c.Relay(ctx, "busy")
		if err != nil {
			t.Fatal(err)
		}
		return ri.Stats
	}
	for round := range 20 {
		time.Sleep(5 * time.Millisecond) // let traffic flow
		if _, err := c.AddFault(ctx, "busy", relay.Spec{Name: "cut", Type: "blackhole"}); err != nil {
			t.Fatal(err)
		}
		at := stats()
		time.Sleep(5 * time.Millisecond)
		if now := stats(); now.BytesUpstream != at.BytesUpstream || now.BytesDownstream != at.BytesDownstream {
			t.Fatalf("round %d: the relay wrote bytes after AddFault(blackhole) answered: %d up / %d down then, %d / %d 5ms later",
				round, at.BytesUpstream, at.BytesDownstream, now.BytesUpstream, now.BytesDownstream)
		}
		if _, err := c.RemoveFault(ctx, "busy", "cut"); err != nil {
			t.Fatal(err)
		}
	}
}
