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

// Refusals are logged on transitions: the first, every Nth, and the end
// of the episode once refusals stop; never one line each.
func TestDropLogOnTransitions(t *testing.T) {
	h := &captureHandler{}
	d := newDropLog(slog.New(h), 10, 50*time.Millisecond)
	defer d.stop()
	for i := 0; i < 25; i++ {
		d.note("dropping peer messages", reasonNotMember, "from", 9)
	}
	d.note("dropping peer messages", reasonSenderMismatch, "from", 1)
	lines := h.snapshot()
	if len(lines) != 4 {
		t.Fatalf("logged %d lines for 26 drops: %q; expected 4 (first of each reason, the 10th and 20th)", len(lines), lines)
	}
	if !strings.Contains(lines[0], "reason=not_member") || !strings.Contains(lines[0], "from=9") {
		t.Errorf("first line %q; expected the reason and the details", lines[0])
	}
	if !strings.Contains(lines[2], "count=20") {
		t.Errorf("third line %q; expected the running count 20", lines[2])
	}
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
		if strings.HasPrefix(l, "peer refusals stopped") && strings.Contains(l, "not_member") && !strings.Contains(l, "count=25") {
			t.Errorf("end of episode %q; expected count=25", l)
		}
	}
	// A new refusal after the end starts a new episode, logged again.
	d.note("dropping peer messages", reasonNotMember, "from", 9)
	if got := len(h.snapshot()); got != 7 {
		t.Errorf("logged %d lines; expected a 7th for the new episode", got)
	}
}
