package api

import (
	"fmt"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// Bounded clocks. The node that takes a write stamps the events that came
// without ts (see the write path in docs/ARCHITECTURE.md) and refuses, as
// 400 naming events[i].ts, an event whose ts is more than MaxClockSkew
// ahead of its clock. A future ts is not harmless: the ledger prunes a
// key's window buckets relative to its newest event, so one event 48 h
// ahead empties that key's 1h and 24h windows on every node.
//
// The past is bounded only by the ledger's range (ts >= 2000-01-01): a
// late event is folded into count, weight sum and (decayed to its age)
// score, and into a window only while it is inside that window at the
// key's newest event — an event older than the window has already left
// it, as it would have had it arrived on time.
//
// Options.ClockHealthy, when set, gates writes: a node whose clock is out
// of bounds with its peers refuses writes (503, Retry-After) and fails
// /readyz with the reason, until the check passes again. It gates the
// reads evaluated at this node's clock too (an entity's decayed scores
// and windows, top-k, without ?at=): the replicated state is the same on
// every node, but read at a clock two hours ahead a key's 1h window is
// empty and its scores decayed by two hours — an answer that looks valid
// and is not. A read that names its time (?at=) does not use the clock
// and is served; so are reads that evaluate nothing at a time (nearest,
// event locations, the audit routes, status).

// errClock is the 503 for a write, or a read at this node's clock,
// refused because this node's clock is out of bounds.
type errClock struct {
	reason string
	read   bool
}

func (e *errClock) Error() string {
	if e.read {
		return "this node's clock is out of bounds, so it serves no read evaluated at its clock: " + e.reason +
			"; read from another node, or name the time with ?at=<unix ms>"
	}
	return "this node's clock is out of bounds, so it takes no writes: " + e.reason
}

// now is this node's clock: Options.Now plus the test-only ClockOffset.
// Stamping, the skew check and default read times all use it.
func (h *handler) now() time.Time { return h.opts.Now().Add(h.opts.ClockOffset) }

// checkClock consults Options.ClockHealthy.
func (h *handler) checkClock() error {
	if h.opts.ClockHealthy == nil {
		return nil
	}
	if ok, reason := h.opts.ClockHealthy(); !ok {
		return &errClock{reason: reason}
	}
	return nil
}

// readNow is now for a read evaluated at this node's clock, or the
// clock's refusal when Options.ClockHealthy says it is out of bounds.
func (h *handler) readNow() (time.Time, error) {
	if h.opts.ClockHealthy != nil {
		if ok, reason := h.opts.ClockHealthy(); !ok {
			return time.Time{}, &errClock{reason: reason, read: true}
		}
	}
	return h.now(), nil
}

// stampAndBound stamps the events that came without ts with now and
// refuses the first whose ts is more than MaxClockSkew ahead of now.
func (h *handler) stampAndBound(events []ledger.Event, now time.Time) error {
	stamp := now.UnixMilli()
	limit := stamp + h.opts.MaxClockSkew.Milliseconds()
	for i := range events {
		if events[i].TS == 0 {
			events[i].TS = stamp
		}
		if ts := events[i].TS; ts > limit {
			h.metrics.futureEvents.Inc()
			ahead := time.Duration(ts-stamp) * time.Millisecond
			return invalid(fmt.Sprintf("events[%d].ts", i),
				"%d is %v ahead of this node's clock (%d); at most %v ahead is accepted (--max-clock-skew)",
				ts, ahead, stamp, h.opts.MaxClockSkew)
		}
	}
	return nil
}
