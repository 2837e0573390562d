package server

import (
	"bytes"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The decision behind clock admission. A node is out of
// bounds only when a majority of the voters is certainly (offset less its
// uncertainty) beyond --max-clock-skew by fresh readings; in bounds when a
// majority (itself included) is not; otherwise undecided.
func TestJudgeClock(t *testing.T) {
	const bound, maxAge = time.Minute, 30 * time.Second
	at := func(offset, uncertainty, age time.Duration) ClockReading {
		return ClockReading{Offset: offset, Uncertainty: uncertainty, Age: age}
	}
	fresh := func(offset time.Duration) ClockReading { return at(offset, time.Millisecond, time.Second) }
	three := []uint64{1, 2, 3}
	five := []uint64{1, 2, 3, 4, 5}
	for _, tc := range []struct {
		name     string
		voters   []uint64
		readings map[uint64]ClockReading
		want     string // "ok", "out" or "undecided"
		reason   []string
	}{
		{"both peers within", three, map[uint64]ClockReading{2: fresh(time.Second), 3: fresh(-time.Second)}, "ok", nil},
		{"this node 5m ahead of both peers", three, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(-5 * time.Minute)}, "out",
			[]string{"2 of 3 voters", "--max-clock-skew 1m0s", "member 2 -5m0s ±1ms", "member 3 -5m0s"}},
		{"behind both peers counts the same", three, map[uint64]ClockReading{2: fresh(2 * time.Minute), 3: fresh(90 * time.Second)}, "out",
			[]string{"member 2 +2m0s", "member 3 +1m30s"}},
		// One peer off: that peer is the odd one out, this node and the
		// other peer are a majority within.
		{"one peer of two off", three, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(time.Second)}, "ok", nil},
		// The uncertainty is subtracted: 61s ± 2s might be 59s.
		{"beyond only within the uncertainty", three, map[uint64]ClockReading{2: at(61*time.Second, 2*time.Second, 0), 3: at(-61*time.Second, 2*time.Second, 0)}, "ok", nil},
		{"beyond after the uncertainty", three, map[uint64]ClockReading{2: at(64*time.Second, 2*time.Second, 0), 3: at(-64*time.Second, 2*time.Second, 0)}, "out", nil},
		// Stale readings count for nothing, either way.
		{"stale readings that say off", three, map[uint64]ClockReading{2: at(-5*time.Minute, 0, time.Minute), 3: at(-5*time.Minute, 0, time.Minute)}, "undecided",
			[]string{"2 not measured recently"}},
		{"one fresh off, one stale", three, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: at(0, 0, time.Minute)}, "undecided", nil},
		{"one fresh within, one never measured", three, map[uint64]ClockReading{2: fresh(0)}, "ok", nil},
		{"nothing measured", three, nil, "undecided", nil},
		// Five voters: three beyond are a majority, two are not.
		{"three of five off", five, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(-5 * time.Minute), 4: fresh(-5 * time.Minute), 5: fresh(0)}, "out",
			[]string{"3 of 5 voters"}},
		{"two of five off", five, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(-5 * time.Minute), 4: fresh(0), 5: fresh(0)}, "ok", nil},
		{"two of five off, two stale", five, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(-5 * time.Minute), 4: at(0, 0, time.Hour)}, "undecided", nil},
		// Readings of non-voters (learners, removed members) do not count.
		{"only learners off", three, map[uint64]ClockReading{2: fresh(0), 3: fresh(0), 4: fresh(-5 * time.Minute), 5: fresh(-5 * time.Minute)}, "ok", nil},
		{"only learners measured", three, map[uint64]ClockReading{4: fresh(0), 5: fresh(0)}, "undecided", nil},
		// A learner (not a voter itself) needs a majority of the voters.
		{"this node a learner, one voter within", []uint64{2, 3, 4}, map[uint64]ClockReading{2: fresh(0)}, "undecided", nil},
		{"this node a learner, voters off", []uint64{2, 3, 4}, map[uint64]ClockReading{2: fresh(-5 * time.Minute), 3: fresh(-5 * time.Minute)}, "out", nil},
		{"a one-voter cluster", []uint64{1}, nil, "ok", nil},
		{"no voters known yet", nil, nil, "undecided", nil},
	} {
		v := judgeClock(1, tc.voters, tc.readings, bound, maxAge)
		got := "undecided"
		if v.decided {
			got = map[bool]string{true: "ok", false: "out"}[v.ok]
		}
		if got != tc.want {
			t.Errorf("%s: %s (%s), expected %s", tc.name, got, v.reason, tc.want)
			continue
		}
		for _, r := range tc.reason {
			if !strings.Contains(v.reason, r) {
				t.Errorf("%s: reason %q does not say %q", tc.name, v.reason, r)
			}
		}
	}
}

