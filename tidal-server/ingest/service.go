// Package ingest is tidal-server's gRPC ingest stream:
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
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	// MaxStreamAge ends a stream about this long after it opened (less up
	// to a tenth, drawn per stream, so streams opened together do not all
	// reconnect together), as gRPC's MaxConnectionAge ends connections: a
	// stream outlives no credential, CA or node setting by more than this.
	// Default 30m (--ingest-stream-max-age); negative: no bound.
	MaxStreamAge time.Duration
	// MaxStreamAgeGrace is how long a stream that reached its age keeps
	// taking requests after telling the client so (an answer with request
	// id 0 and code stream_max_age), for those already on the wire; then
	// it stops taking them, answers those in flight and ends. Default 10s.
	MaxStreamAgeGrace time.Duration
	// VerifyClientCert verifies a client certificate chain as the client
	// plane's TLS does now (certs.Store.VerifyClient: the CA bundle in
	// use, the current time). Recheck ends the streams opened with a
	// certificate that no longer verifies. Nil: certificates are checked
	// for expiry only.
	VerifyClientCert func(chain []*x509.Certificate) error

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
	if o.MaxStreamAge == 0 {
		o.MaxStreamAge = DefaultMaxStreamAge
	}
	if o.MaxStreamAgeGrace <= 0 {
		o.MaxStreamAgeGrace = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// DefaultMaxStreamAge is Options.MaxStreamAge's default.
const DefaultMaxStreamAge = 30 * time.Minute

// CodeStreamMaxAge is the code of the notice (request id 0) a stream
// sends when it reached its age, and of the refusal of a request that
// came after its grace: open a new stream and send it there.
const CodeStreamMaxAge = "stream_max_age"

// StreamEndTrailer is the trailer with which the node ends a stream on
// its own — value max-age, credentials or shutdown — once every request
// it started has been answered: a request the client sent on it and got
// no answer for was certainly not started, so it can be sent again (with
// the same ids in any case) on a new stream.
const StreamEndTrailer = "tidal-stream-end"

// Service is the ingest stream over one node's write path.
type Service struct {
	in      *api.Ingest
	opts    Options
	grpc    *grpc.Server
	metrics *metrics
	open    atomic.Int64 // streams open (MaxStreams)

	mu      sync.Mutex
	streams map[*streamState]struct{} // open streams, for Recheck

	drain     chan struct{} // closed by Shutdown: streams stop taking requests
	drainOnce sync.Once
}

// New builds the service; Serve starts it on a listener.
func New(in *api.Ingest, opts Options) *Service {
	opts.setDefaults()
	s := &Service{in: in, opts: opts, metrics: newMetrics(opts.Registry), drain: make(chan struct{}), streams: map[*streamState]struct{}{}}
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

// credential is what a stream authenticated with at open, kept so that
// Recheck can ask again whether it is still good.
type credential struct {
	authorization []string              // the authorization metadata; empty: by certificate
	verified      [][]*x509.Certificate // the handshake's verified chains (certificate)
	chain         []*x509.Certificate   // the certificates the client presented
	principal     auth.Principal
}

// authenticate applies the client plane's rules to a stream: a bearer
// token in the "authorization" metadata, else the verified client
// certificate; the writer role at least.
func (s *Service) authenticate(ctx context.Context) (credential, error) {
	if !s.opts.Auth {
		return credential{}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var cs *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cs = &info.State
		}
	}
	c := credential{authorization: md.Get("authorization")}
	if cs != nil {
		c.verified, c.chain = cs.VerifiedChains, cs.PeerCertificates
	}
	pr, err := auth.Authenticate(c.authorization, cs, s.opts.Tokens)
	if err != nil {
		s.metrics.refusedStreams.WithLabelValues("unauthenticated").Inc()
		return c, status.Error(codes.Unauthenticated, err.Error())
	}
	c.principal = pr
	if !pr.Role.Allows(auth.Writer) {
		s.metrics.refusedStreams.WithLabelValues("permission_denied").Inc()
		return c, status.Error(codes.PermissionDenied, fmt.Sprintf("%s needs role %s; %s %q has role %s", FullMethod, auth.Writer, pr.Via, pr.Name, pr.Role))
	}
	return c, nil
}

// byCertificate: the stream authenticated with its client certificate.
func (c credential) byCertificate() bool {
	return c.principal.Via == auth.ViaCert && len(c.verified) > 0
}

// recheck asks again whether a stream's credential is good, as a stream
// opened now with it would be asked: nil, or the status that ends the
// stream, naming the credential and why.
func (s *Service) recheck(c credential, now time.Time) error {
	if !s.opts.Auth {
		return nil
	}
	var cs *tls.ConnectionState
	if c.byCertificate() {
		leaf := c.verified[0][0]
		if now.After(leaf.NotAfter) {
			return status.Error(codes.Unauthenticated, fmt.Sprintf("the client certificate of %q this stream opened with expired at %s; open a new stream with a valid one (nothing sent after this was taken)",
				c.principal.Name, leaf.NotAfter.UTC().Format(time.RFC3339)))
		}
		if v := s.opts.VerifyClientCert; v != nil {
			if err := v(c.chain); err != nil {
				return status.Error(codes.Unauthenticated, fmt.Sprintf("the client certificate of %q this stream opened with no longer verifies against the node's CA bundle: %v (nothing sent after this was taken)",
					c.principal.Name, err))
			}
		}
		cs = &tls.ConnectionState{VerifiedChains: c.verified}
	}
	pr, err := auth.Authenticate(c.authorization, cs, s.opts.Tokens)
	if err != nil {
		return status.Error(codes.Unauthenticated, fmt.Sprintf("the credentials of %s %q this stream opened with are no longer valid: %v (nothing sent after this was taken)",
			c.principal.Via, c.principal.Name, err))
	}
	if !pr.Role.Allows(auth.Writer) {
		return status.Error(codes.PermissionDenied, fmt.Sprintf("%s %q this stream opened with now has role %s; %s needs role %s (nothing sent after this was taken)",
			pr.Via, pr.Name, pr.Role, FullMethod, auth.Writer))
	}
	return nil
}

// Recheck asks every open stream's credential again (the node calls it
// after reloading its tokens file and certificates, on SIGHUP) and ends
// the streams whose credential is no longer good: a token removed or
// lowered below writer, a client certificate that expired or no longer
// verifies against the CA bundle. Such a stream stops taking requests at
// once (those still arriving are answered 401 / 403, not taken), answers
// those in flight — taken while the credential was good — and ends
// Unauthenticated or PermissionDenied with the reason. It returns the
// number of streams ended.
func (s *Service) Recheck() int {
	s.mu.Lock()
	open := make([]*streamState, 0, len(s.streams))
	for st := range s.streams {
		open = append(open, st)
	}
	s.mu.Unlock()
	now := time.Now()
	ended := map[codes.Code]int{}
	var first string
	for _, st := range open {
		if err := s.recheck(st.cred, now); err != nil && s.end(st, err, "credentials") {
			ended[status.Code(err)]++
			if first == "" {
				first = status.Convert(err).Message()
			}
		}
	}
	if n := ended[codes.Unauthenticated] + ended[codes.PermissionDenied]; n > 0 {
		s.opts.Logger.Warn("ingest streams ended: their credentials are no longer valid",
			"unauthenticated", ended[codes.Unauthenticated], "permission_denied", ended[codes.PermissionDenied], "first", first)
		return n
	}
	return 0
}

// end stops st taking requests and has its handler end it with err once
// those in flight are answered; reason is the StreamEndTrailer's value.
// It returns false if st was already ending.
func (s *Service) end(st *streamState, err error, reason string) bool {
	ended := false
	st.endOnce.Do(func() {
		ended = true
		ae := &api.Error{Status: 401, Code: auth.CodeUnauthenticated, Message: status.Convert(err).Message()}
		label := "unauthenticated"
		if status.Code(err) == codes.PermissionDenied {
			ae.Status, ae.Code, label = 403, auth.CodePermissionDenied, "permission_denied"
		}
		st.stopWith(ae, "") // not admission: no shed reason
		st.endErr, st.endReason = err, reason
		s.metrics.endedStreams.WithLabelValues(label).Inc()
		close(st.ended)
	})
	return ended
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
// its own (one hand-off in and one out fewer than a dispatch
// loop and a sender goroutine cost).
func (s *Service) serveStream(_ any, ss grpc.ServerStream) error {
	cred, err := s.authenticate(ss.Context())
	if err != nil {
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

	st := &streamState{ss: ss, cred: cred, ended: make(chan struct{})}
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, st)
		s.mu.Unlock()
	}()
	recvDone := make(chan error, 1)
	go func() { recvDone <- s.receive(ctx, st) }()

	// A certificate's expiry ends the stream at that moment: no SIGHUP
	// marks it.
	var expired <-chan time.Time
	if cred.byCertificate() {
		t := time.NewTimer(time.Until(cred.verified[0][0].NotAfter) + time.Millisecond)
		defer t.Stop()
		expired = t.C
	}
	var aged, graceOver <-chan time.Time
	if age := s.opts.MaxStreamAge; age > 0 {
		t := time.NewTimer(age - rand.N(age/10+1))
		defer t.Stop()
		aged = t.C
	}

	var endErr error
	endReason := ""
	for done := false; !done; {
		select {
		case err := <-recvDone:
			if err != nil && !errors.Is(err, io.EOF) {
				endErr = err
			}
			done = true
		case <-s.drain:
			// Requests received from now on are not started (certainly not
			// applied); those started are answered below.
			st.stopWith(&api.Error{Status: 503, Code: api.CodeUnavailable, RetryAfter: 1,
				Message: "node is shutting down; this request was not taken"}, "shutdown")
			endErr = status.Error(codes.Unavailable, "node is shutting down; every request answered before this was taken or refused as said")
			endReason, done = "shutdown", true
		case <-expired:
			expired = nil
			if err := s.recheck(cred, time.Now()); err != nil {
				s.end(st, err, "credentials")
			}
		case <-st.ended:
			endErr, endReason, done = st.endErr, st.endReason, true
		case <-aged:
			// Tell the client to open a new stream; keep taking what it
			// sent before it heard, for the grace.
			aged = nil
			st.send(s.notice(CodeStreamMaxAge, fmt.Sprintf("this stream reached its maximum age (--ingest-stream-max-age %v): send new requests on a new stream; this one ends once those in flight are answered", s.opts.MaxStreamAge)))
			t := time.NewTimer(s.opts.MaxStreamAgeGrace)
			defer t.Stop()
			graceOver = t.C
		case <-graceOver:
			st.stopWith(&api.Error{Status: 503, Code: CodeStreamMaxAge, RetryAfter: 0,
				Message: fmt.Sprintf("this stream reached its maximum age (--ingest-stream-max-age %v) and takes no more requests; this one was not taken: send it on a new stream", s.opts.MaxStreamAge)}, "")
			s.metrics.endedStreams.WithLabelValues("max_age").Inc()
			endErr = status.Error(codes.Unavailable, fmt.Sprintf("ingest stream reached its maximum age (--ingest-stream-max-age %v); every request answered before this was taken or refused as said, open a new stream", s.opts.MaxStreamAge))
			endReason, done = "max-age", true
		}
	}
	st.wg.Wait()
	st.closeSend()
	if endReason != "" {
		ss.SetTrailer(metadata.Pairs(StreamEndTrailer, endReason))
	}
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
	cred     credential
	inflight atomic.Int64
	wg       sync.WaitGroup

	mu      sync.Mutex // guards stopped, refusal, refusalReason
	stopped bool       // no request is started any more
	// refusal answers a request that arrives once stopped; refusalReason
	// is its tidal_ingest_shed_total reason ("" for none).
	refusal       *api.Error
	refusalReason string

	// Service.end: the stream is to end with endErr (trailer endReason).
	endOnce   sync.Once
	ended     chan struct{}
	endErr    error
	endReason string

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

// stopWith stops the stream taking requests; those that arrive from now
// on are answered ae (the first stop's answer stays).
func (st *streamState) stopWith(ae *api.Error, reason string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.refusal == nil {
		st.refusal, st.refusalReason = ae, reason
	}
	st.stopped = true
}

// refusalFor is the answer to a request that arrived once stopped.
func (st *streamState) refusalFor() (*api.Error, string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.refusal == nil {
		return &api.Error{Status: 503, Code: api.CodeUnavailable, RetryAfter: 1, Message: "this stream takes no more requests; this one was not taken"}, ""
	}
	return st.refusal, st.refusalReason
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
		// Received once the stream stopped taking requests (shutdown,
		// credentials no longer good, its age): refused, certainly not
		// applied (dropped unanswered if the stream already ended).
		ae, reason := st.refusalFor()
		st.send(s.refuse(req, ae, reason))
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

// notice is an answer to no request (request id 0): news about the
// stream itself. Clients number requests from 1, and one that does not
// know a notice finds no request waiting for id 0 and drops it.
func (s *Service) notice(code, msg string) []byte {
	return encodeRefusal(0, refusal{status: 503, code: code, message: msg})
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
	endedStreams   *prometheus.CounterVec
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
		endedStreams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_ingest_streams_ended_total",
			Help: "gRPC ingest streams the node ended while open: unauthenticated or permission_denied (credentials no longer good after a reload, or a certificate expired), max_age (--ingest-stream-max-age)."}, []string{"reason"}),
		latencyOK:  latency.WithLabelValues("ok"),
		latencyErr: latency.WithLabelValues("error"),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.inflight, m.requests, m.shed, m.refusedStreams, m.endedStreams, latency)
	}
	return m
}
