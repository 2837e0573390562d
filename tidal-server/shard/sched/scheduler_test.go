package sched_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/shard/sched"
)

// guard is a handler that detects a group processed by two calls at once:
// an atomic flag per group, set for the length of a call, and a plain
// counter the race detector watches.
type guard struct {
	in         []atomic.Int32
	calls      []int // written only inside a call: a race if calls overlap
	violations atomic.Int64
	inside     func(group uint64, w sched.Work) // optional, runs inside the call
}

func newGuard(groups int) *guard {
	return &guard{in: make([]atomic.Int32, groups), calls: make([]int, groups)}
}

func (g *guard) ProcessGroup(group uint64, w sched.Work) {
	if !g.in[group].CompareAndSwap(0, 1) {
		g.violations.Add(1)
		return
	}
	g.calls[group]++
	if g.inside != nil {
		g.inside(group, w)
	}
	g.in[group].Store(0)
}

// call is one recorded ProcessGroup call.
type call struct {
	group uint64
	work  sched.Work
}

// recorder records calls in the order they started.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(group uint64, w sched.Work) {
	r.mu.Lock()
	r.calls = append(r.calls, call{group, w})
	r.mu.Unlock()
}

func (r *recorder) of(group uint64) []sched.Work {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws []sched.Work
	for _, c := range r.calls {
		if c.group == group {
			ws = append(ws, c.work)
		}
	}
	return ws
}

func register(t *testing.T, s *sched.Scheduler, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		if err := s.Register(id); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline: it waits for something to happen, it times nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoConcurrentProcessingOfAGroup drives many workers, enqueuers, ticks,
// quiescence and self-enqueues at a few groups, and checks no group's
// calls ever overlapped (the guard, and -race on its plain counters).
func TestNoConcurrentProcessingOfAGroup(t *testing.T) {
	const groups, workers, enqueuers, perEnqueuer = 8, 8, 4, 3000
	g := newGuard(groups)
	var s *sched.Scheduler
	g.inside = func(group uint64, w sched.Work) {
		for range int(group) % 3 {
			runtime.Gosched() // widen the window for an overlap
		}
		switch g.calls[group] % 7 {
		case 0:
			s.Enqueue(group, sched.Custom)
		case 3:
			s.Quiesce(group)
		}
	}
	s = sched.New(g, sched.Config{Workers: workers})
	for id := range uint64(groups) {
		register(t, s, id)
	}
	var wg sync.WaitGroup
	for e := range enqueuers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(e), 1))
			flags := []sched.Flags{sched.Ready, sched.Message, sched.Custom, sched.Ready | sched.Message}
			for range perEnqueuer {
				s.Enqueue(rng.Uint64N(groups), flags[rng.IntN(len(flags))])
				if rng.IntN(8) == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 300 {
			s.Tick()
			runtime.Gosched()
		}
	}()
	wg.Wait()
	s.Stop()
	if v := g.violations.Load(); v != 0 {
		t.Fatalf("a group was processed by two calls at once %d times, want never", v)
	}
	total := 0
	for _, c := range g.calls {
		total += c
	}
	if st := s.Stats(); uint64(total) != st.Processed || total == 0 {
		t.Fatalf("guard counted %d calls, scheduler %d; want equal and non-zero", total, st.Processed)
	}
}

// TestGuardSaysFalse shows the guard of TestNoConcurrentProcessingOfAGroup
// catches overlapping calls of one group, by making two directly.
func TestGuardSaysFalse(t *testing.T) {
	g := newGuard(1)
	entered, release := make(chan struct{}), make(chan struct{})
	g.inside = func(uint64, sched.Work) {
		close(entered)
		<-release
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.ProcessGroup(0, sched.Work{Flags: sched.Ready})
	}()
	<-entered
	g.ProcessGroup(0, sched.Work{Flags: sched.Ready}) // overlaps the first
	close(release)
	<-done
	if v := g.violations.Load(); v != 1 {
		t.Fatalf("guard saw %d overlapping calls, want 1", v)
	}
}

// blocker makes one group's first call block until released.
type blocker struct {
	rec      recorder
	group    uint64
	entered  chan struct{}
	release  chan struct{}
	once     sync.Once
	finished atomic.Bool // the blocked call returned
	inside   func(group uint64, w sched.Work)
}

