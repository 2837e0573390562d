// Package api is tidal-server's HTTP surface: the client API, the admin
// endpoints, health and metrics. It validates everything a client sends
// before anything reaches the log — a batch with one bad event is refused
// whole — and maps every internal outcome to the status codes DESIGN.md
// fixes. It holds no state of its own besides the in-flight bound (and a
// never-written vector store used only to validate request vectors).
package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// Options bound what one request may ask for, and what all requests
// together may hold. Zero values take the defaults.
type Options struct {
	MaxBodyBytes      int64         // default 8 MiB; larger bodies get 413
	MaxBatch          int           // events per POST /v1/signals; default 10000; more gets 413
	MaxInflightWrites int           // writes waiting for commit on this node; default 4096; more gets 503
	WriteTimeout      time.Duration // default 5s; past it the outcome is unknown (504)
	ReadTimeout       time.Duration // default 5s
	MaxK              int           // default 1000

	// SkipEarlyCheck leaves out the id pre-check before proposing (a
	// batch reusing a remembered id with another payload is then refused
	// by apply instead, with the same 409 on every node, its log position
	// consumed): the pre-check repeats apply's id lookups, a cache miss
	// or two per event on the write path. Apply is
	// authoritative either way. --skip-early-id-check.
	SkipEarlyCheck bool

	// MaxInflightBytes bounds the request bodies held at once, charged
	// before they are read (admission.go); default 64 MiB, raised to
	// MaxBodyBytes if below it. A body that does not fit gets 503.
	MaxInflightBytes int64
	// BodyReadTimeout bounds the time to receive one body; default 30s
	// (the server passes --http-read-timeout).
	BodyReadTimeout time.Duration
	// MinBodyRate is the least average rate, in bytes a second, a body
	// must keep once BodyRateGrace has passed; default 64 KiB/s,
	// negative = no minimum. Slower bodies are cut with 408.
	MinBodyRate   int64
	BodyRateGrace time.Duration // default 5s
	// MaxWriteWait sheds (503) a write whose expected wait for commit is
	// longer; default WriteTimeout/2, at most WriteTimeout.
	MaxWriteWait time.Duration
	// MaxClockSkew is how far ahead of this node's clock an event's ts
	// may be; default 1 minute. Further ahead is 400 events[i].ts.
	MaxClockSkew time.Duration
	// ClockOffset is added to this node's clock for stamping, the skew
	// check and default read times. TEST ONLY: it simulates a node whose
	// clock is off (--test-clock-offset).
	ClockOffset time.Duration
	// ClockHealthy, when set, is asked before every write and every read
	// evaluated at this node's clock (no ?at=): false refuses them with
	// 503 and fails /readyz, all giving the reason.
	ClockHealthy func() (ok bool, reason string)

	Logger   *slog.Logger
	Registry *prometheus.Registry // serves /metrics and receives the HTTP metrics; nil = a private one
	Now      func() time.Time     // wall clock: stamping, skew, read times; default time.Now

	// MaxMemory bounds the node's memory for embedding writes (memory.go):
	// one that would take it past the bound gets 503 + Retry-After; 0 =
	// no bound. Signals and reads are never refused by it. Needs a
	// Backend that is a MemoryReporter.
	MaxMemory int64

	// monotonic times the write queue; tests substitute their own.
	monotonic func() time.Time
	// memory reads the node's memory in place of the Backend's
	// MemoryReporter; tests substitute their own.
	memory func() Memory
}

