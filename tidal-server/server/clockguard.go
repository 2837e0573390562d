package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Clock admission (docs/ARCHITECTURE.md, "Bounded
// clocks"). The node that takes a write stamps it with its clock, so a
// node whose clock is far off would fold wrong times into every replica.
// Nodes measure their offsets to each other over the peer plane; a node
// whose clock is, beyond doubt, more than --max-clock-skew away from a
// majority of the voters stops taking writes (503 with the reason, and
// /readyz says why) until a majority of the voters is within the bound
// again. It cannot tell its own clock from theirs, but a majority agreeing
// that it is off is the best evidence there is, and the majority keeps
// taking writes.

// ClockReading is a peer's clock as this node measured it (package peer's
// ClockSample).
type ClockReading struct {
	// Offset is the peer's clock minus this node's.
	Offset time.Duration
	// Uncertainty bounds the measurement's error: the true offset is
	// within Offset ± Uncertainty (half the probe's round trip).
	Uncertainty time.Duration
	// Age is the time since the reading was taken.
	Age time.Duration
}

// ClockMeter is a transport that measures its peers' clocks (package
// peer's does). Start gates writes on what it measures.
type ClockMeter interface {
	ClockReadings() map[uint64]ClockReading
}

// clockVerdict is what the readings say about this node's clock.
type clockVerdict struct {
	// decided: a majority of the voters is either certainly beyond the
	// bound (ok false) or not (ok true). Otherwise (peers unmeasured or
	// their readings stale) the readings settle nothing.
	decided bool
	ok      bool
	reason  string
}

// judgeClock decides whether this node's clock is in bounds. A voter is
// "beyond" when its reading is fresh (Age <= maxAge) and its offset,
// less the reading's uncertainty, exceeds bound: the clocks certainly
// differ by more. It is "within" when its reading is fresh and not
// beyond; this node is within of itself when it votes. The clock is out of
// bounds when the voters beyond are a majority of the voters, in bounds
// when those within are; neither (too few fresh readings) is undecided.
func judgeClock(self uint64, voters []uint64, readings map[uint64]ClockReading, bound, maxAge time.Duration) clockVerdict {
	if len(voters) == 0 {
		return clockVerdict{reason: "no voters known yet"}
	}
	quorum := len(voters)/2 + 1
	var beyond []string
	within, stale := 0, 0
	for _, id := range voters {
		if id == self {
			within++
			continue
		}
		r, ok := readings[id]
		if !ok || r.Age > maxAge {
			stale++
			continue
		}
		if abs(r.Offset)-r.Uncertainty > bound {
			beyond = append(beyond, fmt.Sprintf("member %d %s ±%v", id, signed(r.Offset.Round(time.Millisecond)), r.Uncertainty.Round(time.Microsecond)))
			continue
		}
		within++
	}
	switch {
	case len(beyond) >= quorum:
		return clockVerdict{decided: true, reason: fmt.Sprintf(
			"this node's clock offset to %d of %d voters exceeds --max-clock-skew %v (peer clock minus this node's: %s)",
			len(beyond), len(voters), bound, strings.Join(beyond, ", "))}
	case within >= quorum:
		return clockVerdict{decided: true, ok: true}
	}
	return clockVerdict{reason: fmt.Sprintf("clock offsets measured to too few voters: %d of %d within --max-clock-skew %v, %d beyond, %d not measured recently (within %v)",
		within, len(voters), bound, len(beyond), stale, maxAge)}
}

// signed shows a positive offset with its +: a peer ahead.
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Clock guard defaults.
const (
	// clockCheckInterval is how often the guard judges the readings
	// (peers are probed every second).
	clockCheckInterval = 500 * time.Millisecond
	// clockReadingMaxAge: an older reading is stale. The transport keeps
	// the best of its last 8 probes (one a second), so a live peer's
	// reading can be 8-9 s old.
	clockReadingMaxAge = 30 * time.Second
	// clockStartGrace: a node refuses writes from its start until the
	// readings decide, or this long. Without it a node started with a
	// clock far off would take writes until its first probes answered;
	// with no end to it, a node whose peers cannot answer probes (an
	// older binary during an upgrade) would never take writes.
	clockStartGrace = 10 * time.Second
	// clockStepNoise: a change of this node's wall-minus-monotonic drift
	// between two checks larger than this is a step of its own clock (NTP
	// slews at most 500 ppm: a quarter of a millisecond per check).
	// Readings taken before a step measured the old clock: they are stale.
	clockStepNoise = 100 * time.Millisecond
)

// clockGuard judges the clock in the background and answers the API's
// admission check (api.Options.ClockHealthy) from its last verdict, which
// holds until the readings decide otherwise: a node found off stays
// refused while its peers are unreachable, and one found in bounds keeps
// taking writes.
type clockGuard struct {
	self     uint64
	bound    time.Duration
	maxAge   time.Duration
	grace    time.Duration
	readings func() map[uint64]ClockReading
	voters   func() []uint64
	log      *slog.Logger
	inBounds prometheus.Gauge
	started  time.Time

	// Steps of this node's own clock. clock is the
	// node's wall clock as it stamps (time.Now, or the test clock);
	// drift() is how far it has moved against the monotonic clock since
	// ref. check() keeps lastDrift and when the drift last stepped.
	clock     func() time.Time
	ref       time.Time // monotonic reference
	refWall   time.Time // clock() at ref, wall reading only
	lastDrift time.Duration
	steppedAt time.Time // zero: never

	state atomic.Pointer[clockState]
}

type clockState struct {
	ok      bool
	reason  string
	decided bool // a verdict was reached at least once
	graced  bool // the start grace ended undecided
	// drift is the clock's drift when this verdict was reached: a clock
	// that has stepped by more than half the bound since is refused until
	// judged again (healthy).
	drift time.Duration
}

func newClockGuard(self uint64, bound time.Duration, readings func() map[uint64]ClockReading, voters func() []uint64,
	reg prometheus.Registerer, log *slog.Logger) *clockGuard {
	return newClockGuardOn(time.Now, self, bound, readings, voters, reg, log)
}

// newClockGuardOn is newClockGuard for a node whose wall clock is clock.
func newClockGuardOn(clock func() time.Time, self uint64, bound time.Duration, readings func() map[uint64]ClockReading, voters func() []uint64,
	reg prometheus.Registerer, log *slog.Logger) *clockGuard {
	ref := time.Now()
	g := &clockGuard{self: self, bound: bound, maxAge: clockReadingMaxAge, grace: clockStartGrace,
		readings: readings, voters: voters, log: log, started: ref,
		clock: clock, ref: ref, refWall: clock().Round(0),
		inBounds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_clock_in_bounds",
			Help: "1 while this node takes writes by the clock check (its clock within --max-clock-skew of a majority of the voters), 0 while it refuses them."})}
	if reg != nil {
		reg.MustRegister(g.inBounds)
	}
	g.state.Store(&clockState{reason: fmt.Sprintf("measuring this node's clock offsets to its peers (writes start once a majority of the voters is within --max-clock-skew %v, or after %v)", bound, g.grace)})
	return g
}

