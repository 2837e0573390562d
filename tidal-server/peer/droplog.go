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
// details); while it lasts, a line with the running count is logged at
// most once per dropLogEvery, however fast refusals come; and when
// dropLogQuiet passes without one the episode ends with a line giving the
// total (the recovery). A 10 s flood is three lines per reason, not one
// per thousand messages (a flood of 65,000 messages a second made that 65
// lines a second).
type dropLog struct {
	log   *slog.Logger
	every time.Duration
	quiet time.Duration
	now   func() time.Time // time.Now; tests step it

	mu       sync.Mutex
	stopped  bool
	episodes map[string]*dropEpisode
}

type dropEpisode struct {
	count       int
	first, last time.Time
	lastLine    time.Time
	timer       *time.Timer
}

const (
	dropLogEvery = 10 * time.Second
	dropLogQuiet = 30 * time.Second
)

func newDropLog(log *slog.Logger, every, quiet time.Duration) *dropLog {
	return &dropLog{log: log, every: every, quiet: quiet, now: time.Now, episodes: map[string]*dropEpisode{}}
}

// note records one refusal for reason; attrs describe it (logged only
// when this refusal is logged).
func (d *dropLog) note(msg, reason string, attrs ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	now := d.now()
	e, ok := d.episodes[reason]
	if !ok {
		e = &dropEpisode{first: now}
		d.episodes[reason] = e
		e.timer = time.AfterFunc(d.quiet, func() { d.maybeEnd(reason) })
	}
	e.count++
	e.last = now
	switch {
	case e.count == 1:
		e.lastLine = now
		d.log.Warn(msg, append([]any{"reason", reason}, attrs...)...)
	case now.Sub(e.lastLine) >= d.every:
		e.lastLine = now
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
	if idle := d.now().Sub(e.last); idle < d.quiet {
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
