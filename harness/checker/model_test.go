package checker

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// t0 is the scenario's "now" in unix ms.
const t0 = int64(1_700_000_000_000)

var likeModel = SignalModel{
	Signal: "like", HalfLife: 72 * time.Hour,
	Windows: map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour, "all": 0},
}

// modelEvent is one add of the scenario and what the server did with it.
type modelEvent struct {
	delta   int64
	ts      int64 // client ts; 0: stamped
	sent    int64 // stamped: client clock before sending
	acked   int64 // stamped and ok: client clock after the ack
	stamp   int64 // stamped: the node's stamp
	outcome history.Type
	applied bool
}

func (e modelEvent) foldedTS() int64 {
	if e.ts != 0 {
		return e.ts
	}
	return e.stamp
}

// scenario is key 9's adds: client ts of every age and node-stamped ones;
// acked, failed, and info either applied or not.
func scenario() []modelEvent {
	return []modelEvent{
		{delta: 3, ts: t0 - 20*3600_000, outcome: history.OK, applied: true},
		{delta: 2, ts: t0 - 30*60_000, outcome: history.OK, applied: true},
		{delta: 4, sent: t0 - 10, acked: t0 - 5, stamp: t0 - 7, outcome: history.OK, applied: true},
		{delta: 1, sent: t0 - 3, stamp: t0 - 2, outcome: history.Info, applied: true},
		{delta: 5, ts: t0 - 2*3600_000, outcome: history.Fail},
		{delta: 2, ts: t0 - 25*3600_000, outcome: history.Info},
	}
}

// serve computes what a correct node answers at `at` having folded the
// applied events, with the given half-life: the ledger's documented
// arithmetic, bucket for bucket (windows count ts in
// [(⌊at/b⌋-60)·b, (⌊at/b⌋+1)·b)).
func serve(events []modelEvent, at int64, halfLife time.Duration) history.SignalStats {
	s := history.SignalStats{At: at, Windows: map[string]uint64{}, ReturnedMS: at + 1}
	for name := range likeModel.Windows {
		s.Windows[name] = 0
	}
	for _, e := range events {
		if !e.applied {
			continue
		}
		ts := e.foldedTS()
		s.Count++
		s.WeightSum += float64(e.delta)
		s.Score += float64(e.delta) * math.Exp2(float64(ts-at)/float64(halfLife.Milliseconds()))
		for name, w := range likeModel.Windows {
			if w == 0 {
				s.Windows[name]++
				continue
			}
			b := w.Milliseconds() / 60
			if first := (at/b - 60) * b; ts >= first && ts < (at/b+1)*b {
				s.Windows[name]++
			}
		}
	}
	return s
}

// modelHistory writes the events' adds (infos completing only after the
// read) and then one read of key 9 answering stats.
func modelHistory(t *testing.T, events []modelEvent, stats *history.SignalStats) []history.Op {
	h := newHist(t)
	var infos []history.Op
	for i, e := range events {
		v := history.AddValue{Key: 9, Delta: e.delta, TS: e.ts, SentMS: e.sent}
		inv := h.invoke(history.Process(i), history.FAdd, v, "n1")
		switch e.outcome {
		case history.OK:
			v.AckedMS = e.acked
			h.complete(inv, history.OK, v)
		case history.Info:
			infos = append(infos, inv)
		default:
			h.complete(inv, e.outcome, nil)
		}
	}
	r := h.readInv(100, 9)
	v := history.ReadValue{Key: 9, Stats: stats}
	if stats != nil {
		n := int64(stats.WeightSum)
		v.Value = &n
	}
	h.complete(r, history.OK, v)
	for _, inv := range infos {
		h.complete(inv, history.Info, nil)
	}
	return h.ops
}

func violationFields(r Result) string {
	var fields []string
	for _, v := range r.Details.(AggregatesDetails).Violations.Examples {
		fields = append(fields, v.Field)
	}
	return strings.Join(fields, ",")
}

