package peer

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// captureHandler keeps log records' messages and attributes.
type captureHandler struct {
	mu    sync.Mutex
	lines []string
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}

func (h *captureHandler) snapshot() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// Refusals are logged on transitions: the first, a running count at most
// once per interval however many come, and the end of the episode once
// refusals stop; never one line each. Regression: the
// count was logged every 1000th refusal, so a non-member's flood of 65,000
// messages a second wrote 65 lines a second.
func TestDropLogOnTransitions(t *testing.T) {
	h := &captureHandler{}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	d := newDropLog(slog.New(h), 10*time.Second, 50*time.Millisecond)
	d.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	defer d.stop()
	// 25,000 refusals over 25 s: the first, then one line per 10 s.
	for i := 0; i < 25000; i++ {
		d.note("dropping peer messages", reasonNotMember, "from", 9)
		advance(time.Millisecond)
	}
	d.note("dropping peer messages", reasonSenderMismatch, "from", 1)
	lines := h.snapshot()
	if len(lines) != 4 {
		t.Fatalf("logged %d lines for 25,001 drops over 25s: %q; expected 4 (the first of each reason, and at 10s and 20s)", len(lines), lines)
	}
	if !strings.Contains(lines[0], "reason=not_member") || !strings.Contains(lines[0], "from=9") {
		t.Errorf("first line %q; expected the reason and the details", lines[0])
	}
	if !strings.Contains(lines[2], "count=20001") {
		t.Errorf("third line %q; expected the running count 20001", lines[2])
	}
	advance(time.Minute) // quiet: the timers (50ms) now find the episodes over
	eventually(t, "both episodes to end", func() bool {
		ended := 0
		for _, l := range h.snapshot() {
			if strings.HasPrefix(l, "peer refusals stopped") {
				ended++
			}
		}
		return ended == 2
	})
	for _, l := range h.snapshot() {
		if strings.HasPrefix(l, "peer refusals stopped") && strings.Contains(l, "not_member") && !strings.Contains(l, "count=25000") {
			t.Errorf("end of episode %q; expected count=25000", l)
		}
	}
	// A new refusal after the end starts a new episode, logged again.
	d.note("dropping peer messages", reasonNotMember, "from", 9)
	if got := len(h.snapshot()); got != 7 {
		t.Errorf("logged %d lines; expected a 7th for the new episode", got)
	}
}
