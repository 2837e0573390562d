package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// The gRPC ingest stream (tidal.v1.Ingest/Stream, a node's --grpc-addr):
// many writes in flight on one stream, so that one system call carries
// many of them. A write sent this way is exactly a POST /v1/signals: the
// same validation, the same acknowledgement (committed and applied), the
// same errors (an *APIError with the HTTP status and code the node would
// have answered), the same retries and RequestError.Indefinite.
//
// The messages are a hand-written binary encoding (the server's is in
// tidal-server/ingest/wire.go; this package keeps its own copy, as it
// keeps its own JSON structs):
//
//	Request  = u8 1 | u64 request id | u32 n | n × (u8 flags | u64 entity
//	           | u16 len | id | u16 len | signal | [f64 weight] | [i64 ts])
//	Response = u8 1 | u64 request id | u16 status | ok: u64 index | u64 term
//	           | u64 node | u32 duplicates; else: u16 retry-after s | u64 leader
//	           | u16 len | code | u16 len | field | u32 len | message
//	           | u16 len | leader client address
//
// A Response with request id 0 is a notice about the stream (requests are
// numbered from 1).
const (
	ingestMethod  = "/tidal.v1.Ingest/Stream"
	ingestOp      = "gRPC " + ingestMethod
	ingestVersion = 1
)

// ingestCodec passes the hand-encoded messages through gRPC.
type ingestCodec struct{}

func (ingestCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("ingest codec: expected *[]byte, found %T", v)
	}
	return *b, nil
}

func (ingestCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("ingest codec: expected *[]byte, found %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (ingestCodec) Name() string { return "tidal-ingest" }

var ingestDesc = &grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// IngestStream writes signals over one gRPC connection and one stream to a
// node's ingest address. It is safe for concurrent use: every caller's
// write is in flight on the same stream, answered as it completes. A
// broken stream is replaced at the next write.
type IngestStream struct {
	addr    string
	conn    *grpc.ClientConn
	cfg     *Client // the options: TLS, token, retries, backoff, timeout
	nextReq atomic.Uint64

	mu     sync.Mutex
	cur    *ingestConn
	closed bool
}

// ingestConn is one open stream.
type ingestConn struct {
	cs     grpc.ClientStream
	cancel context.CancelFunc
	sendMu sync.Mutex // gRPC allows one sender at a time

	mu      sync.Mutex
	pending map[uint64]chan ingestAnswer
	done    chan struct{} // closed when the stream ended
	err     error         // why, once done
	// definite says the stream ended before the server took any request
	// (refused at open: credentials): its requests certainly did nothing.
	definite bool
	// endedBy is the node's streamEndTrailer: the node ended the stream
	// itself after answering every request it started, so a request
	// without an answer was not started. "" otherwise.
	endedBy string
	// draining: the node said the stream reached its age; new writes go
	// on a new stream while this one delivers its answers.
	draining atomic.Bool
}

type ingestAnswer struct {
	ack Ack
	err *APIError
}

// NewIngestStream returns a streaming writer to the gRPC ingest address
// of a node ("127.0.0.1:7080"; a scheme, if given, is dropped). It takes
// the Client options: WithTLS and WithToken as over HTTP (the token goes
// in the "authorization" metadata), WithRetries, WithBackoff, WithTimeout
// (per attempt). The connection is made on the first write.
func NewIngestStream(addr string, opts ...Option) (*IngestStream, error) {
	c := &Client{retries: defaultRetries, backoff: defaultBackoff, maxBackoff: defaultMaxBackoff, timeout: defaultTimeout}
	for _, o := range opts {
		o(c)
	}
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "https://"), "http://")
	addr = strings.TrimRight(addr, "/")
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls.Clone())
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(ingestCodec{})),
		// A connection that went silent (a paused node, a blackholed
		// link) must be noticed, not waited on by every write in flight.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("tidal: %s: %w", ingestOp, err)
	}
	return &IngestStream{addr: addr, conn: conn, cfg: c}, nil
}

// Addr is the ingest address written to.
func (s *IngestStream) Addr() string { return s.addr }

// Close ends the stream and the connection; writes in flight fail.
func (s *IngestStream) Close() error {
	s.mu.Lock()
	s.closed = true
	cur := s.cur
	s.cur = nil
	s.mu.Unlock()
	if cur != nil {
		cur.cancel()
	}
	return s.conn.Close()
}

var errIngestClosed = errors.New("ingest stream closed")

