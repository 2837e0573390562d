package closedloop

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock moves only when an op says so, so that which ops fall in the
// warm-up, the window or after it does not depend on the machine's speed.
type fakeClock struct {
	base time.Time
	ns   atomic.Int64
}

func newFakeClock() *fakeClock { return &fakeClock{base: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) now() time.Time           { return c.base.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) advance(d time.Duration)  { c.ns.Add(int64(d)) }
func (c *fakeClock) config(cfg Config) Config { cfg.clock = c.now; return cfg }

// TestRunCountsOnlyTheWindowAndKeepsFailuresApart: every third op fails
// and takes 50 (fake) ms, the others take 1 ms and carry 2 events. The
// success percentiles must not contain the failures' latency, the error
// percentiles must, the events must be twice the successes, and ops of the
// warm-up must be left out. One worker, so that no other worker's op moves
// the clock inside this one's.
func TestRunCountsOnlyTheWindowAndKeepsFailuresApart(t *testing.T) {
	clk := newFakeClock()
	cfg := clk.config(Config{Clients: 1, Warmup: 100 * time.Millisecond, Duration: time.Second})
	res, err := Run(context.Background(), cfg, func(worker int) Op {
		return func(ctx context.Context, seq uint64) (int, error) {
			if seq%3 == 2 {
				clk.advance(50 * time.Millisecond)
				return 0, fmt.Errorf("worker %d refused op %d", worker, seq)
			}
			clk.advance(time.Millisecond)
			return 2, nil
		}
	})
	if err != nil {
		t.Fatalf("expected no error, found %v", err)
	}
	if res.Ops == 0 || res.Errors == 0 {
		t.Fatalf("expected successes and failures counted, found %d and %d", res.Ops, res.Errors)
	}
	if res.Events != 2*res.Ops {
		t.Errorf("expected 2 events per success (%d), found %d", 2*res.Ops, res.Events)
	}
	if res.Latency.P99 >= 50*time.Millisecond {
		t.Errorf("expected the successes' p99 below the failures' 50 ms, found %s", res.Latency.P99)
	}
	if res.ErrorLatency.P50 < 50*time.Millisecond {
		t.Errorf("expected the failures' p50 at least 50 ms, found %s", res.ErrorLatency.P50)
	}
	if res.WarmupOps == 0 {
		t.Errorf("expected ops completed in the 100 ms warm-up to be set apart, found none")
	}
	// A cycle of three ops takes 52 ms and has two successes: the 1 s
	// window holds 19 or 20 cycles, give or take the ops at its edges.
	if res.Ops < 36 || res.Ops > 42 || res.Errors < 18 || res.Errors > 21 {
		t.Errorf("expected about 39 successes and 19 failures in the window, found %d and %d", res.Ops, res.Errors)
	}
	if res.LateOps > 1 {
		t.Errorf("expected at most the one op in flight at the window's end counted late, found %d", res.LateOps)
	}
	if res.Seconds != 1 {
		t.Errorf("expected the window to be the configured 1 s, found %gs", res.Seconds)
	}
	if got := res.OpsPerSec; got != float64(res.Ops) {
		t.Errorf("expected ops/s = ops over the 1 s window (%d), found %g", res.Ops, got)
	}
	if len(res.ErrorSamples) == 0 || len(res.ErrorSamples) > 5 {
		t.Errorf("expected between 1 and 5 error samples, found %q", res.ErrorSamples)
	}
	if res.ClientsActive != 1 {
		t.Errorf("expected the worker to have counted ops, found %d active", res.ClientsActive)
	}
}

// TestRunManyWorkersShareTheWindow: with 4 workers on one clock, every op
// moves it by 1 ms, so the 1 s window holds at most 1,000 completions and
// the events add up over the workers.
func TestRunManyWorkersShareTheWindow(t *testing.T) {
	clk := newFakeClock()
	res, err := Run(context.Background(), clk.config(Config{Clients: 4, Duration: time.Second}), func(int) Op {
		return func(context.Context, uint64) (int, error) {
			clk.advance(time.Millisecond)
			return 3, nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || res.Ops > 1000 {
		t.Errorf("expected between 1 and 1000 ops in a 1 s window of ≥ 1 ms ops, found %d", res.Ops)
	}
	if res.Events != 3*res.Ops || res.Errors != 0 {
		t.Errorf("expected 3 events per op and no errors, found %d events for %d ops, %d errors", res.Events, res.Ops, res.Errors)
	}
	if res.LateOps > 4 {
		t.Errorf("expected at most one late op per worker, found %d", res.LateOps)
	}
}

// TestRunAllFailing: a run where every op fails reports zero throughput,
// never the failures' rate.
func TestRunAllFailing(t *testing.T) {
	clk := newFakeClock()
	res, err := Run(context.Background(), clk.config(Config{Clients: 2, Duration: 100 * time.Millisecond}), func(int) Op {
		return func(context.Context, uint64) (int, error) {
			clk.advance(time.Millisecond)
			return 1, errors.New("503")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 0 || res.OpsPerSec != 0 || res.EventsPerSec != 0 || res.Latency.Count != 0 {
		t.Errorf("expected no successes and zero throughput, found %+v", res)
	}
	if res.Errors == 0 || res.ErrorSamples[0] != "503" {
		t.Errorf("expected the failures counted with their text, found %d %q", res.Errors, res.ErrorSamples)
	}
}

// TestRunStopsOnCancel: a cancelled run returns the context's error.
func TestRunStopsOnCancel(t *testing.T) {
	clk := newFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	_, err := Run(ctx, clk.config(Config{Clients: 3, Duration: time.Hour}), func(int) Op {
		return func(ctx context.Context, _ uint64) (int, error) {
			if calls.Add(1) == 10 {
				cancel()
			}
			clk.advance(time.Millisecond)
			return 1, ctx.Err()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("expected context.Canceled, found %v", err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	noop := func(int) Op { return func(context.Context, uint64) (int, error) { return 1, nil } }
	for _, cfg := range []Config{{Clients: 0, Duration: time.Second}, {Clients: 1}} {
		if _, err := Run(context.Background(), cfg, noop); err == nil {
			t.Errorf("expected %+v to be refused", cfg)
		}
	}
}

// TestOpTimeoutBoundsEachOp: the op sees a deadline when OpTimeout is set.
func TestOpTimeoutBoundsEachOp(t *testing.T) {
	clk := newFakeClock()
	var without, with atomic.Int64
	op := func(n *atomic.Int64) func(int) Op {
		return func(int) Op {
			return func(ctx context.Context, _ uint64) (int, error) {
				if _, ok := ctx.Deadline(); ok {
					n.Add(1)
				}
				clk.advance(time.Millisecond)
				return 1, nil
			}
		}
	}
	Run(context.Background(), clk.config(Config{Clients: 1, Duration: 10 * time.Millisecond}), op(&without))
	Run(context.Background(), clk.config(Config{Clients: 1, Duration: 10 * time.Millisecond, OpTimeout: time.Minute}), op(&with))
	if without.Load() != 0 || with.Load() == 0 {
		t.Errorf("expected a deadline only with OpTimeout, found %d ops with one without it and %d with it", without.Load(), with.Load())
	}
}

// TestCPUPerOpCountsEveryCompletedOp: CPU spent on warm-up, failed and
// late ops is divided by all of them, not by the window's successes.
func TestCPUPerOpCountsEveryCompletedOp(t *testing.T) {
	r := Record{Result: Result{WarmupOps: 100, Ops: 800, Errors: 50, LateOps: 50}}
	if n := r.AllOps(); n != 1000 {
		t.Errorf("expected 1000 ops in all, found %d", n)
	}
	if got := r.CPUPerOp(0.5); got != 0.0005 {
		t.Errorf("expected 0.5 s over 1000 ops = 0.0005 s/op, found %g", got)
	}
	if got := (Record{}).CPUPerOp(1); got != 0 {
		t.Errorf("expected 0 without ops, found %g", got)
	}
}
