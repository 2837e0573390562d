package api

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a monotonic clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newQueue(clock *fakeClock) *writeQueue {
	return &writeQueue{limit: 100, maxWait: 500 * time.Millisecond, now: clock.now}
}

// newDeepQueue is newQueue with room for thousands of writes (the
// default --max-inflight-writes is 4096), so that only the expected wait
// sheds.
func newDeepQueue(clock *fakeClock) *writeQueue {
	q := newQueue(clock)
	q.limit = 4096
	return q
}

func wantShed(t *testing.T, err error, stalled bool) *errExpectedWait {
	t.Helper()
	var ew *errExpectedWait
	if !errors.As(err, &ew) {
		t.Fatalf("got %v, want a shed for expected wait", err)
	}
	if ew.stalled != stalled {
		t.Fatalf("shed %v: stalled = %v, want %v", ew, ew.stalled, stalled)
	}
	return ew
}

// Regression: admission was a count alone (4096), so
// under overload writes queued until they outlived the write timeout and
// ended as 504 (outcome unknown). The queue now estimates a newcomer's
// wait from recent commit latency and depth and sheds it up front.
func TestWriteQueueShedsAWriteExpectedToWaitTooLong(t *testing.T) {
	clock := newFakeClock()
	q := newQueue(clock)

	// One write alone takes 300ms: each write ahead costs 300ms.
	a, err := q.admit()
	if err != nil {
		t.Fatalf("the first write was refused: %v", err)
	}
	clock.advance(300 * time.Millisecond)
	a.done(true)

	// A newcomer at depth 0 waits behind no one: always admitted.
	b, err := q.admit()
	if err != nil {
		t.Fatalf("a write at an empty queue was refused: %v", err)
	}
	// At depth 1 it would wait about 2 x 300ms > 500ms: shed, before and
	// at admission.
	ew := wantShed(t, q.check(), false)
	if ew.wait != 600*time.Millisecond || ew.depth != 1 {
		t.Fatalf("expected wait %v at depth %d, want 600ms at depth 1", ew.wait, ew.depth)
	}
	if _, err := q.admit(); err == nil {
		t.Fatal("admit took a write check refused")
	}
	if ew.retryAfter() != 1 {
		t.Fatalf("Retry-After %d for a 600ms wait, want 1", ew.retryAfter())
	}
	if !strings.Contains(ew.Error(), "--max-write-wait") {
		t.Fatalf("message %q does not name --max-write-wait", ew)
	}
	clock.advance(time.Millisecond)
	b.done(true)

	// Fast completions bring the estimate down again (b cost 1ms):
	// after enough of them a queue of 10 admits.
	for i := 0; i < 200; i++ {
		w, err := q.admit()
		if err != nil {
			t.Fatalf("write %d at an empty queue refused: %v", i, err)
		}
		clock.advance(time.Millisecond)
		w.done(true)
	}
	var held []*writeTicket
	for i := 0; i < 10; i++ {
		w, err := q.admit()
		if err != nil {
			t.Fatalf("after the queue sped up to 1ms a write, write %d of 10 was refused: %v", i, err)
		}
		held = append(held, w)
	}
	for _, w := range held {
		w.done(true)
	}
}

// TestWriteQueueShedsWhileNothingCompletes: a queue that has not completed
// a write for longer than MaxWriteWait (a stuck disk, a lost quorum) sheds
// whatever its estimate says, and recovers once a write completes.
func TestWriteQueueShedsWhileNothingCompletes(t *testing.T) {
	clock := newFakeClock()
	q := newQueue(clock)
	warm, _ := q.admit()
	clock.advance(time.Millisecond)
	warm.done(true) // 1ms a write: the estimate alone would admit 400

	stuck, err := q.admit()
	if err != nil {
		t.Fatal(err)
	}
	clock.advance(400 * time.Millisecond)
	if err := q.check(); err != nil {
		t.Fatalf("shed after 400ms without a completion (max wait 500ms): %v", err)
	}
	clock.advance(200 * time.Millisecond)
	ew := wantShed(t, q.check(), true)
	if ew.wait != 600*time.Millisecond {
		t.Fatalf("stalled for %v, want 600ms", ew.wait)
	}
	stuck.done(true)
	if err := q.check(); err != nil {
		t.Fatalf("an empty queue refused a write: %v", err)
	}
}

// TestWriteQueueCountsOnlyTimedOutcomes: writes refused before proposing
// (no leader) leave the queue but teach it nothing about commit latency.
func TestWriteQueueCountsOnlyTimedOutcomes(t *testing.T) {
	clock := newFakeClock()
	q := newQueue(clock)
	w, _ := q.admit()
	clock.advance(10 * time.Second)
	w.done(false)
	if rate := q.drainRateLocked(); rate != 0 || q.inflight() != 0 {
		t.Fatalf("an untimed outcome set the drain rate to %v/s (depth %d), want no sample and depth 0", rate, q.inflight())
	}
}

