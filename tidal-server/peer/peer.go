// Package peer is the gRPC transport between tidal-server nodes. It moves
// already-marshalled raft messages and reads only their header (type, to,
// from, term) to decide whether raft may see them.
//
// One sender goroutine per peer drains a bounded queue and coalesces what
// it finds into one stream message (bounded by count and bytes), so a busy
// leader pays one gRPC send per batch, not per raft message.
//
// Raft groups (groups.go, frame.go). A node may host many raft groups; the
// peer node's one sender, queue and stream carry them all, each message
// tagged with its group in the frame (a frame without tags is group 1's:
// what every earlier release sends, and what a node hosting only group 1
// still sends). Each group registers a Handler (Register, Unregister) that
// receives its messages and resolves its raft ids to nodes; Send is group
// 1's. A peer of a protocol older than groupedProtocol is sent group 1's
// messages only (version.go). When the
// queue is full the message is dropped and raft is told the peer is
// unreachable: raft retransmits, and a transport that blocks would stall
// the Ready loop of the whole node. Snapshots go on their own stream in
// chunks, and raft learns the outcome through ReportSnapshot.
//
// Security (see docs/ARCHITECTURE.md, "Peer plane"). With ServerTLS and
// ClientTLS set the plane is mutual TLS: a peer's certificate, verified
// against the cluster CA, proves its member id, and a dialer accepts only
// the member it meant to reach. Every inbound message is admitted only if
// its From is the member the connection proved (in insecure mode nothing
// is proved, so From is taken at its word), From is a member in this
// node's view (or vouched for by one: see membership.go), and To is this
// node. Anything else is dropped and counted in
// tidal_peer_messages_dropped_total{reason}. Snapshots are spooled to
// disk as they arrive, capped, and handed to raft only once complete and
// admitted (snapshot.go). Nodes also measure their clock offsets to each
// other (clock.go).
//
// Failures are logged on transitions — the first failure, every Nth after
// it, and the recovery — never a line per retry or per dropped message.
package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// Options tune the transport. Zero values take the defaults noted.
type Options struct {
	QueueSize int // messages queued per peer; default 4096

	// QueueBytes bounds the bytes of the messages queued per peer and not
	// yet taken into a frame; default 32 MiB. A peer that stops reading
	// (just restarted and replaying its log, or starved of CPU) blocks its
	// stream on flow control while raft goes on handing it appends — up
	// to MaxSizePerMsg each, again on every heartbeat answer while it
	// probes — and without a byte bound the 4096 slots hold gigabytes that
	// the node allocates, copies and collects while its other peers wait
	// for heartbeats. Past the bound messages are dropped and raft told
	// the peer is unreachable, as for a full queue: it resends from what
	// the peer acknowledged.
	QueueBytes int

	BatchMaxCount int           // messages per stream send; default 512
	BatchMaxBytes int           // bytes per stream send; default 4 MiB
	ChunkSize     int           // snapshot chunk size; default 1 MiB
	DialBackoff   time.Duration // first reconnect delay, doubling to 1s; default 50ms
	// KeepaliveTime/Timeout detect a peer that stopped answering while the
	// TCP connection stays open (a blackholed link): without them a stream
	// would wait forever. Defaults 1s / 2s.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration

	// ServerTLS and ClientTLS turn on mutual TLS; both or neither.
	// ServerTLS must require and verify a client certificate naming a
	// member (certs.Store.PeerServerTLS); ClientTLS(id) must present this
	// node's certificate and accept only member id's
	// (certs.Store.PeerClientTLS). Neither: plaintext, for loopback
	// development, where a message's From is taken at its word.
	ServerTLS *tls.Config
	ClientTLS func(peer uint64) *tls.Config

	// Membership is this node's view of an id: a voter or learner of its
	// applied membership, removed, or unknown. Nil: the address book of
	// SetPeer/RemovePeer stands in, which is close but not exact (a
	// removed member listed in --peers is seeded again at every restart;
	// a member without a peer address is missing), so a server passes
	// its replicated table.
	Membership func(id uint64) MemberStatus

	// SpoolDir receives snapshots as they stream in; files left by an
	// earlier run are removed by New. The server passes a directory under
	// its data dir. "": the system's temporary directory (each file is
	// removed once handled; one a crash cuts short stays).
	SpoolDir string
	// MaxSnapshotBytes caps one inbound snapshot (--max-snapshot-bytes);
	// a longer stream is cut with ResourceExhausted. Default 1 GiB.
	MaxSnapshotBytes int64
	// MaxConcurrentSnapshots bounds inbound snapshot streams at once (and
	// so spool space: this times MaxSnapshotBytes); more are refused with
	// ResourceExhausted. Raft sends a follower one at a time. Default 2.
	MaxConcurrentSnapshots int

	// ClockInterval is the period of clock probes per peer; default 1s.
	ClockInterval time.Duration
	// ClockOffset is added to this node's reading of its own clock, in
	// the clock probes only. TEST ONLY: it lets tests and the harness
	// simulate a skewed node; never set it in production.
	ClockOffset time.Duration
	// Now, when set, is this node's clock in the clock probes in place of
	// the wall clock plus ClockOffset. TEST ONLY: the server's test clock
	// (--test-clock-offset-file), whose offset changes at run time.
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.QueueSize == 0 {
		o.QueueSize = 4096
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = 32 << 20
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
	if o.MaxSnapshotBytes == 0 {
		o.MaxSnapshotBytes = 1 << 30
	}
	if o.MaxConcurrentSnapshots == 0 {
		o.MaxConcurrentSnapshots = 2
	}
	if o.ClockInterval == 0 {
		o.ClockInterval = time.Second
	}
}

// Flow-control windows of every peer connection, both directions, fixed.
// A fixed window turns off gRPC's bandwidth estimator, which otherwise
// answers nearly every DATA frame a connection receives with a PING (and
// a WINDOW_UPDATE) of its own, and the sending side with a PING ack: on a
// leader under single-event writes half of the peer plane's write system
// calls were those pings and acks, not raft messages (docs/performance.md,
// "The peer plane: fixed windows, one write per batch"). The sizes are what the
// estimator grows to for a fast link (its cap is 16 MiB) and hold a full
// batch (BatchMaxBytes, 4 MiB by default) with room, so a window never
// throttles a send on loopback or a LAN; a window update is sent once a
// quarter of the window has been read.
//
// connBufferBytes is gRPC's write buffer per peer connection (frames
// gathered until a flush or until it is full). Its default, 32 KiB, cut a
// batch of appends into a write system call per 32 KiB; a batch is up to
// BatchMaxBytes. It is pooled and released at every flush
// (SharedWriteBuffer), so an idle connection holds none of it. The read
// buffer keeps its default: at 256 KiB the receiver read ahead into
// pooled buffers and a 32 MiB inbound snapshot left 8–9 MiB more live
// heap (TestSnapshotSpooledToDiskNotMemory's bound is 8).
const (
	streamWindowBytes = 8 << 20
	connWindowBytes   = 16 << 20
	connBufferBytes   = 256 << 10
)

// maxMessageBytes bounds one gRPC message either way: a batch, or a
// snapshot chunk. It is the most the receiver holds per stream.
func (o *Options) maxMessageBytes() int { return o.BatchMaxBytes + (8 << 20) }

// Factory returns a server.TransportFactory building this transport.
// Without Options.Membership, the transport's view of who may send is the
// server's replicated membership (server.Inbound.MemberStatus), not the
// address book.
func Factory(opts Options) server.TransportFactory {
	return func(self uint64, lis net.Listener, inbound server.Inbound, reg prometheus.Registerer, log *slog.Logger) (replica.Transport, func(), error) {
		if opts.Membership == nil {
			opts.Membership = InboundMembership(inbound)
		}
		t, err := New(self, inbound, opts, reg, log)
		if err != nil {
			return nil, nil, err
		}
		go t.Serve(lis)
		return t, t.Stop, nil
	}
}

const (
	serviceName     = "tidal.peer.Raft"
	methodMessages  = "Messages"
	methodSnapshots = "Snapshot"
	methodClock     = "Clock"
	methodMember    = "Member"
)

// Transport is the gRPC peer transport. It implements replica.Transport.
type Transport struct {
	self    uint64
	inbound server.Inbound
	opts    Options
	log     *slog.Logger
	metrics *metrics
	grpc    *grpc.Server
	drops   *dropLog

	spoolDir     string
	snapshotSlot chan struct{} // inbound snapshot streams at once
	handoff      sync.Mutex    // one snapshot in memory at a time
	// Snapshot bytes in this transport's hands: read into memory and not
	// yet handed to raft (inbound), and being streamed to a peer
	// (outbound: raft clones its snapshot for every MsgSnap it sends).
	snapInbound, snapOutbound atomic.Int64

	vouches     vouches
	vouchRounds atomic.Int64 // finished rounds (tests wait on it)
	clocks      clocks

	versionsMu   sync.Mutex
	peerVersions map[uint64]versions // what each peer advertised (version.go)

	groupsMu sync.RWMutex
	groups   map[uint64]Handler // the registry (groups.go)

	mu      sync.Mutex
	senders map[uint64]*sender
	removed map[uint64]bool // RemovePeer'd: the address book's "removed"
	stopped bool
	wg      sync.WaitGroup
}

// New creates a transport; call Serve to accept peers.
func New(self uint64, inbound server.Inbound, opts Options, reg prometheus.Registerer, log *slog.Logger) (*Transport, error) {
	opts.setDefaults()
	if (opts.ServerTLS == nil) != (opts.ClientTLS == nil) {
		return nil, errors.New("peer transport: TLS needs both a server and a client configuration, found only one")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Transport{self: self, inbound: inbound, opts: opts, log: log, metrics: newMetrics(reg),
		senders: map[uint64]*sender{}, removed: map[uint64]bool{}, peerVersions: map[uint64]versions{},
		groups:       map[uint64]Handler{LegacyGroup: legacyHandler{inbound}},
		snapshotSlot: make(chan struct{}, opts.MaxConcurrentSnapshots),
		drops:        newDropLog(log, dropLogEvery, dropLogQuiet)}
	t.vouches.m = map[uint64]*vouch{}
	t.clocks.peers = map[uint64][]clockProbe{}
	if err := t.openSpool(); err != nil {
		return nil, err
	}
	sopts := []grpc.ServerOption{
		grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(opts.maxMessageBytes()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: opts.KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.KeepaliveTime, Timeout: opts.KeepaliveTimeout}),
		grpc.StaticStreamWindowSize(streamWindowBytes),
		grpc.StaticConnWindowSize(connWindowBytes),
		grpc.WriteBufferSize(connBufferBytes),
		grpc.SharedWriteBuffer(true),
	}
	if opts.ServerTLS != nil {
		sopts = append(sopts, grpc.Creds(countingCreds{credentials.NewTLS(opts.ServerTLS), t.noteHandshakeFailure}))
	}
	t.grpc = grpc.NewServer(sopts...)
	t.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: methodClock, Handler: t.handleClock},
			{MethodName: methodMember, Handler: t.handleMember},
		},
		Streams: []grpc.StreamDesc{
			{StreamName: methodMessages, Handler: t.serveMessages, ClientStreams: true},
			{StreamName: methodSnapshots, Handler: t.serveSnapshot, ClientStreams: true},
		},
	}, struct{}{})
	return t, nil
}