// Regression: a correct node's answer is within the
// model; each planted defect — a count one lower than acked, a decay with
// the wrong half-life, a window that counts what it must not or misses
// what it must — is caught, on the aggregate it concerns.
func TestAggregatesModel(t *testing.T) {
	at := t0 + 1000
	good := serve(scenario(), at, likeModel.HalfLife)
	mustValid(t, Aggregates(modelHistory(t, scenario(), &good), likeModel), Valid)

	// The uncertain add is allowed to be missing too.
	skipped := scenario()
	skipped[3].applied = false
	s := serve(skipped, at, likeModel.HalfLife)
	mustValid(t, Aggregates(modelHistory(t, skipped, &s), likeModel), Valid)

	// The planted defects are judged without the info adds, whose
	// uncertainty (an add of weight 2 that may or may not have landed)
	// would otherwise leave room for some of them.
	var settled []modelEvent
	for _, e := range scenario() {
		if e.outcome != history.Info {
			settled = append(settled, e)
		}
	}
	for _, c := range []struct {
		name  string
		plant func(s *history.SignalStats)
		field string
	}{
		{"count one lower than acked", func(s *history.SignalStats) { s.Count-- }, "count"},
		{"count one above attempted", func(s *history.SignalStats) { s.Count++ }, "count"},
		{"weight sum missing an acked add", func(s *history.SignalStats) { s.WeightSum -= 4 }, "weight_sum"},
		{"decay with a 24h half-life", func(s *history.SignalStats) {
			*s = serve(settled, at, 24*time.Hour)
		}, "score"},
		{"decay with a 73h half-life", func(s *history.SignalStats) {
			*s = serve(settled, at, 73*time.Hour)
		}, "score"},
		{"1h window counting a 20h-old event", func(s *history.SignalStats) { s.Windows["1h"]++ }, "window 1h"},
		{"24h window missing a 30min-old event", func(s *history.SignalStats) { s.Windows["24h"]-- }, "window 24h"},
		{"all window not the count", func(s *history.SignalStats) { s.Windows["all"]++ }, "window all"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := serve(settled, at, likeModel.HalfLife)
			mustValid(t, Aggregates(modelHistory(t, settled, &s), likeModel), Valid)
			c.plant(&s)
			r := Aggregates(modelHistory(t, settled, &s), likeModel)
			mustValid(t, r, Invalid)
			if got := violationFields(r); got != c.field {
				t.Errorf("expected a violation of %s only, found %q: %s", c.field, got, r.Summary)
			}
		})
	}
}

// TestAggregatesWindowBound: an event that left the window less than one
// bucket width ago may still count, and need not; one that left more
// than a bucket ago must not.
func TestAggregatesWindowBound(t *testing.T) {
	at := t0 + 1000
	const bucket = 60_000 // 1h / 60
	for _, c := range []struct {
		age    int64 // at - ts
		counts uint64
		want   Validity
	}{
		{3600_000 - 1, 1, Valid},            // inside: must count
		{3600_000 - 1, 0, Invalid},          //   ... and not counting it is a loss
		{3600_000 + bucket/2, 1, Valid},     // left less than a bucket ago: may count
		{3600_000 + bucket/2, 0, Valid},     //   ... or not
		{3600_000 + bucket + 1, 1, Invalid}, // left more than a bucket ago: must not
	} {
		events := []modelEvent{{delta: 1, ts: at - c.age, outcome: history.OK, applied: true}}
		s := serve(events, at, likeModel.HalfLife)
		s.Windows["1h"] = c.counts
		r := Aggregates(modelHistory(t, events, &s), likeModel)
		if r.Valid != c.want {
			t.Errorf("event %dms old, 1h window %d: expected %s, found %s: %s", c.age, c.counts, c.want, r.Valid, r.Summary)
		}
	}
}

// TestAggregatesPrunedAhead: a key whose newest event lies more than a
// bucket past the read's time has had the window's oldest bucket pruned
// (the ledger prunes by the key's newest event, not the read's time), so
// an event just inside the window may go uncounted; ts ahead of the read
// by a bucket or more never counts.
func TestAggregatesPrunedAhead(t *testing.T) {
	at := t0 + 1000
	const bucket = 60_000
	events := []modelEvent{
		{delta: 1, ts: at - 3600_000 + 1000, outcome: history.OK, applied: true},
		{delta: 1, ts: at + bucket + bucket/2, outcome: history.OK, applied: true},
	}
	s := serve(events, at, likeModel.HalfLife)
	for counted, want := range map[uint64]Validity{0: Valid, 1: Valid, 2: Invalid} {
		s.Windows["1h"] = counted
		if r := Aggregates(modelHistory(t, events, &s), likeModel); r.Valid != want {
			t.Errorf("1h window %d with the newest event 1.5 buckets ahead: expected %s, found %s: %s", counted, want, r.Valid, r.Summary)
		}
	}
}

// Regression: without the data it needs the checker
// says unknown, never true: a history from before reads recorded their
// aggregates, adds without a recorded timestamp, a run whose config does
// not state the signal's schema.
func TestAggregatesUnknownWithoutData(t *testing.T) {
	at := t0 + 1000
	good := serve(scenario(), at, likeModel.HalfLife)

	r := Aggregates(modelHistory(t, scenario(), nil), likeModel)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "without aggregates") {
		t.Errorf("expected the summary to say reads lack aggregates, found %q", r.Summary)
	}

	untimed := scenario()
	untimed[2].sent = 0
	r = Aggregates(modelHistory(t, untimed, &good), likeModel)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "without a recorded timestamp") {
		t.Errorf("expected the summary to name adds without timestamps, found %q", r.Summary)
	}
	// Count and weight sum need no timestamps and are still judged.
	bad := good
	bad.Count = 0
	mustValid(t, Aggregates(modelHistory(t, untimed, &bad), likeModel), Invalid)

	mustValid(t, Aggregates(modelHistory(t, scenario(), &good), SignalModel{Signal: "like"}), Unknown)

	// A node that does not report a window the model expects.
	partial := serve(scenario(), at, likeModel.HalfLife)
	delete(partial.Windows, "24h")
	mustValid(t, Aggregates(modelHistory(t, scenario(), &partial), likeModel), Unknown)

	mustValid(t, Aggregates(nil, likeModel), Unknown)
}