func newBlocker(group uint64) *blocker {
	return &blocker{group: group, entered: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocker) ProcessGroup(group uint64, w sched.Work) {
	b.rec.add(group, w)
	if b.inside != nil {
		b.inside(group, w)
	}
	if group != b.group {
		return
	}
	first := false
	b.once.Do(func() { first = true })
	if first {
		close(b.entered)
		<-b.release
		b.finished.Store(true)
	}
}

func TestEnqueuesCoalesce(t *testing.T) {
	b := newBlocker(1)
	s := sched.New(b, sched.Config{Workers: 4})
	register(t, s, 1)
	s.Enqueue(1, sched.Ready)
	<-b.entered
	for i := range 1000 {
		f := []sched.Flags{sched.Message, sched.Custom}[i%2]
		if !s.Enqueue(1, f) {
			t.Fatalf("Enqueue %d of a registered group returned false", i)
		}
	}
	if st := s.Stats(); st.Queued != 0 {
		t.Fatalf("queue length %d while the group runs, want 0: a running group has no second entry", st.Queued)
	}
	close(b.release)
	s.Stop()
	got := b.rec.of(1)
	want := []sched.Work{{Flags: sched.Ready}, {Flags: sched.Message | sched.Custom}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("calls of group 1 after 1 + 1000 enqueues: %v, want %v", got, want)
	}
	if st := s.Stats(); st.Enqueued != 1001 || st.Coalesced != 1000 || st.Processed != 2 {
		t.Fatalf("stats: enqueued %d coalesced %d processed %d, want 1001 1000 2", st.Enqueued, st.Coalesced, st.Processed)
	}
}

func TestEnqueueDuringProcessingIsNotLost(t *testing.T) {
	b := newBlocker(1)
	g := newGuard(2)
	s := sched.New(b, sched.Config{Workers: 4})
	register(t, s, 1)
	b.inside = func(group uint64, w sched.Work) {
		g.ProcessGroup(group, w)
		if w.Flags == sched.Ready {
			s.Enqueue(1, sched.Custom) // from inside its own call
		}
	}
	s.Enqueue(1, sched.Ready)
	<-b.entered
	s.Enqueue(1, sched.Message) // from outside, while it runs
	close(b.release)
	waitFor(t, "group 1's second call", func() bool { return len(b.rec.of(1)) == 2 })
	s.Stop()
	got := b.rec.of(1)
	if len(got) != 2 || got[1].Flags != sched.Custom|sched.Message {
		t.Fatalf("calls of group 1: %v, want a second call with custom|message", got)
	}
	if v := g.violations.Load(); v != 0 {
		t.Fatalf("group 1's second call overlapped its first")
	}
}

// TestFloodDoesNotStarveOthers floods one group with enqueues, from
// outside and from its own calls, and checks that another group enqueued
// meanwhile waits for at most one of the flooded group's calls (one
// worker, FIFO).
func TestFloodDoesNotStarveOthers(t *testing.T) {
	var calls1 atomic.Int64
	var calls1AtTwo atomic.Int64
	twoDone := make(chan struct{})
	var s *sched.Scheduler
	s = sched.New(sched.HandlerFunc(func(group uint64, w sched.Work) {
		switch group {
		case 1:
			calls1.Add(1)
			s.Enqueue(1, sched.Custom)
		case 2:
			calls1AtTwo.Store(calls1.Load())
			close(twoDone)
		}
	}), sched.Config{Workers: 1})
	register(t, s, 1, 2)
	stopFlood := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for {
			select {
			case <-stopFlood:
				return
			default:
				s.Enqueue(1, sched.Message)
			}
		}
	}()
	waitFor(t, "group 1 to be processed 3 times", func() bool { return calls1.Load() >= 3 })
	s.Enqueue(2, sched.Message)
	before := calls1.Load()
	<-twoDone
	close(stopFlood)
	<-flooded
	s.Stop()
	if n := calls1AtTwo.Load() - before; n > 1 {
		t.Fatalf("group 2 waited for %d calls of the flooded group 1, want at most 1", n)
	}
}

func TestTicksAreCapped(t *testing.T) {
	b := newBlocker(1)
	s := sched.New(b, sched.Config{Workers: 1, MaxTicks: 3})
	register(t, s, 1)
	s.Tick()
	<-b.entered
	for range 10 {
		s.Tick()
	}
	close(b.release)
	s.Stop()
	got := b.rec.of(1)
	want := []sched.Work{{Flags: sched.Tick, Ticks: 1}, {Flags: sched.Tick, Ticks: 3}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("calls of group 1 for 1 tick, then 10 while it ran: %v, want %v", got, want)
	}
	if st := s.Stats(); st.TicksDropped != 7 || st.Ticks != 11 {
		t.Fatalf("stats: ticks %d dropped %d, want 11 and 7", st.Ticks, st.TicksDropped)
	}
}

