// Package ingest is tidal-server's gRPC ingest stream (issue 14):
// tidal.v1.Ingest/Stream, a bidirectional stream on which a client sends
// write requests, each carrying one or more events and a client-chosen
// request id, and the node answers each, in completion order, with its
// outcome. Many requests are in flight per stream, so one system call
// carries many writes both ways, where HTTP/1.1 pays a read and a write
// per write.
//
// A request goes through POST /v1/signals' write path (api.Ingest): the
// same validation, stamping, early id check, admission and proposal, so
// it has the same semantics and durability — it is answered ok only once
// its entry is committed (a quorum fsynced it) and applied on this node —
// and the same error vocabulary: status, code, field and Retry-After as
// the HTTP API would answer. The service runs on its own listener
// (--grpc-addr) with the client plane's TLS and roles (docs/
// ARCHITECTURE.md, "Ingest stream").
package ingest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Service and method names on the wire.
const (
	ServiceName = "tidal.v1.Ingest"
	MethodName  = "Stream"
	// FullMethod is what a client opens: /tidal.v1.Ingest/Stream.
	FullMethod = "/" + ServiceName + "/" + MethodName
)

// Options configure the service. Zero values take the defaults noted.
type Options struct {
	// TLS serves the stream over TLS (the client plane's configuration,
	// certs.Store.ServerTLS: client certificates optional, verified when
	// given). Nil: plaintext (loopback only, as the HTTP plane).
	TLS *tls.Config
	// Auth asks every stream for credentials — a client certificate or
	// "authorization: Bearer TOKEN" metadata — naming a role of at least
	// writer; Tokens are the bearer tokens accepted (nil: none).
	Auth   bool
	Tokens *auth.Tokens
	// MaxInflightPerStream bounds the requests of one stream waiting for
	// their answer; a request past it is answered 503 at once (retry
	// after 1 s). Default 1024. The node-wide bounds are the HTTP API's
	// (--max-inflight-writes, --max-write-wait, --max-inflight-bytes),
	// shared.
	MaxInflightPerStream int
	// MaxStreamsPerConn bounds concurrent streams on one connection;
	// default 64.
	MaxStreamsPerConn uint32
	// MaxStreams bounds the streams open on the node, all connections
	// together; one more is refused at open (ResourceExhausted: nothing
	// was taken, retry later). Default 4096, as --max-conns.
	MaxStreams int
	// KeepaliveTime/Timeout: the server pings a silent connection after
	// KeepaliveTime and drops it when no answer comes within
	// KeepaliveTimeout (a client that vanished must not hold its
	// requests' slots). Defaults 30s / 10s.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration

	Logger   *slog.Logger
	Registry prometheus.Registerer // nil: metrics are not registered
}

func (o *Options) setDefaults() {
	if o.MaxInflightPerStream == 0 {
		o.MaxInflightPerStream = 1024
	}
	if o.MaxStreamsPerConn == 0 {
		o.MaxStreamsPerConn = 64
	}
	if o.MaxStreams == 0 {
		o.MaxStreams = 4096
	}
	if o.KeepaliveTime == 0 {
		o.KeepaliveTime = 30 * time.Second
	}
	if o.KeepaliveTimeout == 0 {
		o.KeepaliveTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Service is the ingest stream over one node's write path.
type Service struct {
	in      *api.Ingest
	opts    Options
	grpc    *grpc.Server
	metrics *metrics
	open    atomic.Int64 // streams open (MaxStreams)

	drain     chan struct{} // closed by Shutdown: streams stop taking requests
	drainOnce sync.Once
}

// New builds the service; Serve starts it on a listener.
func New(in *api.Ingest, opts Options) *Service {
	opts.setDefaults()
	s := &Service{in: in, opts: opts, metrics: newMetrics(opts.Registry), drain: make(chan struct{})}
	sopts := []grpc.ServerOption{
		grpc.ForceServerCodec(rawCodec{}),
		// A request over --max-body-bytes is answered 413, as a body
		// would be; gRPC's own limit, past which it ends the whole
		// stream (ResourceExhausted), sits well above it.
		grpc.MaxRecvMsgSize(recvLimit(in.MaxRequestBytes())),
		grpc.MaxConcurrentStreams(opts.MaxStreamsPerConn),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: opts.KeepaliveTime, Timeout: opts.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	s.grpc = grpc.NewServer(sopts...)
	s.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: ServiceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{StreamName: MethodName, Handler: s.serveStream, ServerStreams: true, ClientStreams: true},
		},
	}, struct{}{})
	return s
}

// recvLimit is gRPC's bound on one message: twice the request limit and
// 64 KiB, so that a request somewhat over the limit gets its own 413.
func recvLimit(maxRequest int64) int {
	return int(min(2*maxRequest+64<<10, 1<<30))
}

// Serve accepts connections on lis until Shutdown.
func (s *Service) Serve(lis net.Listener) error { return s.grpc.Serve(lis) }

