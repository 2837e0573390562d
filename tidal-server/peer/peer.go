// Package peer is the gRPC transport between tidal-server nodes. It moves
// opaque, already-marshalled raft messages; it never looks inside them
// except to know a snapshot from the rest.
//
// One sender goroutine per peer drains a bounded queue and coalesces what
// it finds into one stream message (bounded by count and bytes), so a busy
// leader pays one gRPC send per batch, not per raft message. When the
// queue is full the message is dropped and raft is told the peer is
// unreachable: raft retransmits, and a transport that blocks would stall
// the Ready loop of the whole node. Snapshots go on their own stream in
// chunks, and raft learns the outcome through ReportSnapshot.
//
// Failures are logged on transitions — the first failure, every 100th
// after it, and the recovery — never a line per retry.
package peer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Options tune the transport. Zero values take the defaults noted.
type Options struct {
	QueueSize     int           // messages queued per peer; default 4096
	BatchMaxCount int           // messages per stream send; default 512
	BatchMaxBytes int           // bytes per stream send; default 4 MiB
	ChunkSize     int           // snapshot chunk size; default 1 MiB
	DialBackoff   time.Duration // first reconnect delay, doubling to 1s; default 50ms
	// KeepaliveTime/Timeout detect a peer that stopped answering while the
	// TCP connection stays open (a blackholed link): without them a stream
	// would wait forever. Defaults 1s / 2s.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.QueueSize == 0 {
		o.QueueSize = 4096
	}
	if o.BatchMaxCount == 0 {
		o.BatchMaxCount = 512
	}
	if o.BatchMaxBytes == 0 {
		o.BatchMaxBytes = 4 << 20
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = 1 << 20
	}
	if o.DialBackoff == 0 {
		o.DialBackoff = 50 * time.Millisecond
	}
	if o.KeepaliveTime == 0 {
		o.KeepaliveTime = time.Second
	}
	if o.KeepaliveTimeout == 0 {
		o.KeepaliveTimeout = 2 * time.Second
	}
}

// Factory returns a server.TransportFactory building this transport.
func Factory(opts Options) server.TransportFactory {
	return func(self uint64, lis net.Listener, inbound server.Inbound, reg prometheus.Registerer, log *slog.Logger) (replica.Transport, func(), error) {
		t := New(self, inbound, opts, reg, log)
		go t.Serve(lis)
		return t, t.Stop, nil
	}
}

// rawCodec passes []byte through: the payloads are already marshalled.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("peer codec: expected *[]byte, found %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("peer codec: expected *[]byte, found %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "tidal-raw" }

const (
	serviceName     = "tidal.peer.Raft"
	methodMessages  = "Messages"
	methodSnapshots = "Snapshot"
)

// Transport is the gRPC peer transport. It implements replica.Transport.
type Transport struct {
	self    uint64
	inbound server.Inbound
	opts    Options
	log     *slog.Logger
	metrics *metrics
	grpc    *grpc.Server

	mu      sync.Mutex
	senders map[uint64]*sender
	stopped bool
	wg      sync.WaitGroup
}

// New creates a transport; call Serve to accept peers.
func New(self uint64, inbound server.Inbound, opts Options, reg prometheus.Registerer, log *slog.Logger) *Transport {
	opts.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Transport{self: self, inbound: inbound, opts: opts, log: log, metrics: newMetrics(reg), senders: map[uint64]*sender{}}
	t.grpc = grpc.NewServer(
		grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(opts.BatchMaxBytes+(8<<20)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: opts.KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.KeepaliveTime, Timeout: opts.KeepaliveTimeout}),
	)
	t.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{StreamName: methodMessages, Handler: t.serveMessages, ClientStreams: true},
			{StreamName: methodSnapshots, Handler: t.serveSnapshot, ClientStreams: true},
		},
	}, struct{}{})
	return t
}

// Serve accepts peer connections on lis until Stop.
func (t *Transport) Serve(lis net.Listener) error { return t.grpc.Serve(lis) }

// Stop closes every connection and waits for the sender goroutines.
func (t *Transport) Stop() {
	t.mu.Lock()
	t.stopped = true
	senders := t.senders
	t.senders = map[uint64]*sender{}
	t.mu.Unlock()
	for _, s := range senders {
		s.stop()
	}
	t.grpc.Stop()
	t.wg.Wait()
}

// SetPeer adds or re-addresses a peer.
func (t *Transport) SetPeer(id uint64, addr string) {
	if id == t.self {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	if s, ok := t.senders[id]; ok {
		if s.addr == addr {
			return
		}
		s.stop()
	}
	s := newSender(t, id, addr)
	t.senders[id] = s
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.run()
	}()
}

// RemovePeer stops sending to id.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	s, ok := t.senders[id]
	delete(t.senders, id)
	t.mu.Unlock()
	if ok {
		s.stop()
	}
}

// Send queues messages without blocking.
func (t *Transport) Send(msgs []replica.Outbound) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		s, ok := t.senders[m.To]
		if !ok {
			t.metrics.dropped.WithLabelValues(strconv.FormatUint(m.To, 10)).Inc()
			go t.inbound.ReportUnreachable(m.To)
			continue
		}
		if m.Snapshot {
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				s.sendSnapshot(m.Data)
			}()
			continue
		}
		s.enqueue(m.Data)
	}
}

// A batch on the Messages stream is: u32 count | count × (u32 len | message).
func encodeBatch(msgs [][]byte) []byte {
	size := 4
	for _, m := range msgs {
		size += 4 + len(m)
	}
	b := make([]byte, 0, size)
	b = binary.BigEndian.AppendUint32(b, uint32(len(msgs)))
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return b
}

func decodeBatch(b []byte) ([][]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("batch of %d bytes has no count", len(b))
	}
	n := binary.BigEndian.Uint32(b)
	off := 4
	if uint64(n)*4 > uint64(len(b)) {
		return nil, fmt.Errorf("batch claims %d messages in %d bytes", n, len(b))
	}
	out := make([][]byte, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("batch truncated at message %d of %d (offset %d)", i, n, off)
		}
		l := int(binary.BigEndian.Uint32(b[off:]))
		off += 4
		if l < 0 || len(b)-off < l {
			return nil, fmt.Errorf("batch message %d claims %d bytes, %d left (offset %d)", i, l, len(b)-off, off)
		}
		out = append(out, b[off:off+l])
		off += l
	}
	if off != len(b) {
		return nil, fmt.Errorf("batch has %d trailing bytes", len(b)-off)
	}
	return out, nil
}

func (t *Transport) serveMessages(_ any, stream grpc.ServerStream) error {
	for {
		var buf []byte
		if err := stream.RecvMsg(&buf); err != nil {
			if errors.Is(err, io.EOF) {
				return stream.SendMsg(&[]byte{})
			}
			return err
		}
		msgs, err := decodeBatch(buf)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := t.inbound.Receive(stream.Context(), m); err != nil {
				return err
			}
		}
	}
}

func (t *Transport) serveSnapshot(_ any, stream grpc.ServerStream) error {
	var data []byte
	for {
		var chunk []byte
		err := stream.RecvMsg(&chunk)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		data = append(data, chunk...)
	}
	t.log.Info("received snapshot", "bytes", len(data))
	if err := t.inbound.Receive(stream.Context(), data); err != nil {
		return err
	}
	return stream.SendMsg(&[]byte{})
}