func TestQuiescence(t *testing.T) {
	var woken atomic.Bool
	var early atomic.Int64 // calls of group 1 before it was woken
	var rec recorder
	s := sched.New(sched.HandlerFunc(func(group uint64, w sched.Work) {
		if group == 1 && !woken.Load() {
			early.Add(1)
		}
		rec.add(group, w)
	}), sched.Config{Workers: 2})
	register(t, s, 1, 2)
	if !s.Quiesce(1) || !s.Quiescent(1) {
		t.Fatal("Quiesce of an idle group refused")
	}
	for range 3 {
		s.Tick()
	}
	if st := s.Stats(); st.Ticks != 3 || st.Active != 1 {
		t.Fatalf("3 ticks with group 1 of 2 quiescent: %d groups marked, %d active; want 3 and 1", st.Ticks, st.Active)
	}
	woken.Store(true)
	s.Enqueue(1, sched.Message)
	if s.Quiescent(1) {
		t.Fatal("group 1 still quiescent after a message for it")
	}
	waitFor(t, "group 1's message call", func() bool { return len(rec.of(1)) == 1 })
	s.Tick()
	waitFor(t, "group 1's tick after waking", func() bool {
		ws := rec.of(1)
		return len(ws) == 2 && ws[1].Flags == sched.Tick
	})
	s.Stop()
	if n := early.Load(); n != 0 {
		t.Fatalf("group 1 was processed %d times while quiescent, want 0", n)
	}
	if got := rec.of(1)[0]; got.Flags&sched.Message == 0 {
		t.Fatalf("group 1's first call %v, want the message", got)
	}
	if st := s.Stats(); st.Woken != 1 {
		t.Fatalf("stats: woken %d, want 1", st.Woken)
	}
}

// TestQuiesceRefusesPendingWork: work arriving between the handler's look
// and its Quiesce keeps the group awake, and is processed.
func TestQuiesceRefusesPendingWork(t *testing.T) {
	var rec recorder
	var results []bool
	var s *sched.Scheduler
	s = sched.New(sched.HandlerFunc(func(group uint64, w sched.Work) {
		rec.add(group, w)
		if w.Flags&sched.Ready != 0 {
			s.Enqueue(group, sched.Message) // arrives after the handler looked
		}
		results = append(results, s.Quiesce(group))
	}), sched.Config{Workers: 1})
	register(t, s, 1)
	s.Enqueue(1, sched.Ready)
	waitFor(t, "group 1 to quiesce", func() bool { return s.Quiescent(1) })
	s.Tick()
	s.Stop()
	if len(results) != 2 || results[0] || !results[1] {
		t.Fatalf("Quiesce results in group 1's calls: %v, want [false true]", results)
	}
	if got := rec.of(1); len(got) != 2 || got[1].Flags != sched.Message {
		t.Fatalf("calls of group 1: %v, want ready, then message, and no tick once quiescent", got)
	}
	if s.Quiesce(7) {
		t.Fatal("Quiesce of an unregistered group succeeded")
	}
}

// TestQuiesceDropsOwedTicks: a group quiesced while queued with only ticks
// pending is not called.
func TestQuiesceDropsOwedTicks(t *testing.T) {
	b := newBlocker(2)
	s := sched.New(b, sched.Config{Workers: 1})
	register(t, s, 2, 1)
	s.Enqueue(2, sched.Custom)
	<-b.entered
	s.Tick() // queues group 1 with a tick, behind the running group 2
	if !s.Quiesce(1) {
		t.Fatal("Quiesce of a group owing only ticks refused")
	}
	close(b.release)
	s.Stop()
	if got := b.rec.of(1); len(got) != 0 {
		t.Fatalf("calls of group 1, quiesced while a tick was queued: %v, want none", got)
	}
}

func TestStopDrains(t *testing.T) {
	const groups = 10
	b := newBlocker(0)
	s := sched.New(b, sched.Config{Workers: 1})
	for id := range uint64(groups) {
		register(t, s, id)
		s.Enqueue(id, sched.Custom)
	}
	<-b.entered
	stopped := make(chan struct{})
	go func() {
		s.Stop()
		close(stopped)
	}()
	waitFor(t, "Stop to refuse work", func() bool { return !s.Enqueue(3, sched.Message) })
	select {
	case <-stopped:
		t.Fatal("Stop returned while a call was in progress")
	case <-time.After(20 * time.Millisecond):
	}
	close(b.release)
	<-stopped
	if !b.finished.Load() {
		t.Fatal("Stop returned before the call in progress did")
	}
	for id := range uint64(groups) {
		// Group 3 may also carry the probe's message, accepted before
		// Stop began.
		if got := b.rec.of(id); len(got) != 1 || got[0].Flags&^sched.Message != sched.Custom {
			t.Errorf("calls of group %d queued before Stop: %v, want one custom", id, got)
		}
	}
	s.Tick()
	if err := s.Register(99); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Fatalf("Register after Stop: %v, want an error saying the scheduler is stopping", err)
	}
	if st := s.Stats(); st.Processed != groups {
		t.Fatalf("processed %d calls, want %d: nothing after Stop", st.Processed, groups)
	}
	s.Stop() // a second Stop returns
}