// openSpool prepares the snapshot spool directory and removes what an
// earlier run left in it (a snapshot cut by a crash is never resumed).
// Without SpoolDir, spool files go to the system's temporary directory,
// where nothing is removed at start: other nodes' files may be there.
func (t *Transport) openSpool() error {
	if t.opts.SpoolDir == "" {
		t.spoolDir = os.TempDir()
		return nil
	}
	t.spoolDir = t.opts.SpoolDir
	if err := os.MkdirAll(t.spoolDir, 0o700); err != nil {
		return fmt.Errorf("peer transport: snapshot spool %s: %w", t.spoolDir, err)
	}
	stale, err := filepath.Glob(filepath.Join(t.spoolDir, spoolPattern))
	if err != nil {
		return err
	}
	for _, f := range stale {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("peer transport: removing stale snapshot spool file: %w", err)
		}
	}
	if len(stale) > 0 {
		t.log.Info("removed snapshot spool files of an earlier run", "dir", t.spoolDir, "files", len(stale))
	}
	return nil
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
	t.drops.stop()
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
	delete(t.removed, id)
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
	t.removed[id] = true
	t.mu.Unlock()
	if ok {
		s.stop()
	}
	t.clocks.forget(id)
	label := strconv.FormatUint(id, 10)
	t.metrics.clockOffset.DeleteLabelValues(label)
	t.metrics.clockUncertainty.DeleteLabelValues(label)
}