func (o *Options) setDefaults() {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 8 << 20
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 10000
	}
	if o.MaxInflightWrites == 0 {
		o.MaxInflightWrites = 4096
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 5 * time.Second
	}
	if o.MaxK == 0 {
		o.MaxK = 1000
	}
	if o.MaxInflightBytes == 0 {
		o.MaxInflightBytes = 64 << 20
	}
	if o.BodyReadTimeout == 0 {
		o.BodyReadTimeout = 30 * time.Second
	}
	if o.MinBodyRate == 0 {
		o.MinBodyRate = 64 << 10
	}
	if o.BodyRateGrace == 0 {
		o.BodyRateGrace = 5 * time.Second
	}
	if o.MaxWriteWait == 0 || o.MaxWriteWait > o.WriteTimeout {
		o.MaxWriteWait = o.WriteTimeout / 2
	}
	if o.MaxClockSkew == 0 {
		o.MaxClockSkew = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxInflightBytes < o.MaxBodyBytes {
		// A body the budget could never hold would be refused forever.
		o.Logger.Warn("max inflight bytes below max body bytes; raised to it", "max_inflight_bytes", o.MaxInflightBytes, "max_body_bytes", o.MaxBodyBytes)
		o.MaxInflightBytes = o.MaxBodyBytes
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.monotonic == nil {
		o.monotonic = time.Now
	}
}

type handler struct {
	b       Backend
	opts    Options
	schema  ledger.Schema
	writes  *writeQueue
	bytes   *byteBudget
	mem     *memoryGate // nil: no memory bound
	metrics *httpMetrics
	// noDeadlines makes the warning that bodies get no read deadline once.
	noDeadlines sync.Once
	// vectorCheck validates request vectors against the schema's
	// dimension. It is never written: the vectors package validates
	// through a Store, and one made per request would allocate a store
	// each time.
	vectorCheck *vectors.Store
	// plantedWrites counts valid POST /v1/signals for the tidalbugs
	// defect InternalErrorOnValidWrite; unused in a normal build.
	plantedWrites atomic.Uint64
}

// metricsPattern is the Prometheus route, served by promhttp.
const metricsPattern = "GET /metrics"

// apiRoute is one route of the API and its handler.
type apiRoute struct {
	pattern string
	fn      func(http.ResponseWriter, *http.Request) error
}

// routes is the API's route table (besides GET /metrics and the "/"
// catch-all that answers 404 and 405).
func (h *handler) routes() []apiRoute {
	return []apiRoute{
		{"POST /v1/signals", h.postSignals},
		{"PUT /v1/entities/{entity}/embedding", h.putEmbedding},
		{"GET /v1/entities/{entity}", h.getEntity},
		{"POST /v1/query/nearest", h.nearest},
		{"GET /v1/top", h.top},
		{"GET /v1/events/{id...}", h.eventLocation},
		{"GET /v1/audit/events", h.auditEvents},
		{"GET /v1/audit/digest", h.digest},
		{"GET /cluster/status", h.status},
		{"POST /admin/members", h.addMember},
		{"DELETE /admin/members/{id}", h.removeMember},
		{"POST /admin/transfer-leader", h.transferLeader},
		{"POST /admin/snapshot", h.snapshot},
		{"GET /admin/backup", h.backup},
		{"GET /healthz", h.healthz},
		{"GET /readyz", h.readyz},
	}
}

// Patterns are the ServeMux patterns of every route New serves (the "/"
// catch-all aside): what the client plane's authorization policy
// (auth.DefaultRules) must give a rule each, which a test of the server
// package checks.
func Patterns() []string {
	var out []string
	for _, r := range (&handler{}).routes() {
		out = append(out, r.pattern)
	}
	return append(out, metricsPattern)
}

// New returns the HTTP handler serving every route over b.
func New(b Backend, opts Options) http.Handler {
	h, _ := NewWithIngest(b, opts)
	return h
}

// NewWithIngest returns the HTTP handler and the write path for the gRPC
// ingest stream (package ingest) over b, sharing one admission: the
// writes in flight, the expected-wait estimate and the byte budget count
// both.
func NewWithIngest(b Backend, opts Options) (http.Handler, *Ingest) {
	opts.setDefaults()
	schema := b.Schema()
	h := &handler{b: b, opts: opts, schema: schema,
		writes:      &writeQueue{limit: opts.MaxInflightWrites, maxWait: opts.MaxWriteWait, now: opts.monotonic},
		bytes:       &byteBudget{limit: opts.MaxInflightBytes},
		vectorCheck: vectors.New(schema.EmbeddingDim)}
	h.metrics = newHTTPMetrics(opts.Registry, latencyBuckets(opts), h.writes)
	if opts.MaxMemory > 0 {
		read := opts.memory
		if mr, ok := b.(MemoryReporter); ok && read == nil {
			read = mr.Memory
		}
		if read == nil {
			// A bound nothing can measure against would admit everything.
			panic("api: Options.MaxMemory set over a Backend that does not report its memory (MemoryReporter)")
		}
		h.mem = &memoryGate{limit: opts.MaxMemory, read: read, now: opts.monotonic}
	}

	mux := http.NewServeMux()
	route := func(pattern string, fn func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, h.instrument(pattern, fn))
	}
	for _, r := range h.routes() {
		route(r.pattern, r.fn)
	}
	mux.Handle(metricsPattern, promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{}))
	// The catch-all pattern shadows ServeMux's own 405, so a known path
	// asked with the wrong method is told which methods it has.
	route("/", func(w http.ResponseWriter, r *http.Request) error {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
			probe := &http.Request{Method: m, URL: r.URL, Host: r.Host}
			if _, pattern := mux.Handler(probe); pattern != "/" && pattern != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			return &Error{Status: http.StatusMethodNotAllowed, Code: CodeMethod,
				Message: fmt.Sprintf("%s %s: expected method %s", r.Method, r.URL.Path, strings.Join(allow, " or "))}
		}
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no route %s %s; see README for the API", r.Method, r.URL.Path)}
	})
	return mux, &Ingest{h: h}
}