func TestUnregister(t *testing.T) {
	b := newBlocker(1)
	s := sched.New(b, sched.Config{Workers: 1})
	register(t, s, 1, 2)
	s.Enqueue(1, sched.Ready)
	<-b.entered
	s.Enqueue(2, sched.Ready) // queued behind the running group 1
	s.Enqueue(1, sched.Ready)
	if !s.Unregister(1) || !s.Unregister(2) {
		t.Fatal("Unregister of a registered group returned false")
	}
	if s.Unregister(2) {
		t.Fatal("second Unregister of group 2 returned true")
	}
	err := s.Register(1)
	if err == nil || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("Register of group 1 while its last call runs: %v, want an error saying it is still running", err)
	}
	if s.Enqueue(1, sched.Message) {
		t.Fatal("Enqueue of an unregistered group returned true")
	}
	close(b.release)
	waitFor(t, "group 1's last call to end", func() bool { return s.Register(1) == nil })
	s.Stop()
	if got := b.rec.of(1); len(got) != 1 {
		t.Fatalf("calls of group 1: %v, want only the one running at Unregister", got)
	}
	if got := b.rec.of(2); len(got) != 0 {
		t.Fatalf("calls of group 2, unregistered while queued: %v, want none", got)
	}
}

func TestEnqueueRefusesTick(t *testing.T) {
	s := sched.New(sched.HandlerFunc(func(uint64, sched.Work) {}), sched.Config{})
	defer s.Stop()
	register(t, s, 1)
	for _, f := range []sched.Flags{0, sched.Tick, sched.Tick | sched.Message} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "want a non-empty set") {
					t.Errorf("Enqueue with %v: recovered %v, want a panic naming the accepted flags", f, r)
				}
			}()
			s.Enqueue(1, f)
		}()
	}
	if st := s.Stats(); st.Workers < 2 {
		t.Fatalf("default workers %d, want at least 2", st.Workers)
	}
}

func TestFlagsString(t *testing.T) {
	for f, want := range map[sched.Flags]string{
		0:                            "none",
		sched.Ready | sched.Tick:     "ready|tick",
		sched.Message | sched.Custom: "message|custom",
		sched.Ready | 0x80:           "ready|0x80",
	} {
		if got := f.String(); got != want {
			t.Errorf("Flags(%#x).String() = %q, want %q", uint8(f), got, want)
		}
	}
}

func TestObserveAndStats(t *testing.T) {
	var mu sync.Mutex
	var groups []uint64
	var wait, run time.Duration
	s := sched.New(sched.HandlerFunc(func(uint64, sched.Work) {}), sched.Config{
		Workers: 2,
		Observe: func(group uint64, w, r time.Duration) {
			mu.Lock()
			groups = append(groups, group)
			wait += w
			run += r
			mu.Unlock()
		},
	})
	register(t, s, 1, 2, 3)
	s.Quiesce(3)
	s.Enqueue(1, sched.Ready)
	s.Enqueue(2, sched.Custom)
	s.Stop()
	st := s.Stats()
	if len(groups) != 2 || st.Processed != 2 {
		t.Fatalf("Observe saw calls of %v, stats %d calls; want groups 1 and 2, 2 calls", groups, st.Processed)
	}
	if wait < 0 || run < 0 || st.WaitNanos != uint64(wait) || st.RunNanos != uint64(run) {
		t.Fatalf("Observe summed wait %v run %v, stats %dns %dns; want equal and not negative", wait, run, st.WaitNanos, st.RunNanos)
	}
	if st.Groups != 3 || st.Active != 2 || st.Queued != 0 || st.Running != 0 || st.Workers != 2 {
		t.Fatalf("stats after Stop: %+v, want 3 groups, 2 active, none queued or running, 2 workers", st)
	}
}

// TestFIFO: with one worker, groups are processed in the order they were
// first enqueued, and a group enqueued again while running goes behind
// those already waiting.
func TestFIFO(t *testing.T) {
	b := newBlocker(0)
	s := sched.New(b, sched.Config{Workers: 1})
	register(t, s, 0, 1, 2, 3, 4, 5)
	s.Enqueue(0, sched.Ready)
	<-b.entered
	for _, id := range []uint64{4, 2, 5} {
		s.Enqueue(id, sched.Message)
	}
	s.Enqueue(0, sched.Message) // running: queued again when its call returns, behind all then waiting
	for _, id := range []uint64{1, 2, 3} {
		s.Enqueue(id, sched.Message) // 2 is already queued: keeps its place
	}
	close(b.release)
	s.Stop()
	var order []uint64
	for _, c := range b.rec.calls {
		order = append(order, c.group)
	}
	want := []uint64{0, 4, 2, 5, 1, 3, 0}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("processing order %v, want %v", order, want)
	}
}
