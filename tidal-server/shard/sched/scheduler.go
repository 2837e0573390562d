package sched

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Flags is the set of kinds of work pending for a group.
type Flags uint8

const (
	// Ready asks the handler to check for and handle the group's
	// raft.Ready (after a proposal, or a storage write becoming durable).
	Ready Flags = 1 << iota
	// Tick says ticks are owed; Work.Ticks says how many. Only Tick
	// sets it.
	Tick
	// Message says inbound messages wait in the group's inbox.
	Message
	// Custom is for whatever else the caller queues for a group (an admin
	// request, a snapshot to install); the handler knows where to look.
	Custom

	allFlags = Ready | Tick | Message | Custom
	// wakeFlags are the kinds of work that end a group's quiescence.
	wakeFlags = Ready | Message | Custom
)

func (f Flags) String() string {
	if f == 0 {
		return "none"
	}
	var parts []string
	for _, n := range []struct {
		f    Flags
		name string
	}{{Ready, "ready"}, {Tick, "tick"}, {Message, "message"}, {Custom, "custom"}} {
		if f&n.f != 0 {
			parts = append(parts, n.name)
		}
	}
	if rest := f &^ allFlags; rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint8(rest)))
	}
	return strings.Join(parts, "|")
}

// Work is what a group's ProcessGroup call is to do: every kind of work
// enqueued for it since its previous call started.
type Work struct {
	Flags Flags
	// Ticks is the number of ticks to apply, 1..Config.MaxTicks when
	// Flags has Tick, else 0.
	Ticks int
}

// Handler processes groups. ProcessGroup is called by one worker at a
// time per group, and by different workers for different groups at once.
// It may call any Scheduler method except Stop (which waits for it);
// Enqueue of its own group schedules another call after this one.
//
// Order within a call is the handler's; stepping messages before ticks
// keeps a tick from firing an election that a message just received (a
// heartbeat) would have prevented, and both before handling the Ready,
// so it covers what they produced.
type Handler interface {
	ProcessGroup(group uint64, w Work)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(group uint64, w Work)

// ProcessGroup calls f.
func (f HandlerFunc) ProcessGroup(group uint64, w Work) { f(group, w) }

// DefaultMaxTicks caps the ticks owed to a group. A group that owes more
// than one tick missed a tick interval because the workers are behind;
// handing it every tick it missed would advance its election and heartbeat
// clocks in a burst — followers campaigning the moment an overloaded node
// catches up — and make the overload worse. Three tolerates jitter of a
// couple of intervals and is under a third of raft's election timeout
// (ElectionTick 10): a slow node's groups see time pass slower, which
// delays elections rather than causing them.
const DefaultMaxTicks = 3

// Config configures a Scheduler. The zero value is usable.
type Config struct {
	// Workers is the number of worker goroutines; 0 means GOMAXPROCS, but
	// at least 2, so that one group's slow call does not hold up every
	// other group's heartbeats.
	Workers int
	// MaxTicks caps the ticks owed to one group; 0 means
	// DefaultMaxTicks.
	MaxTicks int
	// Observe, if set, is called after each ProcessGroup call, on its
	// worker, with how long the group waited in the queue (from its first
	// pending work to the call) and how long the call ran: the hook for a
	// latency histogram. It must be quick.
	Observe func(group uint64, wait, run time.Duration)
}

// Stats are cumulative counters and gauges, for the caller to export.
type Stats struct {
	Workers int
	Groups  int // registered
	Active  int // registered and not quiescent: what Tick visits
	Queued  int // queue length now
	Running int // ProcessGroup calls in progress now

	Processed    uint64 // ProcessGroup calls
	Enqueued     uint64 // accepted Enqueue calls
	Coalesced    uint64 // of those, how many found the group already queued or running
	Ticks        uint64 // groups marked by Tick
	TicksDropped uint64 // ticks over the cap, never delivered
	Woken        uint64 // quiescent groups woken by Enqueue
	WaitNanos    uint64 // total time groups waited in the queue
	RunNanos     uint64 // total time in ProcessGroup
}

// group is the scheduler's record of one group. Every field is guarded by
// Scheduler.mu.
type group struct {
	id      uint64
	pending Flags
	ticks   int
	// queued is set from the moment the group enters the queue until its
	// call returns with nothing pending: the group is then in the queue
	// or running, never both, and an Enqueue meanwhile only adds flags.
	queued    bool
	running   bool
	quiescent bool
	removed   bool
	// active is the group's index in Scheduler.active, -1 when it is
	// quiescent or removed.
	active int
	// since is when pending became non-empty, for the wait time.
	since time.Time
}

// Scheduler runs ProcessGroup for enqueued groups on a fixed pool of
// workers. See the package documentation for its invariants.
type Scheduler struct {
	h        Handler
	maxTicks int
	workers  int
	observe  func(group uint64, wait, run time.Duration)

	mu     sync.Mutex
	cond   sync.Cond // signalled when the queue gains a group or stopping is set
	groups map[uint64]*group
	// active lists the registered, non-quiescent groups, in no order:
	// Tick visits these only, so quiescent groups cost it nothing.
	active []*group
	// retiring holds unregistered groups whose last call is still
	// running, so the id cannot be registered again (and processed by
	// another worker) until that call returns.
	retiring map[uint64]*group
	queue    ring
	idle     int // workers waiting on cond
	running  int
	stopping bool
	stats    Stats

	done sync.WaitGroup
}

// New starts a Scheduler's workers; they call h. Stop ends them.
func New(h Handler, cfg Config) *Scheduler {
	workers := cfg.Workers
	if workers <= 0 {
		workers = max(2, runtime.GOMAXPROCS(0))
	}
	maxTicks := cfg.MaxTicks
	if maxTicks <= 0 {
		maxTicks = DefaultMaxTicks
	}
	s := &Scheduler{
		h:        h,
		maxTicks: maxTicks,
		workers:  workers,
		observe:  cfg.Observe,
		groups:   make(map[uint64]*group),
		retiring: make(map[uint64]*group),
	}
	s.cond.L = &s.mu
	s.done.Add(workers)
	for range workers {
		go s.worker()
	}
	return s
}

// Register adds group, active (not quiescent) and with nothing pending. It
// refuses a group already registered, and one unregistered whose last call
// is still running: its new registration's calls could otherwise overlap
// that call.
func (s *Scheduler) Register(id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return fmt.Errorf("sched: register group %d: scheduler is stopping", id)
	}
	if _, ok := s.groups[id]; ok {
		return fmt.Errorf("sched: register group %d: already registered", id)
	}
	if _, ok := s.retiring[id]; ok {
		return fmt.Errorf("sched: register group %d: the call of its previous registration is still running", id)
	}
	g := &group{id: id, active: -1}
	s.groups[id] = g
	s.activate(g)
	return nil
}

