package peer

import (
	"log/slog"
	"sync"
	"time"
)

// dropLog logs refusals (dropped messages, failed handshakes) on
// transitions, never one line per refusal: a forger sending thousands of
// messages a second must not flood the log it is being reported in. Per
// reason, an episode starts with the first refusal (logged with its
// details), every dropLogEvery-th refusal after it is logged with the
// count, and when dropLogQuiet passes without one the episode ends with a
// line giving the total (the recovery).
type dropLog struct {
	log   *slog.Logger
	every int
	quiet time.Duration

	mu       sync.Mutex
	stopped  bool
	episodes map[string]*dropEpisode
}

type dropEpisode struct {
	count       int
	first, last time.Time
	timer       *time.Timer
}

const (
	dropLogEvery = 1000
	dropLogQuiet = 30 * time.Second
)

func newDropLog(log *slog.Logger, every int, quiet time.Duration) *dropLog {
	return &dropLog{log: log, every: every, quiet: quiet, episodes: map[string]*dropEpisode{}}
}

// note records one refusal for reason; attrs describe it (logged only
// when this refusal is logged).
func (d *dropLog) note(msg, reason string, attrs ...any) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	e, ok := d.episodes[reason]
	if !ok {
		e = &dropEpisode{first: now}
		d.episodes[reason] = e
		e.timer = time.AfterFunc(d.quiet, func() { d.maybeEnd(reason) })
	}
	e.count++
	e.last = now
	if e.count == 1 {
		d.log.Warn(msg, append([]any{"reason", reason}, attrs...)...)
	} else if e.count%d.every == 0 {
		d.log.Warn(msg+" (still)", append([]any{"reason", reason, "count", e.count, "since", e.first}, attrs...)...)
	}
}

func (d *dropLog) maybeEnd(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.episodes[reason]
	if !ok || d.stopped {
		return
	}
	if idle := time.Since(e.last); idle < d.quiet {
		e.timer.Reset(d.quiet - idle)
		return
	}
	delete(d.episodes, reason)
	d.log.Info("peer refusals stopped", "reason", reason, "count", e.count,
		"lasted", e.last.Sub(e.first), "quiet_for", d.quiet)
}

func (d *dropLog) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for _, e := range d.episodes {
		e.timer.Stop()
	}
}