// packSim drives a writeQueue as a packing node does: writes queue, and
// a packed entry completes every write queued before it at once. It keeps
// each admitted write's admission time, so a test can see how long the
// writes the queue admitted really waited.
type packSim struct {
	t       *testing.T
	clock   *fakeClock
	q       *writeQueue
	queued  []simWrite
	shed    int
	maxWait time.Duration // the longest an admitted write waited
	order   *rand.Rand    // the order a packed entry's answers leave in
}

func newPackSim(t *testing.T, clock *fakeClock) *packSim {
	return &packSim{t: t, clock: clock, q: newDeepQueue(clock), order: rand.New(rand.NewPCG(14, 4))}
}

type simWrite struct {
	ticket   *writeTicket
	admitted time.Time
}

// arrive offers one write; it reports whether it was admitted.
func (s *packSim) arrive() bool {
	s.t.Helper()
	tk, err := s.q.admit()
	if err != nil {
		wantShed(s.t, err, false)
		s.shed++
		return false
	}
	s.queued = append(s.queued, simWrite{tk, s.clock.now()})
	return true
}

// commit completes the first n queued writes (all of them when n < 0 or
// more than are queued): one packed entry. Their answers leave in an
// order of the scheduler's choosing (a seeded shuffle here), not in the
// order they were admitted.
func (s *packSim) commit(n int) {
	if n < 0 || n > len(s.queued) {
		n = len(s.queued)
	}
	now := s.clock.now()
	pack := s.queued[:n]
	s.order.Shuffle(len(pack), func(i, j int) { pack[i], pack[j] = pack[j], pack[i] })
	for _, w := range pack {
		s.maxWait = max(s.maxWait, now.Sub(w.admitted))
		w.ticket.done(true)
	}
	s.queued = s.queued[n:]
}

// closedLoopRounds runs rounds of 256 closed-loop writers against a node
// that packs: all 256 arrive over 5ms (the answers of the last entry
// reach their writers one by one), then the entry carrying them commits
// 5ms later.
func (s *packSim) closedLoopRounds(rounds int) {
	for r := 0; r < rounds; r++ {
		for i := 0; i < 256; i++ {
			s.arrive()
			s.clock.advance(20 * time.Microsecond)
		}
		s.clock.advance(5 * time.Millisecond)
		s.commit(-1)
	}
}

// Regression (admission over the stream; admitted writes still meet
// their deadline):
// the estimate was depth x a cost per write learnt as latency/(depth at
// admission + 1), which assumes the writes ahead commit one after the
// other. With packed proposals 256 queued writes commit together in
// ~10ms, but the writes admitted first in each round (depth 0..few) waited
// the whole round, taught a cost of ~10ms a write, and the estimate at
// depth 255 came to seconds: the node shed writes that would have
// committed in milliseconds. The queue now divides the depth by the
// measured drain rate, and admits the deep queue.
func TestWriteQueueAdmitsADeepQueueThatDrainsInPacks(t *testing.T) {
	clock := newFakeClock()
	s := newPackSim(t, clock) // max wait 500ms
	s.closedLoopRounds(100)
	if s.shed != 0 {
		t.Fatalf("shed %d of %d writes from 256 writers whose queue commits every 10ms (max wait 500ms); drain rate %.0f/s",
			s.shed, 100*256, s.q.drainRateLocked())
	}

	// A scheduler stall of 300ms (under the 500ms max wait) holds a full
	// queue; then its entry commits and the writers come back at once.
	// The stall's busy time without completions must not turn into a burst
	// of sheds once the queue moves again.
	for i := 0; i < 256; i++ {
		s.arrive()
	}
	clock.advance(300 * time.Millisecond)
	s.commit(-1)
	s.closedLoopRounds(10)
	if s.shed != 0 {
		t.Fatalf("shed %d writes after a 300ms stall (max wait 500ms); drain rate %.0f/s", s.shed, s.q.drainRateLocked())
	}
}