// Unregister removes group and drops its pending work. No ProcessGroup
// call for it starts after Unregister returns; one in progress may still
// be running, and is the last. A group's own handler can unregister it
// (the usual place: the group learns it was removed while processing),
// and then no call of it runs anywhere else. It returns false if the group
// was not registered.
func (s *Scheduler) Unregister(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[id]
	if !ok {
		return false
	}
	delete(s.groups, id)
	s.deactivate(g)
	g.removed = true
	g.pending, g.ticks = 0, 0
	if g.running {
		s.retiring[id] = g
	}
	return true
}

// Enqueue adds work for group and queues the group unless it is already
// queued or running (a running group is queued again when its call
// returns). Ready, Message or Custom wake a quiescent group: it is ticked
// again from the next Tick. It returns false, dropping the work, if the
// group is not registered or the scheduler is stopping. Tick is not
// accepted here — ticks come only from Tick, which counts and caps them —
// and Enqueue panics if f has it or no flag at all.
func (s *Scheduler) Enqueue(id uint64, f Flags) bool {
	if f == 0 || f&^wakeFlags != 0 {
		panic(fmt.Sprintf("sched: Enqueue of group %d with flags %v: want a non-empty set of ready, message and custom", id, f))
	}
	s.mu.Lock()
	g, ok := s.groups[id]
	if !ok || s.stopping {
		s.mu.Unlock()
		return false
	}
	s.stats.Enqueued++
	if g.quiescent {
		g.quiescent = false
		s.activate(g)
		s.stats.Woken++
	}
	signal := s.addLocked(g, f, time.Now())
	if !signal {
		s.stats.Coalesced++
	}
	s.mu.Unlock()
	if signal {
		s.cond.Signal()
	}
	return true
}