// instrument records latency by route and code, and turns a returned
// error into the JSON error body. A handler that returns nil has written
// its own response.
func (h *handler) instrument(route string, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			p := recover()
			if p != nil && p != http.ErrAbortHandler {
				// Nothing a client sends may take the node down; a panic
				// here is our bug, reported as 500 and logged loudly.
				h.opts.Logger.Error("handler panic", "route", route, "panic", p)
				if !sw.wrote {
					writeError(sw, fmt.Errorf("internal error: %v", p))
					p = nil
				} else {
					sw.status = http.StatusInternalServerError
				}
			}
			h.metrics.latency.WithLabelValues(route, strconv.Itoa(sw.status)).Observe(time.Since(start).Seconds())
			if p != nil {
				// The status and part of the body are already out: finishing
				// the response normally would pass a truncated body off as
				// complete. Aborting resets the stream (HTTP/2) or closes
				// the connection mid-body (HTTP/1.1), so the client sees
				// the failure.
				panic(http.ErrAbortHandler)
			}
		}()
		if err := fn(sw, r); err != nil {
			ae := writeError(sw, err)
			if ae.Status == http.StatusServiceUnavailable {
				h.metrics.rejected.WithLabelValues(ae.Code).Inc()
				if reason := shedReason(err); reason != "" {
					h.metrics.shed.WithLabelValues(reason).Inc()
				}
			}
			if ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusGatewayTimeout {
				h.opts.Logger.Error("request failed", "route", route, "status", ae.Status, "err", ae.Message)
			}
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status = code
		s.wrote = true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// admitWrite runs the write admission rules that need no body: the clock
// gate and the queue's look-ahead. They run before the body is read, so a
// shed write costs the node no more than its headers.
func (h *handler) admitWrite(w http.ResponseWriter, r *http.Request) error {
	err := h.checkClock()
	if err == nil {
		err = h.writes.check()
	}
	if err != nil {
		refuseUnread(w, r)
	}
	return err
}

// propose takes a place in the write queue, runs write under the write
// timeout, and tells the queue how long commit took. reqCtx is the
// request's (HTTP) or the stream's (gRPC) context.
func (h *handler) propose(reqCtx context.Context, write func(ctx context.Context) (WriteAck, error)) (WriteAck, error) {
	ticket, err := h.writes.admit()
	if err != nil {
		return WriteAck{}, err
	}
	ctx, cancel := context.WithTimeout(reqCtx, h.opts.WriteTimeout)
	defer cancel()
	ack, err := write(ctx)
	// A write refused before it was proposed (503) says nothing about how
	// long commit takes, and one whose client went away only that it
	// takes at least this long.
	ticket.done(reqCtx.Err() == nil && (err == nil || toAPIError(err).Status != http.StatusServiceUnavailable))
	return ack, err
}

// writeSignals is the write path of a decoded batch, shared by POST
// /v1/signals and the gRPC ingest stream (Ingest): stamp and bound the
// timestamps, the early id check, then admission and the proposal.
func (h *handler) writeSignals(ctx context.Context, events []ledger.Event) (WriteAck, error) {
	// Stamp here, before the entry is logged, so that apply never reads a
	// clock and every replica folds the same timestamp.
	if err := h.stampAndBound(events, h.now()); err != nil {
		return WriteAck{}, err
	}
	if !h.opts.SkipEarlyCheck {
		if err := h.b.CheckSignals(events); err != nil {
			return WriteAck{}, err
		}
	}
	return h.propose(ctx, func(ctx context.Context) (WriteAck, error) { return h.b.WriteSignals(ctx, events) })
}

func writeAckHeaders(w http.ResponseWriter, ack WriteAck) {
	w.Header().Set("X-Tidal-Seq", strconv.FormatUint(ack.Index, 10))
	w.Header().Set("X-Tidal-Term", strconv.FormatUint(ack.Term, 10))
	w.Header().Set("X-Tidal-Node", strconv.FormatUint(ack.Node, 10))
	w.Header().Set("X-Tidal-Duplicates", strconv.Itoa(ack.Duplicates))
	// 204 carries no body, ever: HTTP/2 resets a 204 that has one.
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) postSignals(w http.ResponseWriter, r *http.Request) error {
	if err := h.admitWrite(w, r); err != nil {
		return err
	}
	body, release, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	defer release()
	events, err := DecodeSignals(body, h.schema, h.opts.MaxBatch)
	if err != nil {
		return err
	}
	if bugs.Active(bugs.InternalErrorOnValidWrite) && h.plantedWrites.Add(1)%20 == 0 {
		return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "planted defect: valid write refused without proposing it"}
	}
	ack, err := h.writeSignals(r.Context(), events)
	if err != nil {
		return err
	}
	writeAckHeaders(w, ack)
	return nil
}

