package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func signalAt(id string, ts int64) string {
	return fmt.Sprintf(`{"id":%q,"entity":1,"signal":"view","ts":%d}`, id, ts)
}

// Regression: one event with a ts 48 h ahead was
// accepted and emptied its entity's 1h and 24h windows on every node (the
// ledger prunes window buckets relative to a key's newest event). An
// event more than MaxClockSkew ahead of the stamping node's clock is now
// refused, naming it; the whole batch is refused with it.
func TestEventTooFarAheadIsRefused(t *testing.T) {
	e := newEnv(t, Options{})
	ahead := now + (48 * time.Hour).Milliseconds()
	rec := e.post("/v1/signals", `{"events":[`+signalAt("future", ahead)+`]}`)
	wantError(t, rec, http.StatusBadRequest, CodeInvalid, "events[0].ts")
	if msg := rec.Body.String(); !strings.Contains(msg, "48h0m0s ahead") || !strings.Contains(msg, "--max-clock-skew") {
		t.Fatalf("message %s does not say how far ahead and name --max-clock-skew", msg)
	}
	rec = e.post("/v1/signals", `{"events":[`+signalAt("a", now)+`,`+signalAt("b", now)+`,`+signalAt("c", now+61_000)+`]}`)
	wantError(t, rec, http.StatusBadRequest, CodeInvalid, "events[2].ts")
	e.wantNothingWritten()
	if got := metricValue(t, e, "tidal_http_future_events_rejected_total"); got != 2 {
		t.Fatalf("tidal_http_future_events_rejected_total = %v, want 2", got)
	}
}

// TestEventWithinSkewOrInThePastIsAccepted: up to MaxClockSkew ahead is
// fine, and the past is bounded only by the ledger's range.
func TestEventWithinSkewOrInThePastIsAccepted(t *testing.T) {
	e := newEnv(t, Options{MaxClockSkew: 2 * time.Minute})
	want204(t, e.post("/v1/signals", `{"events":[`+signalAt("soon", now+119_000)+`]}`))
	want204(t, e.post("/v1/signals", `{"events":[`+signalAt("old", now-(30*24*time.Hour).Milliseconds())+`]}`))
	wantError(t, e.post("/v1/signals", `{"events":[`+signalAt("late", now+121_000)+`]}`), http.StatusBadRequest, CodeInvalid, "events[0].ts")
}

// TestClockOffsetShiftsStampingAndTheBound: the test-only offset moves
// this node's clock for stamping and for the skew check alike.
func TestClockOffsetShiftsStampingAndTheBound(t *testing.T) {
	const offset = 48 * time.Hour
	e := newEnv(t, Options{ClockOffset: offset})
	want204(t, e.post("/v1/signals", `{"events":[{"id":"stamped","entity":1,"signal":"view"}]}`))
	if got, want := e.fake.batches[0][0].TS, now+offset.Milliseconds(); got != want {
		t.Fatalf("stamped %d, want the shifted clock %d", got, want)
	}
	want204(t, e.post("/v1/signals", `{"events":[`+signalAt("ahead-of-real", now+offset.Milliseconds())+`]}`))
	wantError(t, e.post("/v1/signals", `{"events":[`+signalAt("too-far", now+(offset+2*time.Minute).Milliseconds())+`]}`),
		http.StatusBadRequest, CodeInvalid, "events[0].ts")
}