// stream returns the open stream, opening one if there is none or the
// last one ended.
func (s *IngestStream) stream() (*ingestConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errIngestClosed
	}
	if s.cur != nil && !s.cur.draining.Load() {
		select {
		case <-s.cur.done:
		default:
			return s.cur, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if s.cfg.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.cfg.token)
	}
	cs, err := s.conn.NewStream(ctx, ingestDesc, ingestMethod)
	if err != nil {
		cancel()
		return nil, err
	}
	ic := &ingestConn{cs: cs, cancel: cancel, pending: map[uint64]chan ingestAnswer{}, done: make(chan struct{})}
	go ic.receive()
	s.cur = ic
	return ic, nil
}

// receive delivers answers to their writers until the stream ends.
func (ic *ingestConn) receive() {
	var buf []byte
	answered := false
	for {
		if err := ic.cs.RecvMsg(&buf); err != nil {
			trailer := ic.cs.Trailer()
			refused := len(trailer.Get(refusedAtOpenTrailer)) > 0
			var endedBy string
			if v := trailer.Get(streamEndTrailer); len(v) == 1 {
				endedBy = v[0]
			}
			ic.mu.Lock()
			ic.err, ic.definite = streamError(err), refused && !answered && isRefusedAtOpen(err)
			ic.endedBy = endedBy
			ic.mu.Unlock()
			close(ic.done)
			ic.cancel()
			return
		}
		answered = true
		req, ans, err := decodeIngestAnswer(buf)
		if err != nil {
			ic.mu.Lock()
			ic.err = err
			ic.mu.Unlock()
			close(ic.done)
			ic.cancel()
			return
		}
		if req == 0 {
			// A notice about the stream itself, not an answer.
			if ans.err != nil && ans.err.Code == codeStreamMaxAge {
				ic.draining.Store(true)
			}
			continue
		}
		ic.mu.Lock()
		ch := ic.pending[req]
		delete(ic.pending, req)
		ic.mu.Unlock()
		if ch != nil {
			ch <- ans
		}
	}
}

// refusedAtOpenTrailer is the trailer key with which a node marks a
// stream it refused before reading any request (ingest.RefusedAtOpenTrailer).
const refusedAtOpenTrailer = "tidal-refused-at-open"

// streamEndTrailer is the trailer key with which a node marks a stream
// it ended itself once every request it started was answered — value
// max-age, credentials or shutdown (ingest.StreamEndTrailer) — so that a
// request left without an answer was certainly not started.
const streamEndTrailer = "tidal-stream-end"

// codeStreamMaxAge is the code of the node's notice that a stream reached
// its age (--ingest-stream-max-age), and of the refusal of a request that
// came after it stopped taking them (ingest.CodeStreamMaxAge).
const codeStreamMaxAge = "stream_max_age"

// errStreamAged: the request was not taken because its stream reached its
// age; it is sent again on a new stream at once, not counted as a retry.
var errStreamAged = errors.New("the ingest stream reached its maximum age before taking the request")

// maxAgedResends bounds the free resends of one write after stream ages,
// so that a node with a tiny --ingest-stream-max-age cannot keep a write
// going round for ever.
const maxAgedResends = 8

// unanswered is the outcome of a request the stream ended without
// answering, by how the stream ended.
func (ic *ingestConn) unanswered(sendErr error) (retry, maybeApplied bool, err error) {
	ic.mu.Lock()
	serr, definite, endedBy := ic.err, ic.definite, ic.endedBy
	ic.mu.Unlock()
	if serr == nil {
		serr = sendErr
	}
	ae := apiError(serr)
	switch {
	case ae != nil && definite:
		// Refused at open: credentials (final) or too many streams (retry).
		return ae.Status == http.StatusServiceUnavailable, false, ae
	case endedBy == "":
		// Cut (a broken connection, a killed node): the node may have
		// taken the request.
		return true, true, fmt.Errorf("stream ended before the answer: %w", serr)
	case ae != nil && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden):
		// Its credentials were taken away: final, and not taken.
		return false, false, ae
	case endedBy == "max-age":
		return true, false, fmt.Errorf("%w: %w", errStreamAged, serr)
	}
	return true, false, fmt.Errorf("stream ended (%s) before the request was taken: %w", endedBy, serr)
}

// isRefusedAtOpen: the server refused the stream itself (credentials, or
// too many streams open), before reading any request; only with the
// trailer mark, since gRPC ends streams with the same codes on its own.
func isRefusedAtOpen(err error) bool {
	c := grpcstatus.Code(err)
	return c == codes.Unauthenticated || c == codes.PermissionDenied || c == codes.ResourceExhausted
}

