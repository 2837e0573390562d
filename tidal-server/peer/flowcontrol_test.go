package peer

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Regression (peer plane's write system calls): gRPC's bandwidth
// estimator, on by default, answered nearly every DATA frame a peer
// connection received with a PING of its own (and the other side with a
// PING ack): on a leader under single-event writes half of the peer
// plane's write system calls carried no raft message. Fixed windows turn
// the estimator off on both ends. Member 1 sends member 2 one heartbeat at
// a time (each its own DATA frame, each a chance for a ping); after two
// more answers of member 2 on the same connection (clock probes, queued
// behind any ping the heartbeats caused), no frame either way may be a
// bandwidth-estimation PING.
func TestPeerConnectionsSendNoBandwidthPings(t *testing.T) {
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, Options{Membership: view, ClockInterval: 10 * time.Millisecond})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frames := &frameLog{}
	in := newRecorder()
	t2, err := New(2, in, Options{Membership: view, SpoolDir: filepath.Join(t.TempDir(), "spool")}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go t2.Serve(&recordingListener{Listener: lis, log: frames})
	t.Cleanup(t2.Stop)
	n1.t.SetPeer(2, lis.Addr().String())

	const heartbeats = 20
	for i := 1; i <= heartbeats; i++ {
		n1.t.Send(outbound(t, heartbeat(1, 2, uint64(i))))
		eventually(t, "heartbeat delivered", func() bool { return len(in.received()) == i })
	}
	answered := frames.serverHeaders()
	eventually(t, "two more answers of member 2 on the connection", func() bool { return frames.serverHeaders() >= answered+2 })

	fromServer, fromClient := frames.bandwidthPings()
	if fromServer != 0 || fromClient != 0 {
		t.Errorf("bandwidth-estimation PINGs on the peer connection: %d from the receiver, %d from the sender; expected none (fixed windows)", fromServer, fromClient)
	}
	for i, m := range in.received() {
		if m.GetTerm() != uint64(i+1) {
			t.Fatalf("heartbeat %d arrived with term %d; expected %d (in order)", i, m.GetTerm(), i+1)
		}
	}
}

// bdpPingData is the payload grpc-go puts in its bandwidth-estimation
// PINGs (internal/transport/bdp_estimator.go); keepalive PINGs carry zeros.
var bdpPingData = []byte{2, 4, 16, 16, 9, 14, 7, 7}

// recordingListener hands out connections whose HTTP/2 frames, both ways,
// are parsed into log (plaintext only).
type recordingListener struct {
	net.Listener
	log *frameLog
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, in: &frameParser{log: l.log, preface: len(http2Preface)}, out: &frameParser{log: l.log, server: true}}, nil
}

const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

type recordingConn struct {
	net.Conn
	in, out *frameParser
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.feed(b[:n])
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.feed(b[:n])
	return n, err
}

// frameLog counts what the tests look at: HEADERS written by the server,
// and bandwidth-estimation PINGs (not acks) each way.
type frameLog struct {
	mu                         sync.Mutex
	headersOut                 int
	bdpFromServer, bdpFromPeer int
}

func (f *frameLog) serverHeaders() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headersOut
}

func (f *frameLog) bandwidthPings() (fromServer, fromClient int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bdpFromServer, f.bdpFromPeer
}

// frameParser splits one direction of a connection into HTTP/2 frames.
type frameParser struct {
	log     *frameLog
	server  bool // frames written by the server
	preface int  // bytes still to skip (the client's connection preface)
	buf     []byte
}

const (
	frameHeaders = 0x1
	framePing    = 0x6
	flagAck      = 0x1
)

func (p *frameParser) feed(b []byte) {
	if p.preface > 0 {
		skip := min(p.preface, len(b))
		p.preface -= skip
		b = b[skip:]
	}
	p.buf = append(p.buf, b...)
	for len(p.buf) >= 9 {
		length := int(binary.BigEndian.Uint32(append([]byte{0}, p.buf[:3]...)))
		if len(p.buf) < 9+length {
			return
		}
		typ, flags, payload := p.buf[3], p.buf[4], p.buf[9:9+length]
		p.log.mu.Lock()
		switch {
		case typ == frameHeaders && p.server:
			p.log.headersOut++
		case typ == framePing && flags&flagAck == 0 && bytes.Equal(payload, bdpPingData):
			if p.server {
				p.log.bdpFromServer++
			} else {
				p.log.bdpFromPeer++
			}
		}
		p.log.mu.Unlock()
		p.buf = p.buf[9+length:]
	}
}