func parseEntity(r *http.Request) (uint64, error) {
	s := r.PathValue("entity")
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, invalid("entity", "expected an unsigned 64-bit integer in the path, found %q", s)
	}
	return id, nil
}

func (h *handler) putEmbedding(w http.ResponseWriter, r *http.Request) error {
	entity, err := parseEntity(r)
	if err != nil {
		return err
	}
	if err := h.admitWrite(w, r); err != nil {
		return err
	}
	// The memory bound, before the body is read: what the write will
	// hold is at least its vector, more when the body says so.
	if err := h.mem.admit(max(r.ContentLength, int64(h.schema.EmbeddingDim)*4)); err != nil {
		refuseUnread(w, r)
		return err
	}
	body, mt, release, err := h.readBodyOf(w, r, true)
	if err != nil {
		return err
	}
	defer release()
	var id []byte
	var vec []float32
	hasID := false
	if mt == mediaBinary {
		// The id travels in the query: ?id=<write id>.
		q := r.URL.Query()
		_, hasID = q["id"]
		id = []byte(q.Get("id"))
		vec, err = binaryVector(body, h.schema.EmbeddingDim)
	} else {
		err = decodeBody(body, func(d *decoder, name []byte) error {
			switch string(name) {
			case "id":
				hasID = true
				id, err = d.str("id")
			case "vector":
				vec, err = d.vector("vector", h.schema.EmbeddingDim)
			default:
				return d.unknown(name, "id, vector")
			}
			return err
		})
	}
	if err != nil {
		return err
	}
	if !hasID || len(id) == 0 {
		return invalid("id", "required: a write id, reused on retries")
	}
	if len(id) > ledger.MaxIDLen {
		return invalid("id", "%d bytes; at most %d", len(id), ledger.MaxIDLen)
	}
	if vec == nil {
		return invalid("vector", "required: an array of %d numbers", h.schema.EmbeddingDim)
	}
	if fe := h.vectorCheck.Validate(vec); fe != nil {
		return invalid(fe.Field, "%s", fe.Message)
	}
	ack, err := h.propose(r.Context(), func(ctx context.Context) (WriteAck, error) {
		return h.b.PutEmbedding(ctx, entity, string(id), vec)
	})
	if err != nil {
		return err
	}
	writeAckHeaders(w, ack)
	return nil
}