// Tick owes one tick to every active group, up to the cap, and queues
// those not already queued. The node calls it once per tick interval.
func (s *Scheduler) Tick() {
	s.mu.Lock()
	if s.stopping || len(s.active) == 0 {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	n := 0
	for _, g := range s.active {
		if g.ticks < s.maxTicks {
			g.ticks++
		} else {
			s.stats.TicksDropped++
		}
		if s.addLocked(g, Tick, now) {
			n++
		}
	}
	s.stats.Ticks += uint64(len(s.active))
	idle := s.idle
	s.mu.Unlock()
	if n == 0 {
		return
	}
	if n >= idle {
		s.cond.Broadcast()
		return
	}
	for range n {
		s.cond.Signal()
	}
}

// Quiesce marks group quiescent: Tick skips it until an Enqueue wakes it.
// Whether a group may quiesce (a leader whose followers have all of its
// log, nothing proposed or in flight, followers told so) is the caller's
// to decide, normally in the group's own ProcessGroup. Quiesce refuses,
// returning false, while Ready, Message or Custom work is pending — it
// arrived after the caller looked, so the caller must look again when it
// processes it — and if the group is not registered. Ticks owed are
// dropped: a quiescent group's clock stands still.
func (s *Scheduler) Quiesce(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[id]
	if !ok || g.pending&wakeFlags != 0 {
		return false
	}
	if g.quiescent {
		return true
	}
	g.quiescent = true
	s.deactivate(g)
	// An entry still queued with nothing pending is skipped by the worker.
	g.pending &^= Tick
	g.ticks = 0
	return true
}

// Quiescent reports whether group is registered and quiescent.
func (s *Scheduler) Quiescent(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[id]
	return ok && g.quiescent
}

// Stats returns the counters and gauges.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Workers = s.workers
	st.Groups = len(s.groups)
	st.Active = len(s.active)
	st.Queued = s.queue.len()
	st.Running = s.running
	return st
}

// Stop refuses new work (Enqueue returns false, Tick and Register do
// nothing), lets the workers finish the calls in progress and process
// every group still queued, and returns when all workers have exited.
// It must not be called from ProcessGroup, which it would wait for.
// Stop may be called more than once.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.cond.Broadcast()
	s.done.Wait()
}

// addLocked adds f to g's pending work and queues g if it is neither
// queued nor running. It reports whether g entered the queue.
func (s *Scheduler) addLocked(g *group, f Flags, now time.Time) bool {
	if g.pending == 0 {
		g.since = now
	}
	g.pending |= f
	if g.queued {
		return false
	}
	g.queued = true
	s.queue.push(g)
	return true
}

func (s *Scheduler) activate(g *group) {
	g.active = len(s.active)
	s.active = append(s.active, g)
}

func (s *Scheduler) deactivate(g *group) {
	if g.active < 0 {
		return
	}
	last := s.active[len(s.active)-1]
	s.active[g.active] = last
	last.active = g.active
	s.active[len(s.active)-1] = nil
	s.active = s.active[:len(s.active)-1]
	g.active = -1
}

// worker takes groups from the queue in FIFO order and processes each
// with the handler, outside the lock. Because a group stays marked queued
// while it runs, no other worker can take it meanwhile: the one-call-at-
// a-time invariant rests on queued being cleared only here, under the
// lock, with nothing pending.
func (s *Scheduler) worker() {
	defer s.done.Done()
	s.mu.Lock()
	for {
		g := s.queue.pop()
		if g == nil {
			if s.stopping {
				s.mu.Unlock()
				return
			}
			s.idle++
			s.cond.Wait()
			s.idle--
			continue
		}
		if g.removed || g.pending == 0 {
			// Unregistered, or quiesced with only ticks pending, while
			// it waited.
			g.queued = false
			continue
		}
		w := Work{Flags: g.pending}
		if w.Flags&Tick != 0 {
			w.Ticks = g.ticks
		}
		since := g.since
		g.pending, g.ticks = 0, 0
		g.running = true
		s.running++
		s.mu.Unlock()

		start := time.Now()
		s.h.ProcessGroup(g.id, w)
		end := time.Now()
		wait, run := start.Sub(since), end.Sub(start)
		if s.observe != nil {
			s.observe(g.id, wait, run)
		}

		s.mu.Lock()
		s.running--
		g.running = false
		s.stats.Processed++
		s.stats.WaitNanos += uint64(wait)
		s.stats.RunNanos += uint64(run)
		if g.removed && s.retiring[g.id] == g {
			delete(s.retiring, g.id)
		}
		if g.pending != 0 && !g.removed {
			// Enqueued while it ran: to the back of the queue, behind the
			// groups that waited meanwhile. This worker loops without
			// waiting, so no signal is needed.
			s.queue.push(g)
		} else {
			g.queued = false
		}
	}
}

// ring is a FIFO of groups on a circular buffer that grows by doubling.
type ring struct {
	buf  []*group
	head int
	n    int
}

func (r *ring) len() int { return r.n }

func (r *ring) push(g *group) {
	if r.n == len(r.buf) {
		buf := make([]*group, max(16, 2*len(r.buf)))
		for i := range r.n {
			buf[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = buf, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = g
	r.n++
}

func (r *ring) pop() *group {
	if r.n == 0 {
		return nil
	}
	g := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return g
}
