package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// sender owns the connection and the outbound queue to one peer node.
// Messages of every group for that node share both: the queue holds them
// in the order Send was called, and each frame carries what was queued,
// whatever its group.
type sender struct {
	t     *Transport
	id    uint64
	addr  string
	label string
	queue chan outMsg
	// queued is the bytes of the messages in queue (Options.QueueBytes):
	// added by enqueue before the message goes in, taken off by collect
	// once it is out.
	queued atomic.Int64
	// protocol is the peer protocol the current Messages stream's answer
	// advertised; 0 until it arrives (treated as older than
	// groupedProtocol). Written by watch, read by the stream loop and by
	// snapshot sends.
	protocol atomic.Uint32
	ctx      context.Context
	stopF    context.CancelFunc
	done     chan struct{}
	// conn is nil when the address is unusable (logged by run). It is
	// shared by the message stream, clock probes and member questions;
	// snapshots dial their own.
	conn    *grpc.ClientConn
	dialErr error

	// failure bookkeeping for transition logging; sender goroutine only,
	// except drops, which are counted by Send under t.mu.
	failures int
	lastLog  time.Time
}

func newSender(t *Transport, id uint64, addr string) *sender {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sender{t: t, id: id, addr: addr, label: strconv.FormatUint(id, 10), queue: make(chan outMsg, t.opts.QueueSize),
		ctx: ctx, stopF: cancel, done: make(chan struct{})}
	// grpc.NewClient does not connect: it only checks the address.
	s.conn, s.dialErr = s.dial()
	return s
}

func (s *sender) stop() {
	s.stopF()
	<-s.done
}

// enqueue never blocks: a full queue — QueueSize messages, or QueueBytes
// bytes already waiting — means the peer is not keeping up, and raft would
// rather know than wait. The byte bound is checked before adding, so one
// message larger than the bound still goes out to a peer that keeps up.
func (s *sender) enqueue(m outMsg) {
	n := int64(len(m.data))
	if s.queued.Load() < int64(s.t.opts.QueueBytes) {
		s.queued.Add(n)
		select {
		case s.queue <- m:
			s.t.metrics.queueDepth.WithLabelValues(s.label).Set(float64(len(s.queue)))
			return
		default:
			s.queued.Add(-n)
		}
	}
	s.t.metrics.dropped.WithLabelValues(s.label).Inc()
	s.t.reportUnreachable(m.group, m.to)
}

// dequeued takes m's bytes off the queue's byte count.
func (s *sender) dequeued(m outMsg) { s.queued.Add(-int64(len(m.data))) }

// dial makes a connection to the peer: mutual TLS accepting only member
// s.id when the transport is secured, plaintext otherwise.
func (s *sender) dial() (*grpc.ClientConn, error) {
	o := s.t.opts
	creds := insecure.NewCredentials()
	if o.ClientTLS != nil {
		creds = credentials.NewTLS(o.ClientTLS(s.id))
	}
	return grpc.NewClient(s.addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(o.maxMessageBytes()), grpc.MaxCallRecvMsgSize(o.maxMessageBytes())),
		grpc.WithStaticStreamWindowSize(streamWindowBytes),
		grpc.WithStaticConnWindowSize(connWindowBytes),
		grpc.WithWriteBufferSize(connBufferBytes),
		grpc.WithSharedWriteBuffer(true),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: o.KeepaliveTime, Timeout: o.KeepaliveTimeout, PermitWithoutStream: true}),
		// gRPC's default reconnect backoff grows to 120s: a peer restarted
		// after a minute down would stay unreachable for another minute.
		// Raft wants its peers back within an election timeout.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: o.DialBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	)
}

var messagesDesc = &grpc.StreamDesc{StreamName: methodMessages, ClientStreams: true}
var snapshotDesc = &grpc.StreamDesc{StreamName: methodSnapshots, ClientStreams: true}