// TestWriteQueueShedsWhenTheDrainCannotMeetTheDeadline is the other side
// of the packing fix: open-loop writes arrive at
// 500/s at a node that completes 100/s (an entry of 10 every 100ms), for
// 10s. The queue must shed the excess, and every write it admits must
// complete within the write timeout (2 x max wait): an admitted write
// that outlives it is a 504, outcome unknown.
func TestWriteQueueShedsWhenTheDrainCannotMeetTheDeadline(t *testing.T) {
	clock := newFakeClock()
	s := newPackSim(t, clock) // max wait 500ms, write timeout 1s
	q := s.q
	admitted := 0
	for ms := 1; ms <= 10000; ms++ {
		clock.advance(time.Millisecond)
		if ms%2 == 0 && s.arrive() {
			admitted++
		}
		if ms%100 == 0 {
			s.commit(10)
		}
	}
	t.Logf("admitted %d, shed %d, longest wait of an admitted write %v, drain rate %.0f/s", admitted, s.shed, s.maxWait, q.drainRateLocked())
	if s.shed == 0 {
		t.Fatalf("no write shed while 500/s arrived at a node completing 100/s; depth %d", q.inflight())
	}
	if admitted > 1100+100 { // what 10s at 100/s drains, plus the queue left
		t.Fatalf("admitted %d writes in 10s at a node completing 100/s", admitted)
	}
	if s.maxWait > 2*q.maxWait {
		t.Fatalf("an admitted write waited %v, past the write timeout %v: it would have ended 504", s.maxWait, 2*q.maxWait)
	}

	// The same node after a fast phase (packs of 256 every 10ms): the
	// rate it learnt there must give way within the write timeout when
	// the drain slows to 100/s under the same overload.
	clock = newFakeClock()
	s = newPackSim(t, clock)
	q = s.q
	s.closedLoopRounds(100)
	for ms := 1; ms <= 5000; ms++ {
		clock.advance(time.Millisecond)
		if ms%2 == 0 {
			s.arrive()
		}
		if ms%100 == 0 {
			s.commit(10)
		}
	}
	t.Logf("after a fast phase: shed %d, longest wait of an admitted write %v, drain rate %.0f/s", s.shed, s.maxWait, q.drainRateLocked())
	if s.shed == 0 {
		t.Fatal("no write shed once the drain slowed from ~25,000/s to 100/s under 500/s of arrivals")
	}
	if s.maxWait > 2*q.maxWait {
		t.Fatalf("after a slowdown an admitted write waited %v, past the write timeout %v: it would have ended 504", s.maxWait, 2*q.maxWait)
	}
}

func TestWriteQueueBoundsTheCount(t *testing.T) {
	clock := newFakeClock()
	q := &writeQueue{limit: 2, maxWait: time.Hour, now: clock.now}
	q.admit()
	q.admit()
	if _, err := q.admit(); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third write with a limit of 2: %v, want ErrQueueFull", err)
	}
}

// TestExpectedWaitShedsBeforeTheBodyIsRead runs the rule through the
// handler: with a write held and commits known to take 300ms, the next
// write (max wait 500ms) is shed with 503 and Retry-After, never reaches
// the backend, and is counted by reason.
func TestExpectedWaitShedsBeforeTheBodyIsRead(t *testing.T) {
	clock := newFakeClock()
	e := newEnv(t, Options{WriteTimeout: time.Second, monotonic: clock.now})
	e.fake.onWrite = func(context.Context) error { clock.advance(300 * time.Millisecond); return nil }
	want204(t, e.post("/v1/signals", `{"events":[{"id":"warm","entity":1,"signal":"view"}]}`))

	entered, release := make(chan struct{}), make(chan struct{})
	e.fake.onWrite = func(context.Context) error { close(entered); <-release; return nil }
	done := make(chan int)
	go func() {
		done <- e.post("/v1/signals", `{"events":[{"id":"held","entity":1,"signal":"view"}]}`).Code
	}()
	<-entered
	e.fake.onWrite = nil
	calls := e.fake.writeCalls.Load()
	body := &readCounter{r: strings.NewReader(`{"events":[{"id":"shed","entity":1,"signal":"view"}]}`)}
	req, _ := http.NewRequest(http.MethodPost, "/v1/signals", body)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	wantError(t, rec, http.StatusServiceUnavailable, CodeUnavailable, "")
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q, want 1", rec.Header().Get("Retry-After"))
	}
	if body.n != 0 {
		t.Fatalf("the shed write's body was read (%d bytes)", body.n)
	}
	if e.fake.writeCalls.Load() != calls {
		t.Fatal("a shed write reached the backend")
	}
	if got := metricValue(t, e, `tidal_http_shed_total{reason="expected_wait"}`); got != 1 {
		t.Fatalf(`tidal_http_shed_total{reason="expected_wait"} = %v, want 1`, got)
	}
	if got := metricValue(t, e, "tidal_http_write_expected_wait_seconds"); got != 0.6 {
		t.Fatalf("tidal_http_write_expected_wait_seconds = %v, want 0.6", got)
	}
	close(release)
	if code := <-done; code != http.StatusNoContent {
		t.Fatalf("the held write answered %d, want 204", code)
	}
	want204(t, e.post("/v1/signals", `{"events":[{"id":"after","entity":1,"signal":"view"}]}`))
}

// readCounter counts the bytes read through it.
type readCounter struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