// TestClockOutOfBoundsStopsWritesAndReadiness: while ClockHealthy says
// no, writes and reads at this node's clock get 503 with Retry-After and
// the reason, /readyz fails with it, reads at a named time (?at=) go on;
// once it says yes again, writes resume.
func TestClockOutOfBoundsStopsWritesAndReadiness(t *testing.T) {
	var healthy atomic.Bool
	e := newEnv(t, Options{ClockHealthy: func() (bool, string) {
		if healthy.Load() {
			return true, ""
		}
		return false, "offset to a quorum exceeds 1m0s"
	}})
	for _, rec := range []*recorded{
		{"signals", e.post("/v1/signals", `{"events":[{"id":"w","entity":1,"signal":"view"}]}`)},
		{"embedding", e.do(http.MethodPut, "/v1/entities/1/embedding", "application/json", `{"id":"w","vector":[1,0,0,0]}`)},
		{"readyz", e.get("/readyz")},
	} {
		wantError(t, rec.rec, http.StatusServiceUnavailable, CodeUnavailable, "")
		if !strings.Contains(rec.rec.Body.String(), "offset to a quorum exceeds 1m0s") {
			t.Fatalf("%s: %s does not give the clock's reason", rec.name, rec.rec.Body)
		}
		if rec.name != "readyz" && rec.rec.Header().Get("Retry-After") == "" {
			t.Fatalf("%s: 503 without Retry-After", rec.name)
		}
	}
	e.wantNothingWritten()
	for _, path := range []string{"/v1/entities/1", "/v1/top?signal=view"} {
		rec := e.get(path)
		wantError(t, rec, http.StatusServiceUnavailable, CodeUnavailable, "")
		if msg := rec.Body.String(); !strings.Contains(msg, "offset to a quorum exceeds 1m0s") || !strings.Contains(msg, "?at=") {
			t.Fatalf("GET %s: %s does not give the clock's reason and the way out (?at=)", path, msg)
		}
	}
	for _, path := range []string{"/v1/entities/1?at=1700000000000", "/v1/top?signal=view&at=1700000000000"} {
		if rec := e.get(path); rec.Code != http.StatusOK {
			t.Fatalf("GET %s (a read at a named time) while the clock is out of bounds answered %d %s, want 200", path, rec.Code, rec.Body)
		}
	}
	if got := metricValue(t, e, `tidal_http_shed_total{reason="clock"}`); got != 2 {
		t.Fatalf(`tidal_http_shed_total{reason="clock"} = %v, want 2`, got)
	}
	if got := metricValue(t, e, `tidal_http_shed_total{reason="clock_read"}`); got != 2 {
		t.Fatalf(`tidal_http_shed_total{reason="clock_read"} = %v, want 2`, got)
	}
	healthy.Store(true)
	want204(t, e.post("/v1/signals", `{"events":[{"id":"w","entity":1,"signal":"view"}]}`))
	if rec := e.get("/readyz"); rec.Code != http.StatusOK {
		t.Fatalf("/readyz answered %d once the clock is back in bounds, want 200", rec.Code)
	}
}

type recorded struct {
	name string
	rec  *httptest.ResponseRecorder
}

// Regression: latency buckets stopped at 3.3s, below
// the 5s write timeout, so every request that ran into a deadline landed
// in +Inf and the histogram could not say what timeouts cost. Buckets now
// reach past twice the longest timeout, and at least 30s.
func TestLatencyBucketsReachPastTheTimeouts(t *testing.T) {
	for _, o := range []Options{{}, {WriteTimeout: 45 * time.Second}, {BodyReadTimeout: 2 * time.Minute}} {
		o.setDefaults()
		b := latencyBuckets(o)
		top := b[len(b)-1]
		longest := max(o.WriteTimeout, o.ReadTimeout, o.BodyReadTimeout)
		if top < 30 || top < 2*longest.Seconds() {
			t.Fatalf("largest bucket %vs with write timeout %v, body timeout %v: want at least 30s and twice the longest timeout",
				top, o.WriteTimeout, o.BodyReadTimeout)
		}
	}
	e := newEnv(t, Options{})
	want204(t, e.post("/v1/signals", `{"events":[`+goodEvents(1)[0]+`]}`))
	if !strings.Contains(e.get("/metrics").Body.String(), `tidal_http_request_duration_seconds_bucket{code="204",route="POST /v1/signals",le="52.4288"} 1`) {
		t.Fatalf("/metrics lacks the 52.4288s bucket:\n%s", grepLines(e.get("/metrics").Body.String(), `route="POST /v1/signals",le=`))
	}
}
