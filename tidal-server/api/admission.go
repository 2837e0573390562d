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
// The expected wait comes from Little's law: in a queue that is moving,
// each write ahead of a newcomer costs about latency/(depth+1) of recent
// writes, so a newcomer at depth d waits about (d+1) times that. Group
// commit makes the cost per write fall as the depth grows, so the estimate
// errs on the side of shedding while a burst starts, and corrects itself
// as the burst's writes complete. Two guards keep it honest:
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

// The per-write cost estimate is a moving average that rises faster than
// it falls: a slowdown (a busy disk, a starved CPU) must shed before the
// writes it would strand time out, while a recovery can afford to be
// believed a little later (a write shed costs a retry; one stranded, an
// unknown outcome).
const (
	ewmaRise = 0.3  // weight of a sample above the estimate
	ewmaFall = 0.05 // weight of a sample below it
)

// writeQueue bounds the writes waiting for commit on this node, by count
// and by expected wait (see the Admission comment above).
type writeQueue struct {
	limit   int
	maxWait time.Duration
	now     func() time.Time // monotonic; tests substitute their own

	mu        sync.Mutex
	depth     int
	perWrite  float64   // seconds each write ahead of a newcomer costs; 0 = no sample yet
	busySince time.Time // when depth last rose from 0
	lastDone  time.Time // last completion that said how long commit takes
}

// writeTicket is one admitted write.
type writeTicket struct {
	q        *writeQueue
	admitted time.Time
	depth    int // writes ahead of it when admitted
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
	return time.Duration(math.Round(float64(q.depth+1) * q.perWrite * float64(time.Second))), false
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
	if q.depth == 0 {
		q.busySince = now
	}
	t := &writeTicket{q: q, admitted: now, depth: q.depth}
	q.depth++
	return t, nil
}

// done leaves the queue. timed says whether the outcome measured how long
// commit takes here (acknowledged, refused by apply, or timed out); a
// write refused before it was proposed (no leader, raft's own bound) says
// nothing about the queue's speed.
func (t *writeTicket) done(timed bool) {
	q := t.q
	q.mu.Lock()
	defer q.mu.Unlock()
	q.depth--
	if !timed {
		return
	}
	now := q.now()
	q.lastDone = now
	cost := now.Sub(t.admitted).Seconds() / float64(t.depth+1)
	switch {
	case q.perWrite == 0:
		q.perWrite = cost
	case cost > q.perWrite:
		q.perWrite += ewmaRise * (cost - q.perWrite)
	default:
		q.perWrite += ewmaFall * (cost - q.perWrite)
	}
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
	switch {
	case errors.Is(err, ErrQueueFull):
		return "inflight_writes"
	case errors.As(err, &ew):
		return "expected_wait"
	case errors.As(err, &eb):
		return "inflight_bytes"
	case errors.As(err, &ec):
		return "clock"
	}
	return ""
}