// Shutdown stops taking requests: every stream answers what it has in
// flight, refuses what it has received but not started (503: certainly
// not applied) and ends with Unavailable. Streams still open when ctx
// ends are cut (their pending requests' outcome is then unknown to the
// client).
func (s *Service) Shutdown(ctx context.Context) {
	s.drainOnce.Do(func() { close(s.drain) })
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// authenticate applies the client plane's rules to a stream: a bearer
// token in the "authorization" metadata, else the verified client
// certificate; the writer role at least.
func (s *Service) authenticate(ctx context.Context) error {
	if !s.opts.Auth {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var cs *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cs = &info.State
		}
	}
	pr, err := auth.Authenticate(md.Get("authorization"), cs, s.opts.Tokens)
	if err != nil {
		s.metrics.refusedStreams.WithLabelValues("unauthenticated").Inc()
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if !pr.Role.Allows(auth.Writer) {
		s.metrics.refusedStreams.WithLabelValues("permission_denied").Inc()
		return status.Error(codes.PermissionDenied, fmt.Sprintf("%s needs role %s; %s %q has role %s", FullMethod, auth.Writer, pr.Via, pr.Name, pr.Role))
	}
	return nil
}

// RefusedAtOpenTrailer marks, in the trailer, a stream the node refused
// before reading any request from it (credentials, too many streams), so
// that a client can tell "nothing was taken" from a stream that ended
// with the same status code after requests were read (gRPC's own
// ResourceExhausted for an oversized message, say).
const RefusedAtOpenTrailer = "tidal-refused-at-open"

var refusedAtOpen = metadata.Pairs(RefusedAtOpenTrailer, "1")

// serveStream is one stream. A receiver goroutine reads requests and
// starts each in its own goroutine (so they reach the proposal path
// together and are packed into shared raft entries); each request's
// goroutine writes its own answer (SendMsg under a lock only queues it for
// gRPC's writer, which coalesces answers sent together into one system
// call). A write's path thus crosses no goroutine of this service besides
// its own (issue 14: one hand-off in and one out fewer than a dispatch
// loop and a sender goroutine cost).
func (s *Service) serveStream(_ any, ss grpc.ServerStream) error {
	if err := s.authenticate(ss.Context()); err != nil {
		ss.SetTrailer(refusedAtOpen)
		return err
	}
	if n := s.open.Add(1); n > int64(s.opts.MaxStreams) {
		s.open.Add(-1)
		s.metrics.refusedStreams.WithLabelValues("max_streams").Inc()
		ss.SetTrailer(refusedAtOpen)
		return status.Error(codes.ResourceExhausted, fmt.Sprintf("%d ingest streams open on this node, the most it takes; nothing was taken, retry later or write over HTTP", s.opts.MaxStreams))
	}
	defer s.open.Add(-1)
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	ctx := ss.Context()

	st := &streamState{ss: ss}
	recvDone := make(chan error, 1)
	go func() { recvDone <- s.receive(ctx, st) }()

	var endErr error
	select {
	case err := <-recvDone:
		if err != nil && !errors.Is(err, io.EOF) {
			endErr = err
		}
	case <-s.drain:
		// Requests received from now on are not started (certainly not
		// applied); those started are answered below.
		st.stop()
		endErr = status.Error(codes.Unavailable, "node is shutting down; every request answered before this was taken or refused as said")
	}
	st.wg.Wait()
	st.closeSend()
	if endErr != nil {
		if _, ok := status.FromError(endErr); ok {
			return endErr
		}
		return status.Error(codes.Canceled, endErr.Error())
	}
	return nil
}

// streamState is what a stream's receiver and its requests' goroutines
// share.
type streamState struct {
	ss       grpc.ServerStream
	inflight atomic.Int64
	wg       sync.WaitGroup

	mu      sync.Mutex // guards stopped
	stopped bool       // no request is started any more

	// sendMu serializes SendMsg and guards the fields below. It is not mu:
	// a send blocked by flow control (a client slow to read its answers)
	// must not stop the receiver from reading and starting requests.
	sendMu sync.Mutex
	closed bool // the handler is returning: nothing may be sent
	broken bool // a send failed: the stream is gone
}

// start registers a request about to be started, unless the stream
// stopped taking them.
func (st *streamState) start() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stopped {
		return false
	}
	st.wg.Add(1)
	return true
}

func (st *streamState) stop() {
	st.mu.Lock()
	st.stopped = true
	st.mu.Unlock()
}

// send writes one answer. After a failed send the stream is gone and
// answers are dropped, so no request blocks on it.
func (st *streamState) send(b []byte) {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if st.closed || st.broken {
		return
	}
	if st.ss.SendMsg(&b) != nil {
		st.broken = true
	}
}

// closeSend is called once every started request has answered.
func (st *streamState) closeSend() {
	st.stop()
	st.sendMu.Lock()
	st.closed = true
	st.sendMu.Unlock()
}

// receive reads requests until the stream ends, a request's header does
// not read, or the stream stops taking requests, and starts each.
func (s *Service) receive(ctx context.Context, st *streamState) error {
	for {
		var msg []byte
		if err := st.ss.RecvMsg(&msg); err != nil {
			return err
		}
		if err := s.dispatch(ctx, msg, st); err != nil {
			st.stop()
			return err
		}
	}
}

