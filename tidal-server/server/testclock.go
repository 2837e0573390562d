package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TEST ONLY: a node's clock shifted by an offset, either fixed
// (--test-clock-offset) or changed at run time by the harness's clock
// nemesis (--test-clock-offset-file).
//
// The run-time control is a file the node polls, not an API: a file in
// the node's own directory can be written only by whoever already runs
// the node (and could set its real clock), while an endpoint — even one
// behind the admin role — would let anything holding a token move the
// clock every write is stamped with. A node started without the flag has
// no way at all to shift its clock, whatever it is sent.

// testClockPoll is how often the offset file is re-read: short, so the
// nemesis sees its change take effect within a fraction of a second.
const testClockPoll = 100 * time.Millisecond

// TestClock is this node's wall clock plus a test-only offset. The API
// stamps and bounds events with Now, the peer transport answers and takes
// clock probes with it, so a shifted node looks to its peers exactly as
// skewed as its writes would be. Its monotonic reading is the real one.
type TestClock struct {
	offset  atomic.Int64 // time.Duration
	initial time.Duration
	file    string

	// what the last poll found, to log changes and bad contents once
	lastErr string
}

// NewTestClock returns a clock shifted by offset, or, while file names a
// readable file holding a Go duration ("90s", "-5m"), by the file's
// offset. The file is read once here (so a node started while shifted is
// shifted from its first stamp); Watch re-reads it.
func NewTestClock(offset time.Duration, file string) (*TestClock, error) {
	c := &TestClock{initial: offset, file: file}
	c.offset.Store(int64(offset))
	if file != "" {
		d, err := c.read()
		if err != nil {
			return nil, err
		}
		c.offset.Store(int64(d))
	}
	return c, nil
}

// Now is the shifted clock.
func (c *TestClock) Now() time.Time { return time.Now().Add(c.Offset()) }

// Offset is the shift in effect.
func (c *TestClock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// read returns the file's offset: the initial one when the file does not
// exist or is empty.
func (c *TestClock) read() (time.Duration, error) {
	b, err := os.ReadFile(c.file)
	if errors.Is(err, fs.ErrNotExist) {
		return c.initial, nil
	}
	if err != nil {
		return 0, fmt.Errorf("--test-clock-offset-file %s: %w", c.file, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return c.initial, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("--test-clock-offset-file %s: expected a duration such as \"90s\" or \"-5m\", found %q", c.file, s)
	}
	return d, nil
}

// poll re-reads the file once and applies what it holds. Bad contents are
// logged (once until they change) and the offset in effect is kept.
func (c *TestClock) poll(log *slog.Logger, gauge prometheus.Gauge) {
	d, err := c.read()
	if err != nil {
		if msg := err.Error(); msg != c.lastErr {
			c.lastErr = msg
			log.Error("TEST ONLY: cannot read the clock offset file; keeping the offset in effect", "err", err, "offset", c.Offset())
		}
		return
	}
	c.lastErr = ""
	if prev := c.Offset(); d != prev {
		c.offset.Store(int64(d))
		log.Warn("TEST ONLY: this node's clock offset changed (--test-clock-offset-file)", "from", prev, "to", d)
	}
	gauge.Set(d.Seconds())
}

// watch polls the file until ctx ends, publishing the offset in effect as
// tidal_test_clock_offset_seconds: the harness knows its change took
// effect once that gauge shows it.
func (c *TestClock) watch(ctx context.Context, log *slog.Logger, gauge prometheus.Gauge) {
	gauge.Set(c.Offset().Seconds())
	if c.file == "" {
		return
	}
	t := time.NewTicker(testClockPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.poll(log, gauge)
		}
	}
}

func newTestClockGauge(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_test_clock_offset_seconds",
		Help: "TEST ONLY: the offset added to this node's clock (--test-clock-offset, --test-clock-offset-file); absent on a node run without them."})
	if reg != nil {
		reg.MustRegister(g)
	}
	return g
}
