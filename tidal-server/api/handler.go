// Package api is tidal-server's HTTP surface: the client API, the admin
// endpoints, health and metrics. It validates everything a client sends
// before anything reaches the log — a batch with one bad event is refused
// whole — and maps every internal outcome to the status codes DESIGN.md
// fixes. It holds no state of its own besides the in-flight bound.
package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// Options bound what one request may ask for.
type Options struct {
	MaxBodyBytes      int64         // default 8 MiB; larger bodies get 413
	MaxBatch          int           // events per POST /v1/signals; default 10000; more gets 413
	MaxInflightWrites int           // writes waiting for commit on this node; default 4096; more gets 503
	WriteTimeout      time.Duration // default 5s; past it the outcome is unknown (504)
	ReadTimeout       time.Duration // default 5s
	MaxK              int           // default 1000
	Logger            *slog.Logger
	Registry          *prometheus.Registry // serves /metrics and receives the HTTP metrics; nil = a private one
	Now               func() time.Time     // read-time clock (decay, windows); default time.Now
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
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

type handler struct {
	b        Backend
	opts     Options
	schema   ledger.Schema
	inflight chan struct{}
	metrics  *httpMetrics
}

// New returns the HTTP handler serving every route over b.
func New(b Backend, opts Options) http.Handler {
	opts.setDefaults()
	h := &handler{b: b, opts: opts, schema: b.Schema(), inflight: make(chan struct{}, opts.MaxInflightWrites)}
	h.metrics = newHTTPMetrics(opts.Registry, func() float64 { return float64(len(h.inflight)) })

	mux := http.NewServeMux()
	route := func(pattern string, fn func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(pattern, h.instrument(pattern, fn))
	}
	route("POST /v1/signals", h.postSignals)
	route("PUT /v1/entities/{entity}/embedding", h.putEmbedding)
	route("GET /v1/entities/{entity}", h.getEntity)
	route("POST /v1/query/nearest", h.nearest)
	route("GET /v1/top", h.top)
	route("GET /v1/events/{id...}", h.eventLocation)
	route("GET /v1/audit/events", h.auditEvents)
	route("GET /v1/audit/digest", h.digest)
	route("GET /cluster/status", h.status)
	route("POST /admin/members", h.addMember)
	route("DELETE /admin/members/{id}", h.removeMember)
	route("POST /admin/transfer-leader", h.transferLeader)
	route("POST /admin/snapshot", h.snapshot)
	route("GET /admin/backup", h.backup)
	route("GET /healthz", h.healthz)
	route("GET /readyz", h.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{}))
	route("/", func(w http.ResponseWriter, r *http.Request) error {
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no route %s %s; see README for the API", r.Method, r.URL.Path)}
	})
	return mux
}

// instrument records latency by route and code, and turns a returned
// error into the JSON error body. A handler that returns nil has written
// its own response.
func (h *handler) instrument(route string, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				// Nothing a client sends may take the node down; a panic
				// here is our bug, reported as 500 and logged loudly.
				h.opts.Logger.Error("handler panic", "route", route, "panic", p)
				if !sw.wrote {
					writeError(sw, fmt.Errorf("internal error: %v", p))
				}
			}
			h.metrics.latency.WithLabelValues(route, strconv.Itoa(sw.status)).Observe(time.Since(start).Seconds())
		}()
		if err := fn(sw, r); err != nil {
			ae := writeError(sw, err)
			if ae.Status == http.StatusServiceUnavailable {
				h.metrics.rejected.WithLabelValues(ae.Code).Inc()
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

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// readJSONBody enforces content type and size before any decoding.
func (h *handler) readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != "application/json" {
		return nil, &Error{Status: http.StatusUnsupportedMediaType, Code: CodeMediaType, Field: "Content-Type",
			Message: fmt.Sprintf("expected application/json, found %q", ct)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge,
				Message: fmt.Sprintf("request body exceeds %d bytes", h.opts.MaxBodyBytes)}
		}
		return nil, invalid("", "reading request body: %v", err)
	}
	return body, nil
}

// decodeStrict decodes one JSON value, refusing unknown fields and
// trailing data, and names the field a type error was found in. prefix is
// the path of v in the request ("events[3]").
func decodeStrict(data []byte, v any, prefix string) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, prefix)
	}
	if dec.More() {
		return invalid(prefix, "unexpected data after the JSON value")
	}
	return nil
}

func join(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	}
	return prefix + "." + field
}

func jsonError(err error, prefix string) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return invalid(join(prefix, te.Field), "expected %s, found JSON %s", goTypeName(te.Type.String()), te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return invalid(prefix, "malformed JSON at byte %d: %v", se.Offset, se)
	}
	if s := err.Error(); strings.HasPrefix(s, "json: unknown field ") {
		name := strings.Trim(strings.TrimPrefix(s, "json: unknown field "), `"`)
		return invalid(join(prefix, name), "unknown field")
	}
	if errors.Is(err, io.EOF) {
		return invalid(prefix, "empty body; expected a JSON object")
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return invalid(prefix, "truncated JSON")
	}
	return invalid(prefix, "%v", err)
}