// consistency parses ?consistency=, default linearizable, and runs the
// barrier it asks for.
func (h *handler) barrier(r *http.Request, def string) (context.Context, context.CancelFunc, error) {
	c := r.URL.Query().Get("consistency")
	if c == "" {
		c = def
	}
	if c != "linearizable" && c != "local" {
		return nil, nil, invalid("consistency", "expected linearizable or local, found %q", c)
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.ReadTimeout)
	if err := h.b.Barrier(ctx, c == "linearizable"); err != nil {
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, nil, errDeadline
		}
		return nil, nil, err
	}
	return ctx, cancel, nil
}

// readTime is the time a read evaluates decay and windows at: ?at= when
// given, else this node's clock — refused (503, as writes are) while the
// clock is out of bounds.
func (h *handler) readTime(r *http.Request) (int64, error) {
	s := r.URL.Query().Get("at")
	if s == "" {
		now, err := h.readNow()
		if err != nil {
			return 0, err
		}
		return now.UnixMilli(), nil
	}
	at, err := strconv.ParseInt(s, 10, 64)
	if err != nil || at <= 0 {
		return 0, invalid("at", "expected unix milliseconds, found %q", s)
	}
	return at, nil
}

type signalJSON struct {
	Count     uint64            `json:"count"`
	WeightSum float64           `json:"weight_sum"`
	Score     float64           `json:"score"`
	Windows   map[string]uint64 `json:"windows"`
}

