package api

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Admission decides, before a request costs anything, whether the node can
// serve it in time and within its memory. Three rules, each answering 503
// with Retry-After (certainly not applied, retry later) instead of letting
// the request queue:
//
//   - bytes in flight: every request body is charged to a budget
//     (Options.MaxInflightBytes) before it is read, by its Content-Length,
//     or chunk by chunk as it arrives when the length is not declared.
//     Whatever clients do — many large bodies, slow bodies, bodies that
//     never end — the bodies held at once never exceed the budget.
//   - writes in flight: at most Options.MaxInflightWrites writes wait for
//     commit at once.
//   - expected wait: a write that would wait longer than
//     Options.MaxWriteWait is shed at the door. A write that is admitted
//     and then outlives Options.WriteTimeout ends as 504 (outcome
//     unknown), which costs the client a retry and the cluster a possible
//     duplicate proposal; shedding it up front costs neither.
//
// The expected wait comes from Little's law: a newcomer at depth d waits
// about (d+1)/λ, with λ the rate at which this node completes writes while
// it has some queued. λ is measured, not derived from a cost per write:
// packed proposals (replica/pack.go) commit every write queued at once in
// one raft entry, so the writes in a deep queue do not cost one after the
// other and a cost per write learnt at a shallow depth, multiplied by a
// deep one, overstates the wait many times over (256 writes on
// one ingest stream shed up to 1.3% of writes that would have committed in
// milliseconds). The rate is completions over busy time (time with a
// write queued; idle time teaches nothing, a quiet node is not a slow
// one): each completion brings the busy interval since the one before, and
// older intervals weigh exp(-(busy time since)/tau), tau = MaxWriteWait/20
// within [5ms, 100ms], so that a slowdown is believed within a few
// entries. The writes of one packed entry complete together and count
// against the interval that produced them, so a deep queue that drains in
// one entry every few milliseconds reads as the fast queue it is, and a
// short stall that ends with one entry completing the whole queue reads as
// one long interval with as many completions: the next newcomer at that
// depth is told about the stall's length, not the stall times the depth.
// While nothing completes the rate stays as it was; two guards keep it
// honest:
//
//   - a write that finds the queue empty is always admitted: it waits
//     behind no one, and it is the probe that lets the estimate recover
//     after a stall (a node that shed everything would never learn that
//     it had become fast again);
//   - a queue that has not completed a write for longer than MaxWriteWait
//     (a stuck fsync, a lost quorum) sheds every newcomer whatever the
//     estimate says: nothing ahead is moving.

// byteBudget is a counting semaphore over bytes that never blocks.
type byteBudget struct {
	limit int64
	used  atomic.Int64
}