func goTypeName(t string) string {
	switch t {
	case "uint64":
		return "an unsigned 64-bit integer"
	case "int64":
		return "a 64-bit integer"
	case "float64", "float32":
		return "a number"
	case "string":
		return "a string"
	case "[]float32":
		return "an array of numbers"
	}
	return t
}

type wireEvent struct {
	ID     *string  `json:"id"`
	Entity *uint64  `json:"entity"`
	Signal *string  `json:"signal"`
	Weight *float64 `json:"weight"`
	TS     *int64   `json:"ts"`
}

type signalsRequest struct {
	Events []json.RawMessage `json:"events"`
}

// DecodeSignals parses and validates a POST /v1/signals body against
// schema. Every event is checked before the batch is accepted, so an error
// always names the first bad field and nothing is written. Exported for
// the fuzz target and for tools that pre-validate batches.
func DecodeSignals(body []byte, schema ledger.Schema, maxBatch int) ([]ledger.Event, error) {
	var req signalsRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return nil, err
	}
	if req.Events == nil {
		return nil, invalid("events", "required: a non-empty array of events")
	}
	if len(req.Events) == 0 {
		return nil, invalid("events", "empty batch; expected at least one event")
	}
	if len(req.Events) > maxBatch {
		return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: "events",
			Message: fmt.Sprintf("batch of %d events exceeds the limit of %d", len(req.Events), maxBatch)}
	}
	events := make([]ledger.Event, len(req.Events))
	for i, raw := range req.Events {
		prefix := fmt.Sprintf("events[%d]", i)
		var we wireEvent
		if err := decodeStrict(raw, &we, prefix); err != nil {
			return nil, err
		}
		switch {
		case we.ID == nil:
			return nil, invalid(prefix+".id", "required")
		case we.Entity == nil:
			return nil, invalid(prefix+".entity", "required")
		case we.Signal == nil:
			return nil, invalid(prefix+".signal", "required")
		}
		e := ledger.Event{ID: *we.ID, Entity: *we.Entity, Signal: *we.Signal, Weight: 1}
		if we.Weight != nil {
			e.Weight = *we.Weight
		}
		if we.TS != nil {
			if *we.TS == 0 {
				return nil, invalid(prefix+".ts", "0 is not a timestamp; omit ts to have the node stamp it")
			}
			e.TS = *we.TS
		}
		// The node stamps absent timestamps later; validate with a
		// placeholder inside the accepted range so the rest is checked now.
		check := e
		if check.TS == 0 {
			check.TS = ledger.MinTS
		}
		if fe := schema.ValidateEvent(check); fe != nil {
			return nil, invalid(prefix+"."+fe.Field, "%s", fe.Message)
		}
		events[i] = e
	}
	return events, nil
}