// drift is how far this node's wall clock has moved against its
// monotonic clock since the guard started: 0 for a clock that only ticks,
// the size of every step (settimeofday, an NTP step, a VM resumed, the
// test clock's offset) otherwise.
func (g *clockGuard) drift() time.Duration {
	return g.clock().Round(0).Sub(g.refWall) - time.Since(g.ref)
}

// healthy is api.Options.ClockHealthy: cheap, it reads the last verdict,
// and refuses at once if this node's clock has stepped by more than half
// the bound since that verdict: a node whose clock jumps must not stamp
// writes with it until its offsets are measured again,
// which takes a probe round (a second or two). Half the bound: a smaller
// step leaves a node that was within the bound within 1.5 bounds, and
// the next verdict catches it.
func (g *clockGuard) healthy() (bool, string) {
	s := g.state.Load()
	if !s.ok {
		return s.ok, s.reason
	}
	if step := g.drift() - s.drift; abs(step) > g.bound/2 {
		return false, fmt.Sprintf("this node's clock stepped by %s since its offsets to its peers were last judged; writes, and reads at this clock, wait until they are measured again (--max-clock-skew %v)",
			signed(step.Round(time.Millisecond)), g.bound)
	}
	return true, ""
}

// run judges every clockCheckInterval until ctx ends; more often until
// the first verdict, so a node that can decide at once (one voter, peers
// answering) does not refuse writes for longer than it must.
func (g *clockGuard) run(ctx context.Context) {
	for {
		g.check(time.Now())
		wait := clockCheckInterval
		if s := g.state.Load(); !s.decided && !s.graced {
			wait = clockCheckInterval / 10
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// check judges the readings once and logs a change of verdict: refusing
// writes, taking them again, or giving up waiting for a first verdict.
func (g *clockGuard) check(now time.Time) {
	prev := g.state.Load()
	drift := g.drift()
	maxAge := g.maxAge
	if step := drift - g.lastDrift; abs(step) > clockStepNoise {
		g.steppedAt = now
		g.log.Warn("this node's clock stepped; its offsets to its peers are measured again", "step", step.Round(time.Millisecond))
	}
	g.lastDrift = drift
	if !g.steppedAt.IsZero() {
		// Only readings taken since the step measured this clock.
		maxAge = min(maxAge, now.Sub(g.steppedAt))
	}
	v := judgeClock(g.self, g.voters(), g.readings(), g.bound, maxAge)
	next := *prev
	switch {
	case v.decided:
		next = clockState{ok: v.ok, reason: v.reason, decided: true, drift: drift}
	case !prev.decided && !prev.graced && now.Sub(g.started) >= g.grace:
		next = clockState{ok: true, graced: true, drift: drift}
		g.log.Warn("clock check: offsets to a majority of the voters not measured since start; taking writes until they are",
			"waited", g.grace, "last", v.reason)
	}
	if next == *prev {
		return
	}
	g.state.Store(&next)
	// Transitions only: while refused, the reason's figures change at
	// every check.
	switch {
	case !next.ok && (prev.ok || !prev.decided):
		g.log.Error("clock out of bounds: refusing writes until a majority of the voters is within --max-clock-skew again", "reason", next.reason)
	case next.ok && !prev.ok && prev.decided:
		g.log.Info("clock back within bounds: taking writes again", "max_clock_skew", g.bound)
	case next.ok && !prev.ok && v.decided:
		g.log.Info("clock check: within --max-clock-skew of a majority of the voters; taking writes", "max_clock_skew", g.bound)
	}
	if next.ok {
		g.inBounds.Set(1)
	} else {
		g.inBounds.Set(0)
	}
}