// tryAcquire charges n bytes if they fit under the limit.
func (b *byteBudget) tryAcquire(n int64) bool {
	if n <= 0 {
		return true
	}
	for {
		used := b.used.Load()
		if used+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

func (b *byteBudget) release(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

// errBytesInFlight is the 503 for a body the byte budget cannot take.
type errBytesInFlight struct {
	want, used, limit int64
}

func (e *errBytesInFlight) Error() string {
	return fmt.Sprintf("request bodies in flight on this node hold %d of %d bytes (--max-inflight-bytes); this body needs %d more",
		e.used, e.limit, e.want)
}

// errExpectedWait is the 503 for a write that would wait past
// MaxWriteWait.
type errExpectedWait struct {
	wait, max time.Duration
	depth     int
	stalled   bool
}

func (e *errExpectedWait) Error() string {
	if e.stalled {
		return fmt.Sprintf("no write has completed on this node for %v while %d wait (more than --max-write-wait %v); shed rather than time out",
			e.wait.Round(time.Millisecond), e.depth, e.max)
	}
	return fmt.Sprintf("a write here would wait about %v behind %d others, more than --max-write-wait %v; shed rather than time out",
		e.wait.Round(time.Millisecond), e.depth, e.max)
}

// retryAfter is the Retry-After of a shed: the expected wait, rounded up
// to whole seconds, at least 1 and at most 10.
func (e *errExpectedWait) retryAfter() int {
	return min(10, max(1, int(math.Ceil(e.wait.Seconds()))))
}

// The rate's time constant is MaxWriteWait/20 within these bounds. An
// admitted write may wait up to --write-timeout (2 x MaxWriteWait by
// default) before it is a 504, so the rate learnt before a slowdown must
// fade well within MaxWriteWait: at e^-5 after 5 tau. maxRateTau keeps
// that within half a second with a long MaxWriteWait; minRateTau keeps a
// few entries' completions counting together with a tiny one.
const (
	minRateTau = 5 * time.Millisecond
	maxRateTau = 100 * time.Millisecond
)

// writeQueue bounds the writes waiting for commit on this node, by count
// and by expected wait (see the Admission comment above).
type writeQueue struct {
	limit   int
	maxWait time.Duration
	now     func() time.Time // monotonic; tests substitute their own

	mu        sync.Mutex
	depth     int
	busySince time.Time // when depth last rose from 0
	lastDone  time.Time // last completion that said how long commit takes
	// The drain rate (see the Admission comment): doneW completions over
	// busyW seconds of busy time, each completion's interval (the busy
	// time since the one before) weighted exp(-(busy time since)/tau).
	// doneW == 0: no completion measured yet.
	doneW, busyW float64
	pendingBusy  float64   // busy seconds since the last timed completion
	lastEvent    time.Time // when pendingBusy was last brought up to date
}

// writeTicket is one admitted write.
type writeTicket struct {
	q *writeQueue
}

// tauLocked is the rate's time constant in seconds.
func (q *writeQueue) tauLocked() float64 {
	return min(max(q.maxWait/20, minRateTau), maxRateTau).Seconds()
}

// accrueLocked adds the busy time since the last event (time with
// depth > 0; idle time does not count) to pendingBusy. Called at every
// admission and completion, before depth changes.
func (q *writeQueue) accrueLocked(now time.Time) {
	if q.depth > 0 {
		if dt := now.Sub(q.lastEvent).Seconds(); dt > 0 {
			q.pendingBusy += dt
		}
	}
	q.lastEvent = now
}

// completedLocked records one timed completion: the rate's memory decays
// by the busy time since the previous one, and that interval enters at
// full weight. The interval is not folded in continuously: when entries
// commit further apart than tau (a slow disk), the last interval is the
// whole measure of the rate, not tau's share of it. The completions of
// one packed entry arrive together, and all but the first bring an
// interval of about 0: the entry's writes count against the interval
// that produced them.
func (q *writeQueue) completedLocked() {
	keep := math.Exp(-q.pendingBusy / q.tauLocked())
	q.doneW = q.doneW*keep + 1
	q.busyW = q.busyW*keep + q.pendingBusy
	q.pendingBusy = 0
}

// drainRateLocked is the measured completions per second while busy, 0
// before the first measurement.
func (q *writeQueue) drainRateLocked() float64 {
	if q.doneW == 0 {
		return 0
	}
	return q.doneW / max(q.busyW, 1e-6)
}

// expectedLocked returns how long a newcomer would wait and whether the
// queue is stalled.
func (q *writeQueue) expectedLocked(now time.Time) (time.Duration, bool) {
	if q.depth == 0 {
		return 0, false
	}
	progress := q.lastDone
	if q.busySince.After(progress) {
		progress = q.busySince
	}
	if stalled := now.Sub(progress); stalled > q.maxWait {
		return stalled, true
	}
	rate := q.drainRateLocked()
	if rate <= 0 {
		return 0, false // nothing measured yet: the count bound alone
	}
	return time.Duration(math.Round(float64(q.depth+1) / rate * float64(time.Second))), false
}

// check reports, without admitting, whether a write arriving now would be
// shed: the cheap look before a body is read.
func (q *writeQueue) check() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.refuseLocked(q.now())
}

func (q *writeQueue) refuseLocked(now time.Time) error {
	if q.depth >= q.limit {
		return ErrQueueFull
	}
	if wait, stalled := q.expectedLocked(now); wait > q.maxWait {
		return &errExpectedWait{wait: wait, max: q.maxWait, depth: q.depth, stalled: stalled}
	}
	return nil
}

// admit takes a place in the queue or says why not.
func (q *writeQueue) admit() (*writeTicket, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if err := q.refuseLocked(now); err != nil {
		return nil, err
	}
	q.accrueLocked(now)
	if q.depth == 0 {
		q.busySince = now
	}
	q.depth++
	return &writeTicket{q: q}, nil
}

// done leaves the queue. timed says whether the outcome measured how fast
// commits complete here (acknowledged, refused by apply, or timed out); a
// write refused before it was proposed (no leader, raft's own bound) says
// nothing about the queue's speed, though the busy time it spent queued
// still counts.
func (t *writeTicket) done(timed bool) {
	q := t.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	q.accrueLocked(now)
	q.depth--
	if !timed {
		return
	}
	q.lastDone = now
	q.completedLocked()
}

// inflight is the queue's depth (the tidal_http_writes_inflight gauge).
func (q *writeQueue) inflight() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.depth
}

// expectedWait is what a write arriving now would wait, for the
// tidal_http_write_expected_wait_seconds gauge.
func (q *writeQueue) expectedWait() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	w, _ := q.expectedLocked(q.now())
	return w
}

// shedReason names an admission refusal for tidal_http_shed_total.
func shedReason(err error) string {
	var ew *errExpectedWait
	var eb *errBytesInFlight
	var ec *errClock
	var em *errMemory
	switch {
	case errors.As(err, &em):
		return "memory"
	case errors.Is(err, ErrQueueFull):
		return "inflight_writes"
	case errors.As(err, &ew):
		return "expected_wait"
	case errors.As(err, &eb):
		return "inflight_bytes"
	case errors.As(err, &ec) && ec.read:
		return "clock_read"
	case errors.As(err, &ec):
		return "clock"
	}
	return ""
}