func (s *sender) run() {
	defer close(s.done)
	if s.dialErr != nil {
		s.t.log.Error("peer address unusable", "peer", s.id, "addr", s.addr, "err", s.dialErr)
		<-s.ctx.Done()
		return
	}
	conn := s.conn
	defer conn.Close()
	clockDone := make(chan struct{})
	go func() {
		defer close(clockDone)
		s.clockLoop()
	}()
	defer func() { <-clockDone }()
	backoff := s.t.opts.DialBackoff
	for s.ctx.Err() == nil {
		err := s.stream(conn)
		if s.ctx.Err() != nil {
			return
		}
		s.noteFailure(err)
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// stream keeps one Messages stream open and feeds it frames until an
// error; the caller reconnects.
func (s *sender) stream(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	ctx = metadata.NewOutgoingContext(ctx, ownVersions().metadata())
	// A new stream may reach another process (a node restarted on
	// another release): what the last one advertised no longer holds.
	s.t.forgetPeerVersions(s.id)
	s.protocol.Store(0)
	st, err := conn.NewStream(ctx, messagesDesc, "/"+serviceName+"/"+methodMessages)
	if err != nil {
		return err
	}
	answered := make(chan struct{})
	go s.watch(st, cancel, answered)
	batch := make([]outMsg, 0, s.t.opts.BatchMaxCount)
	// held keeps other groups' messages collected before the peer's
	// answer says whether it reads grouped frames, so that a new stream
	// does not cost every other group a round of messages.
	var held []outMsg
	defer func() {
		// Held messages die with the stream, as a lost frame's do.
		if len(held) > 0 {
			s.t.metrics.dropped.WithLabelValues(s.label).Add(float64(len(held)))
			s.reportUnreachable(held)
		}
	}()
	for {
		var wake <-chan struct{}
		if len(held) > 0 {
			wake = answered
		}
		var err error
		if batch, err = s.collect(ctx, wake, batch[:0]); err != nil {
			return err
		}
		if s.protocol.Load() < groupedProtocol {
			select {
			case <-answered: // an older peer
				batch = s.withholdGroups(append(held, batch...))
				held = nil
			default:
				batch, held = s.holdGroups(batch, held)
			}
		} else if len(held) > 0 {
			batch = append(held, batch...)
			held = nil
		}
		if len(batch) == 0 {
			continue
		}
		payload := encodeFrame(batch)
		start := time.Now()
		if err := st.SendMsg(&payload); err != nil {
			// The frame is lost; raft will resend what matters.
			s.reportUnreachable(batch)
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause // the peer's reason, from watch
			}
			return err
		}
		s.t.metrics.sendSeconds.WithLabelValues(s.label).Observe(time.Since(start).Seconds())
		s.t.metrics.batchSize.WithLabelValues(s.label).Observe(float64(len(batch)))
		s.noteSuccess()
	}
}

// collect waits for a queued message and appends it to batch with
// whatever else is queued, of any group, in queue order, up to
// BatchMaxCount messages or BatchMaxBytes: one frame's worth. It returns
// batch unchanged when wake is closed first.
func (s *sender) collect(ctx context.Context, wake <-chan struct{}, batch []outMsg) ([]outMsg, error) {
	o := s.t.opts
	select {
	case m := <-s.queue:
		s.dequeued(m)
		batch = append(batch, m)
	case <-wake:
		return batch, nil
	case <-ctx.Done():
		return batch, context.Cause(ctx)
	}
	size := len(batch[0].data)
	for len(batch) < o.BatchMaxCount && size < o.BatchMaxBytes {
		select {
		case m := <-s.queue:
			s.dequeued(m)
			batch = append(batch, m)
			size += len(m.data)
		default:
			s.t.metrics.queueDepth.WithLabelValues(s.label).Set(float64(len(s.queue)))
			return batch, nil
		}
	}
	s.t.metrics.queueDepth.WithLabelValues(s.label).Set(float64(len(s.queue)))
	return batch, nil
}

// holdGroups moves the messages of groups other than 1 from batch to
// held while the peer's answer is awaited, up to one frame's worth
// (BatchMaxCount messages, BatchMaxBytes); beyond that they are withheld.
// Group 1's stay in batch, in order.
func (s *sender) holdGroups(batch, held []outMsg) ([]outMsg, []outMsg) {
	size := 0
	for _, m := range held {
		size += len(m.data)
	}
	kept := batch[:0]
	var over []outMsg
	for _, m := range batch {
		switch {
		case m.group == LegacyGroup:
			kept = append(kept, m)
		case len(held) < s.t.opts.BatchMaxCount && size+len(m.data) <= s.t.opts.BatchMaxBytes:
			held = append(held, m)
			size += len(m.data)
		default:
			over = append(over, m)
		}
	}
	clear(batch[len(kept):])
	s.withholdGroups(over)
	return kept, held
}

// withholdGroups removes from batch, in place, the messages of groups
// other than 1, which a peer that has not advertised groupedProtocol
// cannot route: each is counted, logged on transitions, and its group
// told the replica is unreachable. Group 1's stay, in order.
func (s *sender) withholdGroups(batch []outMsg) []outMsg {
	kept := batch[:0]
	for _, m := range batch {
		if m.group == LegacyGroup {
			kept = append(kept, m)
			continue
		}
		s.t.metrics.dropped.WithLabelValues(s.label).Inc()
		s.t.drops.note("not sending messages of groups other than 1 to a peer of an older protocol; upgrade it", reasonPeerProtocol,
			"peer", s.id, "group", m.group, "peer_protocol", s.protocol.Load())
		s.t.reportUnreachable(m.group, m.to)
	}
	clear(batch[len(kept):]) // drop references to withheld messages' bytes
	return kept
}

// reportUnreachable tells each group with a message in a lost frame that
// the replica it was for is unreachable, once per (group, replica).
func (s *sender) reportUnreachable(batch []outMsg) {
	type target struct{ group, to uint64 }
	seen := make(map[target]bool, 1)
	for _, m := range batch {
		k := target{m.group, m.to}
		if !seen[k] {
			seen[k] = true
			s.t.reportUnreachable(m.group, m.to)
		}
	}
}

// watch reads what the peer says on a Messages stream: its versions
// first (response header), then, if it ends the stream, why. A peer of an
// incompatible protocol, or one saying this node was removed, ends the
// stream with the reason as its cause; a removed node is told so
// (Inbound.ReportRemoved) and stops.
//
// It closes answered once the answer's versions are known (s.protocol
// set) or known never to come.
func (s *sender) watch(st grpc.ClientStream, cancel context.CancelCauseFunc, answered chan<- struct{}) {
	md, err := st.Header()
	defer func() {
		if answered != nil {
			close(answered)
		}
	}()
	if err == nil && len(md.Get(mdProtocol)) > 0 {
		theirs, perr := parseVersions(md)
		if perr == nil {
			if why := compatible(ownVersions(), theirs); why != "" {
				perr = errors.New("peer protocol: " + why)
			}
		}
		if perr != nil {
			cancel(fmt.Errorf("peer %d: %w", s.id, perr))
			return
		}
		s.protocol.Store(theirs.protocol)
		s.t.notePeerVersions(s.id, theirs)
	}
	close(answered)
	answered = nil
	var ack []byte
	err = st.RecvMsg(&ack)
	if err == nil || errors.Is(err, io.EOF) {
		return
	}
	if ids := st.Trailer().Get(mdMemberRemoved); len(ids) > 0 && ids[0] == strconv.FormatUint(s.t.self, 10) {
		s.t.log.Warn("peer says this node was removed from the cluster", "peer", s.id, "err", err)
		s.t.inbound.ReportRemoved(s.id)
	}
	cancel(err)
}

func (s *sender) noteFailure(err error) {
	s.failures++
	s.t.metrics.failures.WithLabelValues(s.label).Inc()
	// First failure, every 100th, and at least every 10s while it lasts:
	// enough to follow an outage without a line per retry.
	if s.failures == 1 || s.failures%100 == 0 || time.Since(s.lastLog) > 10*time.Second {
		s.lastLog = time.Now()
		s.t.log.Warn("cannot send to peer; retrying with backoff", "peer", s.id, "addr", s.addr, "failures", s.failures, "err", err)
	}
}

func (s *sender) noteSuccess() {
	if s.failures > 0 {
		s.t.log.Info("peer reachable again", "peer", s.id, "addr", s.addr, "after_failures", s.failures)
		s.failures = 0
	}
}

// sendSnapshot streams one MsgSnap of group, for its replica to, in
// chunks on its own connection, so a large snapshot never sits in front of
// heartbeats. A group other than 1 travels in the stream's metadata, and
// only to a peer that reads it.
func (s *sender) sendSnapshot(group, to uint64, data []byte) {
	ok := false
	defer func() { s.t.reportSnapshot(group, to, ok) }()
	s.t.snapOutbound.Add(int64(len(data)))
	defer s.t.snapOutbound.Add(-int64(len(data)))
	md := ownVersions().metadata()
	if group != LegacyGroup {
		if p := s.protocol.Load(); p < groupedProtocol {
			s.t.metrics.dropped.WithLabelValues(s.label).Inc()
			s.t.drops.note("not sending a snapshot of a group other than 1 to a peer of an older protocol; upgrade it", reasonPeerProtocol,
				"peer", s.id, "group", group, "peer_protocol", p)
			return
		}
		md.Set(mdGroup, strconv.FormatUint(group, 10))
	}
	conn, err := s.dial()
	if err != nil {
		s.t.log.Error("snapshot send: dial", "peer", s.id, "err", err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, md)
	start := time.Now()
	st, err := conn.NewStream(ctx, snapshotDesc, "/"+serviceName+"/"+methodSnapshots)
	if err != nil {
		s.t.log.Warn("snapshot send: open stream", "peer", s.id, "err", err)
		return
	}
	for off := 0; off < len(data); off += s.t.opts.ChunkSize {
		chunk := data[off:min(off+s.t.opts.ChunkSize, len(data))]
		if err := st.SendMsg(&chunk); err != nil {
			if errors.Is(err, io.EOF) {
				// The peer ended the stream: its status says why (a
				// snapshot over its --max-snapshot-bytes, say).
				var ack []byte
				err = st.RecvMsg(&ack)
			}
			s.t.log.Warn("snapshot send: chunk", "peer", s.id, "offset", off, "bytes", len(data), "err", err)
			return
		}
	}
	if err := st.CloseSend(); err != nil {
		return
	}
	var ack []byte
	if err := st.RecvMsg(&ack); err != nil {
		s.t.log.Warn("snapshot send: peer refused", "peer", s.id, "err", err)
		return
	}
	ok = true
	s.t.metrics.snapshotsSent.WithLabelValues(s.label).Inc()
	s.t.log.Info("snapshot sent", "peer", s.id, "bytes", len(data), "took", time.Since(start))
}

// askMember asks the peer what it knows of id (see membership.go).
func (s *sender) askMember(ctx context.Context, id uint64) (MemberStatus, error) {
	if s.conn == nil {
		return MemberUnknown, s.dialErr
	}
	req := binary.BigEndian.AppendUint64(nil, id)
	var resp []byte
	if err := s.conn.Invoke(ctx, "/"+serviceName+"/"+methodMember, &req, &resp); err != nil {
		return MemberUnknown, err
	}
	if len(resp) != 1 || MemberStatus(resp[0]) > MemberRemoved {
		return MemberUnknown, fmt.Errorf("member answer from member %d: expected one status byte, found %x", s.id, resp)
	}
	return MemberStatus(resp[0]), nil
}