// streamError turns a stream's end into the error its pending writes get:
// refused credentials as the HTTP API's 401 / 403.
func streamError(err error) error {
	st, ok := grpcstatus.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return &APIError{Op: ingestOp, Status: http.StatusUnauthorized, Code: CodeUnauthenticated, Message: st.Message()}
	case codes.PermissionDenied:
		return &APIError{Op: ingestOp, Status: http.StatusForbidden, Code: CodePermissionDenied, Message: st.Message()}
	case codes.ResourceExhausted:
		// Too many streams open on the node (or a message past gRPC's
		// limit, which only ends a stream after it was read).
		return &APIError{Op: ingestOp, Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: st.Message(), RetryAfter: time.Second}
	}
	return err
}

// WriteSignals writes a batch of events on the stream, as Client's
// WriteSignals does over HTTP: applied all or none, retried with the same
// event ids (a retry is recognised and counted in Ack.Duplicates), and
// answered once committed and applied on the node.
func (s *IngestStream) WriteSignals(ctx context.Context, events []Event) (Ack, error) {
	body, err := encodeIngestEvents(events)
	if err != nil {
		return Ack{}, &RequestError{Op: ingestOp, Attempts: 0, Err: err}
	}
	var (
		attempts   int
		aged       int // resends after stream ages
		indefinite bool
		last       error
	)
	fail := func(err error) (Ack, error) {
		return Ack{Attempts: attempts}, &RequestError{Op: ingestOp, Attempts: attempts, Indefinite: indefinite, Err: err}
	}
	for {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return fail(last)
			}
			return fail(err)
		}
		attempts++
		ack, retry, maybeApplied, err := s.attempt(ctx, body)
		indefinite = indefinite || maybeApplied
		if err == nil {
			ack.Attempts = attempts
			return ack, nil
		}
		last = err
		if errors.Is(err, errStreamAged) && aged < maxAgedResends {
			// Not taken, and the node asked for a new stream: send it
			// there now, as the same attempt.
			aged++
			attempts--
			continue
		}
		if !retry || attempts > s.cfg.retries || ctx.Err() != nil {
			return fail(err)
		}
		if !s.cfg.pauseBeforeRetry(ctx, attempts, err) {
			return fail(err)
		}
	}
}

// attempt sends the request once and waits for its answer.
func (s *IngestStream) attempt(ctx context.Context, body []byte) (ack Ack, retry, maybeApplied bool, err error) {
	ic, err := s.stream()
	if err != nil {
		if errors.Is(err, errIngestClosed) {
			return Ack{}, false, false, err
		}
		if te := s.tlsProblem(err); te != nil {
			return Ack{}, false, false, te
		}
		return Ack{}, true, false, err // no stream: nothing was sent
	}
	req := s.nextReq.Add(1)
	msg := make([]byte, 1+8, 1+8+len(body))
	msg[0] = ingestVersion
	binary.LittleEndian.PutUint64(msg[1:], req)
	msg = append(msg, body...)

	ch := make(chan ingestAnswer, 1)
	ic.mu.Lock()
	ic.pending[req] = ch
	ic.mu.Unlock()
	forget := func() {
		ic.mu.Lock()
		delete(ic.pending, req)
		ic.mu.Unlock()
	}
	ic.sendMu.Lock()
	err = ic.cs.SendMsg(&msg)
	ic.sendMu.Unlock()
	if err != nil {
		forget()
		// The stream ended; the server may have read the request before.
		<-ic.done
		select {
		case a := <-ch:
			return a.outcome()
		default:
		}
		retry, maybeApplied, err := ic.unanswered(err)
		return Ack{}, retry, maybeApplied, err
	}

	var timeout <-chan time.Time
	if s.cfg.timeout > 0 {
		t := time.NewTimer(s.cfg.timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case a := <-ch:
		return a.outcome()
	case <-ic.done:
		forget()
		// An answer read before the stream ended is in ch by now (the
		// receiver delivers it before closing done): it decides.
		select {
		case a := <-ch:
			return a.outcome()
		default:
		}
		retry, maybeApplied, err := ic.unanswered(nil)
		return Ack{}, retry, maybeApplied, err
	case <-ctx.Done():
		forget()
		return Ack{}, false, true, ctx.Err()
	case <-timeout:
		forget()
		return Ack{}, true, true, fmt.Errorf("%w after %s", errAttemptTimeout, s.cfg.timeout)
	}
}

// outcome is what an answer means for the attempt that got it.
func (a ingestAnswer) outcome() (ack Ack, retry, maybeApplied bool, err error) {
	if a.err == nil {
		return a.ack, false, false, nil
	}
	switch st := a.err.Status; {
	case st == http.StatusServiceUnavailable && a.err.Code == codeStreamMaxAge:
		// Came after the stream stopped taking requests for its age.
		return Ack{}, true, false, fmt.Errorf("%w: %w", errStreamAged, a.err)
	case st == http.StatusServiceUnavailable:
		return Ack{}, true, false, a.err
	case st == http.StatusGatewayTimeout:
		return Ack{}, true, true, a.err
	case st >= 500:
		return Ack{}, false, true, a.err
	default:
		return Ack{}, false, false, a.err
	}
}

// tlsProblem recognises a failed TLS set-up in a gRPC error.
func (s *IngestStream) tlsProblem(err error) error {
	if st, ok := grpcstatus.FromError(err); ok && strings.Contains(st.Message(), "authentication handshake failed") {
		return &TLSError{Addr: s.addr, Msg: "the TLS handshake with the node's ingest address failed (CA, host name, or one side without TLS?)", Err: err}
	}
	return nil
}

// encodeIngestEvents encodes the events part of a request (everything
// after the request id).
func encodeIngestEvents(events []Event) ([]byte, error) {
	size := 4
	for _, e := range events {
		size += 1 + 8 + 2 + len(e.ID) + 2 + len(e.Signal) + 16
	}
	b := make([]byte, 0, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(events)))
	for i, e := range events {
		if len(e.ID) > math.MaxUint16 || len(e.Signal) > math.MaxUint16 {
			return nil, fmt.Errorf("events[%d]: id or signal longer than %d bytes", i, math.MaxUint16)
		}
		var flags byte
		if e.Weight != 0 {
			flags |= 1
		}
		if e.TS != 0 {
			flags |= 2
		}
		b = append(b, flags)
		b = binary.LittleEndian.AppendUint64(b, e.Entity)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e.ID)))
		b = append(b, e.ID...)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e.Signal)))
		b = append(b, e.Signal...)
		if e.Weight != 0 {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.Weight))
		}
		if e.TS != 0 {
			b = binary.LittleEndian.AppendUint64(b, uint64(e.TS))
		}
	}
	return b, nil
}