// dispatch starts one request, or refuses it at once. A request whose
// header does not read ends the stream (InvalidArgument): there is no
// request id to answer to.
func (s *Service) dispatch(ctx context.Context, msg []byte, st *streamState) error {
	req, err := requestID(msg)
	if err != nil {
		s.metrics.requests.WithLabelValues("malformed").Inc()
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if !st.start() {
		// Received while shutting down: refused, certainly not applied
		// (dropped unanswered if the stream already ended).
		st.send(s.refuse(req, &api.Error{Status: 503, Code: api.CodeUnavailable, RetryAfter: 1,
			Message: "node is shutting down; this request was not taken"}, "shutdown"))
		return nil
	}
	if n := st.inflight.Add(1); n > int64(s.opts.MaxInflightPerStream) {
		st.inflight.Add(-1)
		st.send(s.refuse(req, &api.Error{Status: 503, Code: api.CodeUnavailable, RetryAfter: 1,
			Message: fmt.Sprintf("%d requests in flight on this stream (the most it takes); wait for answers before sending more", s.opts.MaxInflightPerStream)}, "inflight_stream"))
		st.wg.Done()
		return nil
	}
	s.metrics.inflight.Inc()
	go func() {
		defer st.wg.Done()
		defer st.inflight.Add(-1)
		defer s.metrics.inflight.Dec()
		st.send(s.handle(ctx, req, msg))
	}()
	return nil
}

// handle is one request's life: admission, decoding, the write.
func (s *Service) handle(ctx context.Context, req uint64, msg []byte) []byte {
	start := time.Now()
	if limit := s.in.MaxRequestBytes(); int64(len(msg)) > limit {
		return s.answerErr(req, s.in.TooLarge("request", "request of %d bytes exceeds %d (--max-body-bytes)", len(msg), limit), start)
	}
	release, err := s.in.ChargeBytes(int64(len(msg)))
	if err != nil {
		return s.answerErr(req, err, start)
	}
	defer release()
	if err := s.in.Admit(); err != nil {
		return s.answerErr(req, err, start)
	}
	events, err := decodeEvents(msg, s.in)
	if err != nil {
		return s.answerErr(req, err, start)
	}
	ack, err := s.in.WriteSignals(ctx, events)
	if err != nil {
		return s.answerErr(req, err, start)
	}
	s.metrics.requests.WithLabelValues("ok").Inc()
	s.metrics.latencyOK.Observe(time.Since(start).Seconds())
	return encodeOK(req, ack.Index, ack.Term, ack.Node, ack.Duplicates)
}

func (s *Service) answerErr(req uint64, err error, start time.Time) []byte {
	ae, reason := s.in.Outcome(err)
	s.metrics.latencyErr.Observe(time.Since(start).Seconds())
	return s.refuse(req, ae, reason)
}

// refuse encodes an error answer with the leader hint, counting it.
func (s *Service) refuse(req uint64, ae *api.Error, shedReason string) []byte {
	s.metrics.requests.WithLabelValues(strconv.Itoa(ae.Status)).Inc()
	if shedReason != "" {
		s.metrics.shed.WithLabelValues(shedReason).Inc()
	}
	r := refusal{status: ae.Status, retryAfter: ae.RetryAfter, code: ae.Code, field: ae.Field, message: ae.Message}
	if ae.Status == 503 || ae.Status == 504 {
		r.leader, r.leaderAddr = s.in.LeaderHint()
	}
	return encodeRefusal(req, r)
}

type metrics struct {
	streams        prometheus.Gauge
	inflight       prometheus.Gauge
	requests       *prometheus.CounterVec
	shed           *prometheus.CounterVec
	refusedStreams *prometheus.CounterVec
	latencyOK      prometheus.Observer
	latencyErr     prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tidal_ingest_request_duration_seconds", Help: "gRPC ingest stream: time from a request's arrival to its answer, by outcome (ok, error).",
		Buckets: prometheus.ExponentialBuckets(100e-6, 2, 19),
	}, []string{"outcome"})
	m := &metrics{
		streams:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_ingest_streams", Help: "gRPC ingest streams open."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_ingest_requests_inflight", Help: "gRPC ingest requests started and not yet answered, all streams."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_ingest_requests_total",
			Help: "gRPC ingest requests answered, by outcome: ok, or the HTTP status the answer carries (400, 409, 413, 503, 504, ...); malformed for unreadable headers."}, []string{"outcome"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_ingest_shed_total",
			Help: "gRPC ingest requests refused by admission (503 + retry-after), by rule: inflight_stream, inflight_writes, expected_wait, inflight_bytes, clock, shutdown."}, []string{"reason"}),
		refusedStreams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_ingest_streams_refused_total",
			Help: "gRPC ingest streams refused at open: unauthenticated, permission_denied or max_streams."}, []string{"reason"}),
		latencyOK:  latency.WithLabelValues("ok"),
		latencyErr: latency.WithLabelValues("error"),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.inflight, m.requests, m.shed, m.refusedStreams, latency)
	}
	return m
}