type entityJSON struct {
	Entity       uint64                `json:"entity"`
	AppliedIndex uint64                `json:"applied_index"`
	At           int64                 `json:"at"`
	Signals      map[string]signalJSON `json:"signals"`
	Embedding    []float32             `json:"embedding,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func (h *handler) getEntity(w http.ResponseWriter, r *http.Request) error {
	entity, err := parseEntity(r)
	if err != nil {
		return err
	}
	at, err := h.readTime(r)
	if err != nil {
		return err
	}
	_, cancel, err := h.barrier(r, "linearizable")
	if err != nil {
		return err
	}
	defer cancel()
	out := entityJSON{Entity: entity, At: at, Signals: map[string]signalJSON{}}
	h.b.Read(func(l *ledger.Ledger, v *vectors.Store, applied uint64) {
		out.AppliedIndex = applied
		view := l.Get(entity, at)
		for name, sv := range view.Signals {
			out.Signals[name] = signalJSON{Count: sv.Count, WeightSum: sv.WeightSum, Score: sv.Score, Windows: sv.Windows}
		}
		if vec, ok := v.Get(entity); ok {
			out.Embedding = vec
		}
	})
	return writeJSON(w, http.StatusOK, out)
}

type matchJSON struct {
	Entity uint64  `json:"entity"`
	Score  float32 `json:"score"`
}

func (h *handler) checkK(k int64) error {
	if k < 1 || k > int64(h.opts.MaxK) {
		return invalid("k", "expected 1..%d, found %d", h.opts.MaxK, k)
	}
	return nil
}

func (h *handler) nearest(w http.ResponseWriter, r *http.Request) error {
	body, mt, release, err := h.readBodyOf(w, r, true)
	if err != nil {
		return err
	}
	defer release()
	var vec []float32
	k := 10
	if mt == mediaBinary {
		// k travels in the query: ?k=<n>.
		if s := r.URL.Query().Get("k"); s != "" {
			n, perr := strconv.ParseInt(s, 10, 64)
			if perr != nil {
				return invalid("k", "expected an integer in the query, found %q", s)
			}
			if err := h.checkK(n); err != nil {
				return err
			}
			k = int(n)
		}
		vec, err = binaryVector(body, h.schema.EmbeddingDim)
	} else {
		err = decodeBody(body, func(d *decoder, name []byte) error {
			switch string(name) {
			case "vector":
				vec, err = d.vector("vector", h.schema.EmbeddingDim)
			case "k":
				var n int64
				if n, err = d.int64("k", "an integer"); err == nil {
					err = h.checkK(n)
					k = int(n)
				}
			default:
				return d.unknown(name, "vector, k")
			}
			return err
		})
	}
	if err != nil {
		return err
	}
	if vec == nil {
		return invalid("vector", "required: an array of %d numbers", h.schema.EmbeddingDim)
	}
	if fe := h.vectorCheck.Validate(vec); fe != nil {
		return invalid(fe.Field, "%s", fe.Message)
	}
	_, cancel, err := h.barrier(r, "linearizable")
	if err != nil {
		return err
	}
	defer cancel()
	// Pin under the backend's read lock (after the barrier, so the answer
	// is linearizable), scan outside it: a scan of 100,000 vectors takes
	// tens of milliseconds, and apply needs the write lock. The view keeps
	// the answer as of the pin while writes go on (vectors.QueryView).
	var view *vectors.QueryView
	h.b.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) {
		view = v.PinQuery()
	})
	// Released as soon as the scan ends, not after the response is written:
	// while pinned, every overwrite of a slot it holds copies the old
	// vector, and a slow client must not stretch that.
	matches, err := func() ([]vectors.Match, error) {
		defer view.Release()
		return view.Nearest(vec, k)
	}()
	if err != nil {
		return invalid("vector", "%v", err)
	}
	out := struct {
		Results []matchJSON `json:"results"`
	}{Results: make([]matchJSON, len(matches))}
	for i, m := range matches {
		out.Results[i] = matchJSON{Entity: m.Entity, Score: m.Score}
	}
	return writeJSON(w, http.StatusOK, out)
}

func (h *handler) top(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	signal := q.Get("signal")
	if signal == "" {
		return invalid("signal", "required, one of the schema's signals")
	}
	st, ok := h.schema.Signal(signal)
	if !ok {
		return invalid("signal", "unknown signal %q", signal)
	}
	window := q.Get("window")
	if window != "" {
		found := false
		for _, win := range st.Windows {
			found = found || win.Name == window
		}
		if !found {
			return invalid("window", "signal %q has no window %q", signal, window)
		}
	}
	k := 10
	if s := q.Get("k"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return invalid("k", "expected an integer, found %q", s)
		}
		k = n
	}
	if err := h.checkK(int64(k)); err != nil {
		return err
	}
	at, err := h.readTime(r)
	if err != nil {
		return err
	}
	_, cancel, err := h.barrier(r, "linearizable")
	if err != nil {
		return err
	}
	defer cancel()
	var ranked []ledger.Ranked
	h.b.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) {
		ranked, err = l.Top(signal, window, k, at)
	})
	if err != nil {
		return invalid("window", "%v", err)
	}
	type rankedJSON struct {
		Entity uint64  `json:"entity"`
		Value  float64 `json:"value"`
	}
	out := struct {
		Signal  string       `json:"signal"`
		Window  string       `json:"window"`
		Results []rankedJSON `json:"results"`
	}{Signal: signal, Window: window, Results: make([]rankedJSON, len(ranked))}
	for i, rk := range ranked {
		out.Results[i] = rankedJSON{Entity: rk.Entity, Value: rk.Value}
	}
	return writeJSON(w, http.StatusOK, out)
}

type locationJSON struct {
	ID     string `json:"id"`
	Index  uint64 `json:"index"`
	Term   uint64 `json:"term"`
	Entity uint64 `json:"entity"`
	Signal string `json:"signal"`
}

func (h *handler) eventLocation(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := checkEventID(id); err != nil {
		return err
	}
	_, cancel, err := h.barrier(r, "linearizable")
	if err != nil {
		return err
	}
	defer cancel()
	var loc ledger.Location
	var ok bool
	h.b.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) { loc, ok = l.Lookup(id) })
	if !ok {
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Field: "id", Message: fmt.Sprintf("event id %q is not in this node's id memory", id)}
	}
	return writeJSON(w, http.StatusOK, locationJSON{ID: loc.ID, Index: loc.Index, Term: loc.Term, Entity: loc.Entity, Signal: loc.Signal})
}

// checkEventID refuses, as 400, a path id no event can have (the rules
// of ledger.Schema.ValidateEvent), so that 404 means only "not
// remembered".
func checkEventID(id string) error {
	if id == "" || len(id) > ledger.MaxIDLen {
		return invalid("id", "expected 1..%d bytes, found %d", ledger.MaxIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return invalid("id", "expected visible ASCII, found byte 0x%02x at offset %d", c, i)
		}
	}
	return nil
}

func (h *handler) auditEvents(w http.ResponseWriter, r *http.Request) error {
	_, cancel, err := h.barrier(r, "local")
	if err != nil {
		return err
	}
	defer cancel()
	// Capture under the read lock (a copy of the id memory's chunk
	// headers), walk and stream after it: neither the walk, O(ids), nor a
	// slow reader may hold up apply. The capture is the id memory at one
	// applied index, however long the stream takes.
	var audit *ledger.AuditLog
	h.b.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) {
		audit = l.CaptureAudit()
	})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	if err := audit.Each(func(loc ledger.Location) error {
		return enc.Encode(locationJSON{ID: loc.ID, Index: loc.Index, Term: loc.Term, Entity: loc.Entity, Signal: loc.Signal})
	}); err != nil {
		return nil // client went away; the status is already sent
	}
	bw.Flush()
	return nil
}

func (h *handler) digest(w http.ResponseWriter, r *http.Request) error {
	_, cancel, err := h.barrier(r, "local")
	if err != nil {
		return err
	}
	defer cancel()
	applied, d := h.b.Digest()
	return writeJSON(w, http.StatusOK, map[string]any{"applied_index": applied, "digest": d})
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, statusWithMemory{Status: h.b.Status(), Memory: h.memory()})
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) error {
	if err := h.b.Status().Error; err != "" && strings.Contains(err, "fenced") {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err}
	}
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "ok\n")
	return nil
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) error {
	if err := h.b.Ready(); err != nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
	}
	if err := h.checkClock(); err != nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
	}
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "ready\n")
	return nil
}

type httpMetrics struct {
	latency       *prometheus.HistogramVec
	rejected      *prometheus.CounterVec
	shed          *prometheus.CounterVec
	bodyCut       *prometheus.CounterVec
	inflightBytes prometheus.Gauge
	futureEvents  prometheus.Counter
}

// latencyBuckets double from 100µs until they pass twice the longest a
// request may legitimately take (write, read or body timeout) and at
// least 30s: a request that ends at its deadline must land in a finite
// bucket, or the histogram cannot show what the timeouts cost.
func latencyBuckets(o Options) []float64 {
	longest := max(o.WriteTimeout, o.ReadTimeout, o.BodyReadTimeout)
	top := max(30.0, 2*longest.Seconds())
	b := []float64{100e-6}
	for b[len(b)-1] < top {
		b = append(b, 2*b[len(b)-1])
	}
	return b
}

func newHTTPMetrics(reg prometheus.Registerer, buckets []float64, writes *writeQueue) *httpMetrics {
	m := &httpMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tidal_http_request_duration_seconds", Help: "HTTP request latency by route and status code.",
			Buckets: buckets,
		}, []string{"route", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidal_http_rejected_total", Help: "Requests shed with 503, by error code.",
		}, []string{"code"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidal_http_shed_total", Help: "Requests refused by admission (503 + Retry-After), by rule: inflight_writes, expected_wait, inflight_bytes, clock, memory.",
		}, []string{"reason"}),
		bodyCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidal_http_body_cut_total", Help: "Request bodies cut with 408: deadline (--http-read-timeout) or rate (--min-body-rate).",
		}, []string{"reason"}),
		inflightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tidal_http_inflight_bytes", Help: "Request body bytes charged to the in-flight budget (--max-inflight-bytes).",
		}),
		futureEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tidal_http_future_events_rejected_total", Help: "Write batches refused because an event's ts was more than --max-clock-skew ahead.",
		}),
	}
	reg.MustRegister(m.latency, m.rejected, m.shed, m.bodyCut, m.inflightBytes, m.futureEvents,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tidal_http_writes_inflight", Help: "Writes admitted and waiting for commit (the bounded queue's depth).",
		}, func() float64 { return float64(writes.inflight()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tidal_http_write_expected_wait_seconds", Help: "How long a write arriving now is expected to wait for commit; above --max-write-wait it is shed.",
		}, func() float64 { return writes.expectedWait().Seconds() }))
	return m
}
