// Package closedloop is the load loop of the side-by-side store benchmark:
// N workers, each with one request in flight, issuing the next as soon as
// the previous one answered. The same loop drives etcd and tidal-server
// (bench/storeload), so that the loop is not the difference between them.
//
// A run has a warm-up, whose ops are not counted, then a measured window:
// an op counts when it completes inside the window. Throughput is the
// counted successes divided by the window; latencies are HdrHistograms of
// the counted successes, with failures kept apart (count and latency) so a
// fast failure cannot improve a percentile.
package closedloop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/tidaldb/tidal/harness/latency"
)

// histHighest is the histograms' top (they start at 1µs): an op is
// bounded by the caller's per-op timeout, far below it.
const histHighest = time.Minute

// Op is one request of one worker: seq counts the worker's ops from 0. It
// returns how many events the op carried (a batch write carries many) and
// whether it succeeded.
type Op func(ctx context.Context, seq uint64) (events int, err error)

// Config is one run.
type Config struct {
	Clients  int           // workers, each with one op in flight
	Warmup   time.Duration // ops completing before this are not counted
	Duration time.Duration // the measured window after the warm-up
	// OpTimeout bounds each op (0: no bound beyond ctx).
	OpTimeout time.Duration
	// MaxErrorSamples bounds the distinct error texts kept (default 5).
	MaxErrorSamples int

	clock func() time.Time // tests: a clock that moves when told; nil = time.Now
}

// Latencies summarise a latency distribution (harness/latency's, as the
// open-loop generator's are).
type Latencies = latency.Summary

// Result is what a run measured.
type Result struct {
	Clients       int       `json:"clients"`
	Seconds       float64   `json:"seconds"` // the measured window, as it ran
	Ops           int64     `json:"ops"`     // successes counted
	Events        int64     `json:"events"`  // events carried by them
	Errors        int64     `json:"errors"`  // failures counted
	OpsPerSec     float64   `json:"ops_per_sec"`
	EventsPerSec  float64   `json:"events_per_sec"`
	Latency       Latencies `json:"latency"`        // successes
	ErrorLatency  Latencies `json:"error_latency"`  // failures
	ErrorSamples  []string  `json:"error_samples"`  // a few distinct error texts
	WarmupOps     int64     `json:"warmup_ops"`     // ops completed during the warm-up, any outcome
	LateOps       int64     `json:"late_ops"`       // ops completing after the window, not counted
	WarmupErrors  int64     `json:"warmup_errors"`  // failures during the warm-up
	StartedAt     time.Time `json:"started_at"`     // start of the measured window
	ClientsActive int       `json:"clients_active"` // workers that completed at least one counted op
}

// worker is one worker's tally; merged at the end so the loop shares
// nothing but the clock.
type worker struct {
	ok, failed          *hdrhistogram.Histogram
	events              int64
	warmup, warmupFails int64
	late                int64
	errs                []string
}

// Run runs cfg with ops from newOp (called once per worker, before the
// loop starts) until the window ends or ctx is cancelled. A cancelled ctx
// is returned as the error along with what was measured so far.
func Run(ctx context.Context, cfg Config, newOp func(worker int) Op) (Result, error) {
	if cfg.Clients < 1 {
		return Result{}, fmt.Errorf("closedloop: expected at least 1 client, found %d", cfg.Clients)
	}
	if cfg.Duration <= 0 {
		return Result{}, fmt.Errorf("closedloop: expected a positive duration, found %s", cfg.Duration)
	}
	if cfg.MaxErrorSamples == 0 {
		cfg.MaxErrorSamples = 5
	}
	if cfg.clock == nil {
		cfg.clock = time.Now
	}
	ops := make([]Op, cfg.Clients)
	for i := range ops {
		ops[i] = newOp(i)
	}
	begin := cfg.clock()
	start := begin.Add(cfg.Warmup)
	end := start.Add(cfg.Duration)
	workers := make([]*worker, cfg.Clients)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{
			ok:     latency.New(histHighest),
			failed: latency.New(histHighest),
		}
		workers[i] = w
		wg.Go(func() { w.loop(ctx, cfg, ops[i], start, end) })
	}
	wg.Wait()
	return merge(cfg, workers, start, end), ctx.Err()
}

func (w *worker) loop(ctx context.Context, cfg Config, op Op, start, end time.Time) {
	for seq := uint64(0); ctx.Err() == nil; seq++ {
		t0 := cfg.clock()
		if !t0.Before(end) {
			return
		}
		octx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.OpTimeout > 0 {
			octx, cancel = context.WithTimeout(ctx, cfg.OpTimeout)
		}
		n, err := op(octx, seq)
		cancel()
		t1 := cfg.clock()
		switch {
		case t1.Before(start):
			w.warmup++
			if err != nil {
				w.warmupFails++
			}
		case !t1.Before(end):
			w.late++
		case err != nil:
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return // the run was cancelled, not the op refused
			}
			latency.Record(w.failed, t1.Sub(t0))
			if len(w.errs) < cfg.MaxErrorSamples {
				w.errs = append(w.errs, err.Error())
			}
		default:
			latency.Record(w.ok, t1.Sub(t0))
			w.events += int64(n)
		}
	}
}

func merge(cfg Config, workers []*worker, start, end time.Time) Result {
	ok := latency.New(histHighest)
	failed := latency.New(histHighest)
	r := Result{Clients: cfg.Clients, StartedAt: start.UTC()}
	seen := map[string]bool{}
	for _, w := range workers {
		ok.Merge(w.ok)
		failed.Merge(w.failed)
		r.Events += w.events
		r.WarmupOps += w.warmup
		r.WarmupErrors += w.warmupFails
		r.LateOps += w.late
		if w.ok.TotalCount() > 0 {
			r.ClientsActive++
		}
		for _, e := range w.errs {
			if !seen[e] && len(r.ErrorSamples) < cfg.MaxErrorSamples {
				seen[e] = true
				r.ErrorSamples = append(r.ErrorSamples, e)
			}
		}
	}
	// The window as it ran: it cannot end before its nominal end, since
	// every worker runs until then; a cancelled run ends earlier.
	window := max(0, min(cfg.clock().Sub(start), end.Sub(start)))
	r.Seconds = window.Seconds()
	r.Ops, r.Errors = ok.TotalCount(), failed.TotalCount()
	r.Latency, r.ErrorLatency = latency.Summarize(ok), latency.Summarize(failed)
	if r.Seconds > 0 {
		r.OpsPerSec = float64(r.Ops) / r.Seconds
		r.EventsPerSec = float64(r.Events) / r.Seconds
	}
	return r
}