// Send queues group 1's messages without blocking: the replica.Transport
// of a node with one raft group (see Group for the others).
func (t *Transport) Send(msgs []replica.Outbound) { t.send(LegacyGroup, msgs) }

// send queues group's messages, each to the node hosting its To.
func (t *Transport) send(group uint64, msgs []replica.Outbound) {
	h := t.handler(group)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		if h == nil {
			// An unregistered group has no raft to tell and no way
			// to resolve its ids.
			t.metrics.dropped.WithLabelValues(strconv.FormatUint(m.To, 10)).Inc()
			t.drops.note("not sending messages of a group with no handler on this node", reasonUnknownGroup, "group", group, "to", m.To)
			continue
		}
		node, ok := h.NodeOf(m.To)
		s := t.senders[node]
		if !ok || s == nil {
			t.metrics.dropped.WithLabelValues(strconv.FormatUint(node, 10)).Inc()
			go h.ReportUnreachable(m.To)
			continue
		}
		if m.Snapshot {
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				s.sendSnapshot(group, m.To, m.Data)
			}()
			continue
		}
		if index, format, withheld := t.withholds(node, m.Data); withheld {
			t.metrics.dropped.WithLabelValues(s.label).Inc()
			t.drops.note("not sending entries a peer cannot read; upgrade it", reasonEntryFormat,
				"peer", node, "group", group, "index", index, "peer_entry_format", format)
			go h.ReportUnreachable(m.To)
			continue
		}
		s.enqueue(outMsg{group: group, to: m.To, data: m.Data})
	}
}

func (t *Transport) handleClock(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	t2 := t.now()
	var req []byte
	if err := dec(&req); err != nil {
		return nil, err
	}
	resp := t.serveClock(t2)
	return &resp, nil
}

func (t *Transport) handleMember(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var req []byte
	if err := dec(&req); err != nil {
		return nil, err
	}
	resp, err := t.serveMember(req)
	if err != nil {
		return nil, err
	}
	return &resp, nil
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

// Unmarshal reuses the destination's capacity: a receive loop that keeps
// one buffer holds one message, however many it reads.
func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("peer codec: expected *[]byte, found %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "tidal-raw" }