func (h *handler) acquire() (release func(), err error) {
	select {
	case h.inflight <- struct{}{}:
		return func() { <-h.inflight }, nil
	default:
		return nil, ErrQueueFull
	}
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
	body, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	events, err := DecodeSignals(body, h.schema, h.opts.MaxBatch)
	if err != nil {
		return err
	}
	// Stamp here, before the entry is logged, so that apply never reads a
	// clock and every replica folds the same timestamp.
	now := h.opts.Now().UnixMilli()
	for i := range events {
		if events[i].TS == 0 {
			events[i].TS = now
		}
	}
	if err := h.b.CheckSignals(events); err != nil {
		return err
	}
	release, err := h.acquire()
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	ack, err := h.b.WriteSignals(ctx, events)
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

type embeddingRequest struct {
	ID     *string   `json:"id"`
	Vector []float64 `json:"vector"`
}

// toFloat32 converts a JSON vector, naming the first element a float32
// cannot hold.
func toFloat32(v []float64, field string) ([]float32, error) {
	out := make([]float32, len(v))
	for i, f := range v {
		if math.Abs(f) > math.MaxFloat32 {
			return nil, invalid(fmt.Sprintf("%s[%d]", field, i), "%g overflows float32", f)
		}
		out[i] = float32(f)
	}
	return out, nil
}

func (h *handler) putEmbedding(w http.ResponseWriter, r *http.Request) error {
	entity, err := parseEntity(r)
	if err != nil {
		return err
	}
	body, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	var req embeddingRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if req.ID == nil || *req.ID == "" {
		return invalid("id", "required: a write id, reused on retries")
	}
	if len(*req.ID) > ledger.MaxIDLen {
		return invalid("id", "%d bytes; at most %d", len(*req.ID), ledger.MaxIDLen)
	}
	if req.Vector == nil {
		return invalid("vector", "required")
	}
	vec, err := toFloat32(req.Vector, "vector")
	if err != nil {
		return err
	}
	if fe := vectors.New(h.schema.EmbeddingDim).Validate(vec); fe != nil {
		return invalid(fe.Field, "%s", fe.Message)
	}
	release, err := h.acquire()
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	ack, err := h.b.PutEmbedding(ctx, entity, *req.ID, vec)
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

func (h *handler) readTime(r *http.Request) (int64, error) {
	s := r.URL.Query().Get("at")
	if s == "" {
		return h.opts.Now().UnixMilli(), nil
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

type nearestRequest struct {
	Vector []float64 `json:"vector"`
	K      *int      `json:"k"`
}

type matchJSON struct {
	Entity uint64  `json:"entity"`
	Score  float32 `json:"score"`
}

func (h *handler) checkK(k int) error {
	if k < 1 || k > h.opts.MaxK {
		return invalid("k", "expected 1..%d, found %d", h.opts.MaxK, k)
	}
	return nil
}

func (h *handler) nearest(w http.ResponseWriter, r *http.Request) error {
	body, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	var req nearestRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if req.Vector == nil {
		return invalid("vector", "required")
	}
	k := 10
	if req.K != nil {
		k = *req.K
	}
	if err := h.checkK(k); err != nil {
		return err
	}
	vec, err := toFloat32(req.Vector, "vector")
	if err != nil {
		return err
	}
	if fe := vectors.New(h.schema.EmbeddingDim).Validate(vec); fe != nil {
		return invalid(fe.Field, "%s", fe.Message)
	}
	_, cancel, err := h.barrier(r, "linearizable")
	if err != nil {
		return err
	}
	defer cancel()
	var matches []vectors.Match
	h.b.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) {
		matches, err = v.Nearest(vec, k)
	})
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
	if err := h.checkK(k); err != nil {
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

func (h *handler) auditEvents(w http.ResponseWriter, r *http.Request) error {
	_, cancel, err := h.barrier(r, "local")
	if err != nil {
		return err
	}
	defer cancel()
	// Copy under the read lock, stream after it: a slow reader must not
	// hold up apply.
	var locs []ledger.Location
	h.b.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) {
		err = l.AuditEvents(func(loc ledger.Location) error {
			locs = append(locs, loc)
			return nil
		})
	})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	for _, loc := range locs {
		if err := enc.Encode(locationJSON{ID: loc.ID, Index: loc.Index, Term: loc.Term, Entity: loc.Entity, Signal: loc.Signal}); err != nil {
			return nil // client went away; the status is already sent
		}
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
	return writeJSON(w, http.StatusOK, h.b.Status())
}

type memberRequest struct {
	ID         *uint64 `json:"id"`
	PeerAddr   string  `json:"peer_addr"`
	ClientAddr string  `json:"client_addr"`
}

func (h *handler) addMember(w http.ResponseWriter, r *http.Request) error {
	body, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	var req memberRequest
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if req.ID == nil || *req.ID == 0 {
		return invalid("id", "required: a node id > 0 never used in this cluster")
	}
	if req.PeerAddr == "" {
		return invalid("peer_addr", "required: host:port the other nodes dial")
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	m := replica.Member{ID: *req.ID, PeerAddr: req.PeerAddr, ClientAddr: req.ClientAddr}
	if err := h.b.AddMember(ctx, m); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, m)
}

func (h *handler) removeMember(w http.ResponseWriter, r *http.Request) error {
	s := r.PathValue("id")
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return invalid("id", "expected a node id > 0, found %q", s)
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	if err := h.b.RemoveMember(ctx, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) transferLeader(w http.ResponseWriter, r *http.Request) error {
	body, err := h.readJSONBody(w, r)
	if err != nil {
		return err
	}
	var req struct {
		To *uint64 `json:"to"`
	}
	if err := decodeStrict(body, &req, ""); err != nil {
		return err
	}
	if req.To == nil || *req.To == 0 {
		return invalid("to", "required: the id of the member to lead")
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.WriteTimeout)
	defer cancel()
	if err := h.b.TransferLeader(ctx, *req.To); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*h.opts.WriteTimeout)
	defer cancel()
	index, term, err := h.b.Snapshot(ctx)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]uint64{"index": index, "term": term})
}

func (h *handler) backup(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/octet-stream")
	_, err := h.b.Backup(r.Context(), w)
	if err != nil {
		if sw, ok := w.(*statusWriter); ok && sw.wrote {
			h.opts.Logger.Error("backup stream failed midway", "err", err)
			return nil
		}
		return err
	}
	return nil
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
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "ready\n")
	return nil
}

type httpMetrics struct {
	latency  *prometheus.HistogramVec
	rejected *prometheus.CounterVec
}

func newHTTPMetrics(reg prometheus.Registerer, queueDepth func() float64) *httpMetrics {
	m := &httpMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tidal_http_request_duration_seconds", Help: "HTTP request latency by route and status code.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16),
		}, []string{"route", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidal_http_rejected_total", Help: "Requests shed with 503, by error code.",
		}, []string{"code"}),
	}
	reg.MustRegister(m.latency, m.rejected, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tidal_http_writes_inflight", Help: "Writes admitted and waiting for commit (the bounded queue's depth).",
	}, queueDepth))
	return m
}