// syncLog is a log buffer the guard writes and the test reads.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// The guard refuses from start until the readings decide,
// refuses while a majority says the clock is off (holding that verdict
// while the readings go stale), resumes once a majority is within, and
// logs each transition once, not each check.
func TestClockGuardTransitions(t *testing.T) {
	var mu sync.Mutex
	readings := map[uint64]ClockReading{}
	set := func(offset, age time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range []uint64{2, 3} {
			readings[id] = ClockReading{Offset: offset, Uncertainty: time.Millisecond, Age: age}
		}
	}
	logs := &syncLog{}
	g := newClockGuard(1, time.Minute, func() map[uint64]ClockReading {
		mu.Lock()
		defer mu.Unlock()
		out := map[uint64]ClockReading{}
		for id, r := range readings {
			out[id] = r
		}
		return out
	}, func() []uint64 { return []uint64{1, 2, 3} }, nil, slog.New(slog.NewTextHandler(logs, nil)))
	start := g.started
	expect := func(step string, ok bool, reason string) {
		t.Helper()
		gotOK, gotReason := g.healthy()
		if gotOK != ok || !strings.Contains(gotReason, reason) {
			t.Fatalf("%s: healthy() = %v %q, expected %v with %q", step, gotOK, gotReason, ok, reason)
		}
	}

	expect("at start, nothing measured", false, "measuring this node's clock offsets")
	g.check(start.Add(time.Second))
	expect("still nothing measured", false, "measuring")

	set(-5*time.Minute, time.Second)
	for i := 0; i < 5; i++ {
		set(-5*time.Minute-time.Duration(i)*time.Millisecond, time.Second) // the figures move at every check
		g.check(start.Add(2 * time.Second))
	}
	expect("both peers 5m behind", false, "exceeds --max-clock-skew 1m0s")
	if n := logs.count("clock out of bounds: refusing writes"); n != 1 {
		t.Fatalf("refusal logged %d times over 5 checks, expected once:\n%s", n, logs.b.String())
	}

	set(-5*time.Minute, time.Hour) // the peers went away: stale
	g.check(start.Add(time.Hour))
	expect("readings stale", false, "exceeds --max-clock-skew")

	set(time.Second, time.Second)
	g.check(start.Add(time.Hour + time.Second))
	g.check(start.Add(time.Hour + 2*time.Second))
	expect("back within", true, "")
	if n := logs.count("clock back within bounds: taking writes again"); n != 1 {
		t.Fatalf("recovery logged %d times, expected once:\n%s", n, logs.b.String())
	}
	set(0, time.Hour)
	g.check(start.Add(2 * time.Hour))
	expect("stale again, still in bounds", true, "")
}

// A node whose peers never answer a clock probe (an
// older binary mid-upgrade) takes writes once the start grace ends; one
// whose first readings decide takes them at once.
func TestClockGuardStartGrace(t *testing.T) {
	logs := &syncLog{}
	none := func() map[uint64]ClockReading { return nil }
	voters := func() []uint64 { return []uint64{1, 2, 3} }
	g := newClockGuard(1, time.Minute, none, voters, nil, slog.New(slog.NewTextHandler(logs, nil)))
	g.check(g.started.Add(clockStartGrace - time.Second))
	if ok, _ := g.healthy(); ok {
		t.Fatal("took writes before the grace ended with nothing measured")
	}
	g.check(g.started.Add(clockStartGrace))
	if ok, reason := g.healthy(); !ok {
		t.Fatalf("still refusing after the grace: %s", reason)
	}
	if n := logs.count("not measured since start"); n != 1 {
		t.Fatalf("the end of the grace logged %d times, expected once:\n%s", n, logs.b.String())
	}

	within := func() map[uint64]ClockReading { return map[uint64]ClockReading{2: {Age: time.Second}} }
	g = newClockGuard(1, time.Minute, within, voters, nil, slog.New(slog.NewTextHandler(logs, nil)))
	g.check(g.started)
	if ok, reason := g.healthy(); !ok {
		t.Fatalf("a majority within at the first check, still refusing: %s", reason)
	}
}

// A node whose own clock steps (clock-jump) must not
// stamp a single write with the new clock on the strength of offsets
// measured with the old one. It refuses at once, before any check runs;
// readings taken before the step no longer count; once readings taken
// after it say the clock is off, it refuses for that reason, and once
// they say it is back within, it takes writes again.
func TestClockGuardRefusesAfterOwnStep(t *testing.T) {
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	var mu sync.Mutex
	readings := map[uint64]ClockReading{}
	set := func(peerOffset, age time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range []uint64{2, 3} {
			readings[id] = ClockReading{Offset: peerOffset, Uncertainty: time.Millisecond, Age: age}
		}
	}
	get := func() map[uint64]ClockReading {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(readings)
	}
	g := newClockGuardOn(clock, 1, time.Minute, get, func() []uint64 { return []uint64{1, 2, 3} }, nil, slog.New(slog.NewTextHandler(&syncLog{}, nil)))
	expect := func(step string, ok bool, reason string) {
		t.Helper()
		gotOK, gotReason := g.healthy()
		if gotOK != ok || !strings.Contains(gotReason, reason) {
			t.Fatalf("%s: healthy() = %v %q, expected %v with %q", step, gotOK, gotReason, ok, reason)
		}
	}
	set(0, 0)
	g.check(time.Now())
	expect("peers within", true, "")

	offset.Store(int64(5 * time.Minute)) // the jump
	expect("right after the jump, no check yet", false, "this node's clock stepped by +5m0s")
	set(0, 100*time.Millisecond) // probes from before the jump
	g.check(time.Now())
	expect("readings from before the jump", false, "stepped")

	set(-5*time.Minute, 0) // the first probes after it
	time.Sleep(time.Millisecond)
	g.check(time.Now())
	expect("readings after the jump", false, "exceeds --max-clock-skew")

	offset.Store(0) // healed: another step, back
	set(-5*time.Minute, 100*time.Millisecond)
	g.check(time.Now())
	expect("healed, readings from before the heal", false, "exceeds --max-clock-skew")
	time.Sleep(time.Millisecond)
	set(0, 0)
	g.check(time.Now())
	expect("healed and measured", true, "")

	// A step within half the bound changes nothing at once.
	offset.Store(int64(20 * time.Second))
	expect("a small step", true, "")
}
