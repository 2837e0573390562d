package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Workload is the clients of one chaos run. Its methods may be called
// from any goroutine; Run and FinalReads may be called more than once
// (phases of a run), one at a time, and share process ids and write ids.
type Workload struct {
	cfg     Config
	targets Targets
	rec     *history.Recorder
	pick    *picker
	gen     *generator

	nextProc atomic.Int64 // the next process id to hand out
	workers  atomic.Int64 // workers started by earlier Runs (seeds stay distinct)
	progress progress
	gate     Gate
}

// Gate is the gate every client passes before each op it starts.
func (w *Workload) Gate() *Gate { return &w.gate }

// New checks cfg and returns a workload that records into rec.
func New(cfg Config, targets Targets, rec *history.Recorder) (*Workload, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if targets == nil || rec == nil {
		return nil, errors.New("workload: expected targets and a recorder, found nil")
	}
	w := &Workload{cfg: cfg, targets: targets, rec: rec, pick: newPicker(targets, cfg)}
	w.gen = newGenerator(&w.cfg)
	return w, nil
}

// Run runs cfg's workload against targets, recording into rec, until
// cfg.Duration has passed or ctx ends. See Workload.Run.
func Run(ctx context.Context, cfg Config, targets Targets, rec *history.Recorder) error {
	w, err := New(cfg, targets, rec)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// Config is the workload's configuration with defaults applied (what a run
// store should record).
func (w *Workload) Config() Config { return w.cfg }

// CounterKeys lists every counter key handed out so far (the keys
// FinalReads reads).
func (w *Workload) CounterKeys() []uint64 { return w.gen.keys.used() }

// Progress returns the counters so far.
func (w *Workload) Progress() Progress { return w.progress.snapshot(w.nextProc.Load()) }

func (w *Workload) newProcess() history.Process {
	return history.Process(w.nextProc.Add(1) - 1)
}

// Run issues ops until cfg.Duration has passed (from the call) or ctx
// ends, then waits for the ops in flight: each is bounded by the op
// timeout (Attempts × Timeout plus backoff). Cancelling ctx also cuts the
// ops in flight short; they are recorded info. It returns an error only
// when it cannot run (no nodes) or the recorder failed.
func (w *Workload) Run(ctx context.Context) error {
	if len(w.targets.Names()) == 0 {
		return errors.New("workload: no nodes to send ops to")
	}
	issue := ctx // while it lasts, workers start new ops
	if w.cfg.Duration > 0 {
		var cancel context.CancelFunc
		issue, cancel = context.WithTimeout(ctx, w.cfg.Duration)
		defer cancel()
	}
	// The leader watcher stops with the run, not with issuing: the ops
	// still in flight may want a fresh hint when they fail.
	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	if w.cfg.Select == LeaderOnly {
		w.pick.refreshLeader(ctx)
		bg.Add(1)
		go func() {
			defer bg.Done()
			w.pick.watchLeader(runCtx)
		}()
	}

	first := w.workers.Add(int64(w.cfg.Concurrency)) - int64(w.cfg.Concurrency)
	steps := make([]func(), w.cfg.Concurrency)
	for i := range steps {
		wk := &worker{w: w, index: int(first) + i, rng: rand.New(rand.NewPCG(w.cfg.Seed, uint64(first)+uint64(i)))}
		wk.retire()
		steps[i] = func() {
			w.gate.Wait(issue)
			if issue.Err() == nil {
				wk.step(ctx)
			}
		}
	}
	Drive(issue, w.cfg.Rate, steps, func() { w.progress.shed.Add(1) })
	stopRun()
	bg.Wait()
	w.pick.closeIdle()
	if err := w.rec.Err(); err != nil {
		return fmt.Errorf("workload: recording the history: %w", err)
	}
	return nil
}

// worker is one client: a sequence of processes, each retired by an info.
type worker struct {
	w     *Workload
	index int // across every Run of the Workload; picks the counter key slot
	rng   *rand.Rand
	proc  history.Process
	ids   ids
}

// retire moves the worker to a fresh process id.
func (wk *worker) retire() {
	wk.proc = wk.w.newProcess()
	wk.ids = ids{prefix: wk.w.cfg.IDPrefix, proc: wk.proc}
}

// step generates and performs one op.
func (wk *worker) step(ctx context.Context) {
	c := wk.w.gen.generate(wk.w.cfg.Kind, wk.rng, &wk.ids, wk.index)
	node := wk.w.pick.pick(wk.rng)
	if node == "" {
		// Every member is gone (membership churn in progress): nothing
		// to invoke against; look again shortly.
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		return
	}
	t := wk.w.perform(ctx, wk.proc, node, c)
	if c.counterKey != 0 {
		wk.w.gen.keys.done(wk.index, c.counterKey, c.f, t)
	}
	if t == history.Info {
		wk.retire()
	}
}

// perform records c's invoke by process p against node, runs it, and
// records its completion, which it returns.
func (w *Workload) perform(ctx context.Context, p history.Process, node string, c call) history.Type {
	inv := w.rec.Invoke(p, c.f, c.value, node)
	w.progress.of(c.f).invoked.Add(1)
	octx, cancel := context.WithTimeout(ctx, w.cfg.opTimeout())
	value, ack, err := c.exec(octx, w.pick.client(node))
	cancel()
	t := history.OK
	switch {
	case err == nil:
	case client.IsIndefinite(err):
		// Includes every timeout, ours or the server's: the request may
		// have been applied, so the process can never invoke again.
		t = history.Info
	default:
		t = history.Fail
	}
	if t != history.OK {
		w.pick.failed(node)
		value, ack = nil, client.Ack{}
	}
	w.rec.Complete(inv, t, value, err, ack.Seq, ack.Term)
	w.progress.completed(c.f, t)
	return t
}
