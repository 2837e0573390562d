package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// Regression: reads refused while the clock is out of bounds. A node
// whose clock stepped two hours ahead refused writes and failed /readyz,
// but still answered entity reads and top-k evaluated at its clock, where
// every key's 1h window had emptied: "1h: 0" where its peers said 30.
// The real clock guard, the real API and a real state machine: after the
// step, reads at this node's clock get the writes' 503 (code unavailable,
// Retry-After) saying by how much the clock is off; a read that names its
// time with ?at= is served, with the peers' answer; once the clock is
// back and measured, reads at the clock are served again.
func TestReadsAtTheClockFollowTheClockGuard(t *testing.T) {
	t.Run("Regression: reads refused while the clock is out of bounds", func(t *testing.T) {
		var offset atomic.Int64
		clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
		var mu sync.Mutex
		readings := map[uint64]ClockReading{}
		setPeers := func(peerOffset time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range []uint64{2, 3} {
				readings[id] = ClockReading{Offset: peerOffset, Uncertainty: time.Millisecond}
			}
		}
		get := func() map[uint64]ClockReading {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(readings)
		}
		g := newClockGuardOn(clock, 1, time.Minute, get, func() []uint64 { return []uint64{1, 2, 3} }, nil, slog.New(slog.DiscardHandler))
		setPeers(0)
		g.check(time.Now())

		sm := NewStateMachine(testSchema(), ledger.Options{})
		start := clock().Add(-10 * time.Minute).UnixMilli()
		var events []ledger.Event
		for i := range 30 {
			events = append(events, ledger.Event{ID: fmt.Sprintf("v%d", i), Entity: 1, Signal: "view", Weight: 1, TS: start + int64(i)})
		}
		sm.Apply(1, 1, signalsCmd(events...))
		h := api.New(smBackend{sm: sm}, api.Options{Now: clock, ClockHealthy: g.healthy})

		serve := func(path string) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			return rec
		}
		window1h := func(path string) uint64 {
			t.Helper()
			rec := serve(path)
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s: %d %s, expected 200", path, rec.Code, rec.Body)
			}
			var got struct {
				Signals map[string]struct {
					Windows map[string]uint64 `json:"windows"`
				} `json:"signals"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("GET %s: %v in %s", path, err, rec.Body)
			}
			return got.Signals["view"].Windows["1h"]
		}
		refused := func(step, path string, says ...string) {
			t.Helper()
			rec := serve(path)
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != http.StatusServiceUnavailable || body.Error.Code != api.CodeUnavailable || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("%s: GET %s answered %d %s (Retry-After %q); expected the writes' 503 %s with Retry-After",
					step, path, rec.Code, rec.Body, rec.Header().Get("Retry-After"), api.CodeUnavailable)
			}
			for _, s := range append(says, "clock is out of bounds", "?at=", "another node") {
				if !strings.Contains(body.Error.Message, s) {
					t.Fatalf("%s: GET %s: message %q does not say %q", step, path, body.Error.Message, s)
				}
			}
		}

		if n := window1h("/v1/entities/1"); n != 30 {
			t.Fatalf("in bounds: 1h window %d, expected 30", n)
		}
		before := clock().UnixMilli()

		offset.Store(int64(2 * time.Hour)) // the step
		refused("right after the step", "/v1/entities/1", "stepped by +2h0m0s")
		refused("right after the step", "/v1/top?signal=view&window=1h", "stepped by +2h0m0s")
		refused("right after the step, local read", "/v1/entities/1?consistency=local", "stepped by +2h0m0s")
		if n := window1h(fmt.Sprintf("/v1/entities/1?at=%d", before)); n != 30 {
			t.Fatalf("a read at an explicit time while the clock is out of bounds: 1h window %d, expected 30", n)
		}

		setPeers(-2 * time.Hour) // readings taken after the step
		time.Sleep(time.Millisecond)
		g.check(time.Now())
		refused("measured after the step", "/v1/entities/1", "member 2 -2h0m0s", "exceeds --max-clock-skew 1m0s")
		refused("measured after the step", "/v1/top?signal=view", "member 2 -2h0m0s")

		offset.Store(0) // healed
		time.Sleep(time.Millisecond)
		setPeers(0)
		g.check(time.Now())
		if n := window1h("/v1/entities/1"); n != 30 {
			t.Fatalf("healed: 1h window %d, expected 30", n)
		}
	})
}