var errShortAnswer = errors.New("ingest answer truncated")

// decodeIngestAnswer reads one Response.
func decodeIngestAnswer(b []byte) (uint64, ingestAnswer, error) {
	if len(b) < 1+8+2 || b[0] != ingestVersion {
		return 0, ingestAnswer{}, fmt.Errorf("ingest answer: unreadable header (%d bytes)", len(b))
	}
	req := binary.LittleEndian.Uint64(b[1:])
	st := int(binary.LittleEndian.Uint16(b[9:]))
	b = b[11:]
	if st == http.StatusOK {
		if len(b) < 8+8+8+4 {
			return req, ingestAnswer{}, errShortAnswer
		}
		return req, ingestAnswer{ack: Ack{
			Seq:        binary.LittleEndian.Uint64(b),
			Term:       binary.LittleEndian.Uint64(b[8:]),
			Node:       binary.LittleEndian.Uint64(b[16:]),
			Duplicates: int(binary.LittleEndian.Uint32(b[24:])),
		}}, nil
	}
	if len(b) < 2+8 {
		return req, ingestAnswer{}, errShortAnswer
	}
	ae := &APIError{Op: ingestOp, Status: st, RetryAfter: time.Duration(binary.LittleEndian.Uint16(b)) * time.Second}
	b = b[10:]
	var ok bool
	var code, field, msg, addr string
	if code, b, ok = lenStr(b, 2); !ok {
		return req, ingestAnswer{}, errShortAnswer
	}
	if field, b, ok = lenStr(b, 2); !ok {
		return req, ingestAnswer{}, errShortAnswer
	}
	if msg, b, ok = lenStr(b, 4); !ok {
		return req, ingestAnswer{}, errShortAnswer
	}
	if addr, _, ok = lenStr(b, 2); !ok {
		return req, ingestAnswer{}, errShortAnswer
	}
	ae.Code, ae.Field, ae.Message = code, field, msg
	if addr != "" {
		ae.Message += " (leader: " + addr + ")"
	}
	return req, ingestAnswer{err: ae}, nil
}

func lenStr(b []byte, width int) (string, []byte, bool) {
	if len(b) < width {
		return "", nil, false
	}
	var n int
	if width == 2 {
		n = int(binary.LittleEndian.Uint16(b))
	} else {
		n = int(binary.LittleEndian.Uint32(b))
	}
	b = b[width:]
	if len(b) < n {
		return "", nil, false
	}
	return string(b[:n]), b[n:], true
}
