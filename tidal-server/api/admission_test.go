package api

import (
	"context"
	"errors"
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

// Regression (issue 10 item 4): admission was a count alone (4096), so
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
	if q.perWrite != 0 || q.inflight() != 0 {
		t.Fatalf("an untimed outcome set the estimate to %vs (depth %d), want no sample and depth 0", q.perWrite, q.inflight())
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
