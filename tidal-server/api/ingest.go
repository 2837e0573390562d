package api

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// Ingest is POST /v1/signals' write path after the body, for the gRPC
// ingest stream (package ingest): the same validation rules,
// stamping, early id check, admission (the HTTP handler's write queue and
// byte budget, shared) and proposal, so that a write sent either way is
// the same write. NewWithIngest returns it beside the HTTP handler.
type Ingest struct {
	h    *handler
	hint atomic.Pointer[leaderHint] // LeaderHint's last answer
}

type leaderHint struct {
	at   time.Time
	id   uint64
	addr string
}

// leaderHintFor is how long LeaderHint reuses its answer: asking raft for
// its status goes through raft's own goroutine, and refusals come in
// bursts exactly when the node is busiest.
const leaderHintFor = 250 * time.Millisecond

// Schema is the node's schema.
func (in *Ingest) Schema() ledger.Schema { return in.h.schema }

// MaxBatch is the most events one request may carry (--max-batch); more
// is 413 too_large, as over HTTP.
func (in *Ingest) MaxBatch() int { return in.h.opts.MaxBatch }

// MaxRequestBytes bounds one request message (--max-body-bytes).
func (in *Ingest) MaxRequestBytes() int64 { return in.h.opts.MaxBodyBytes }

// Admit runs the admission rules that need no decoding, as the HTTP
// handler does before it reads a body: the clock gate and the write
// queue's look-ahead (writes in flight, expected wait).
func (in *Ingest) Admit() error {
	if err := in.h.checkClock(); err != nil {
		return err
	}
	return in.h.writes.check()
}

// ChargeBytes charges a request of n bytes to the in-flight byte budget
// (--max-inflight-bytes) shared with the HTTP bodies; release once it is
// answered. A request that does not fit is refused (503, retry).
func (in *Ingest) ChargeBytes(n int64) (release func(), err error) {
	if !in.h.bytes.tryAcquire(n) {
		return nil, &errBytesInFlight{want: n, used: in.h.bytes.used.Load(), limit: in.h.bytes.limit}
	}
	in.h.metrics.inflightBytes.Add(float64(n))
	return func() {
		in.h.bytes.release(n)
		in.h.metrics.inflightBytes.Sub(float64(n))
	}, nil
}

// CheckEvent validates events[i] of a request by the rules DecodeSignals
// applies to a JSON event: e.Weight is 1 when the request left it out,
// tsGiven says whether it carried a ts (0 is then refused, as in JSON).
// The error is 400 naming the field (events[i].weight).
func (in *Ingest) CheckEvent(i int, e ledger.Event, tsGiven bool) error {
	field := func(key string) string { return fmt.Sprintf("events[%d].%s", i, key) }
	if tsGiven && e.TS == 0 {
		return invalid(field("ts"), "0 is not a timestamp; omit ts to have the node stamp it")
	}
	check := e
	if check.TS == 0 {
		check.TS = ledger.MinTS // stamped later; validate the rest now
	}
	if fe := in.h.schema.ValidateEvent(check); fe != nil {
		return invalid(field(fe.Field), "%s", fe.Message)
	}
	return nil
}

// TooLarge is the 413 for a request of more than MaxBatch events, or of
// more than MaxRequestBytes bytes.
func (in *Ingest) TooLarge(field, format string, args ...any) error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Invalid is a 400 naming field.
func (in *Ingest) Invalid(field, format string, args ...any) error {
	return invalid(field, format, args...)
}

// InternSignal returns the schema's own string for a known signal name
// (one string shared by every event of that signal).
func (in *Ingest) InternSignal(name []byte) string { return internSignal(in.h.schema, name) }

// WriteSignals stamps, checks, admits and proposes a validated batch,
// exactly as POST /v1/signals does after decoding its body; it returns
// once the batch is committed and applied on this node (or why not).
// ctx is the stream's: the write gets --write-timeout under it.
func (in *Ingest) WriteSignals(ctx context.Context, events []ledger.Event) (WriteAck, error) {
	if err := in.h.checkClock(); err != nil {
		return WriteAck{}, err
	}
	return in.h.writeSignals(ctx, events)
}

// Outcome maps a write's error to the API's vocabulary (status, code,
// field, Retry-After) and, for an admission refusal, names the rule that
// shed it (inflight_writes, expected_wait, inflight_bytes, clock; "" for
// other errors).
func (in *Ingest) Outcome(err error) (*Error, string) {
	ae := toAPIError(err)
	if ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusGatewayTimeout {
		in.h.opts.Logger.Error("ingest request failed", "status", ae.Status, "err", ae.Message)
	}
	return ae, shedReason(err)
}

// LeaderHint is this node's view of the leader, for a refused write's
// answer: its id (0: none known) and its advertised client address ("" if
// unknown). Any node takes writes (followers forward proposals); the hint
// lets a client go to the leader directly and save the hop.
func (in *Ingest) LeaderHint() (uint64, string) {
	now := in.h.opts.monotonic()
	if h := in.hint.Load(); h != nil && now.Sub(h.at) < leaderHintFor {
		return h.id, h.addr
	}
	st := in.h.b.Status()
	h := &leaderHint{at: now, id: st.Leader}
	for _, m := range st.Members {
		if m.ID == st.Leader {
			h.addr = m.ClientAddr
		}
	}
	in.hint.Store(h)
	return h.id, h.addr
}
