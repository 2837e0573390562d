package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Clock control. With Config.ClockControl every node
// runs with the test-only --test-clock-offset-file pointing at
// <node dir>/clock-offset, which the node re-reads every 100ms; the clock
// nemesis moves a node's clock by rewriting that file. The file lives in
// the node's directory, outside data/, so it survives restarts and wipes:
// a node killed while shifted starts shifted, as a machine whose clock is
// off stays off across a crash. The container backend mounts the node's
// directory at the same path, so the same file works there.

// ClockOffsetFile is the offset file of a node directory.
func ClockOffsetFile(nodeDir string) string { return filepath.Join(nodeDir, "clock-offset") }

// clockOffsetMetric is the gauge a node publishes the offset in effect as.
const clockOffsetMetric = "tidal_test_clock_offset_seconds"

// SetClockOffset shifts node name's clock by offset (0: back to the true
// clock). It writes the offset file atomically, then, if the node runs,
// waits until the node reports the offset in effect and returns when it
// saw it: the moment the change took effect. A node not running (killed,
// paused, stopped) takes the offset when it runs again; SetClockOffset
// then returns at once with ErrClockDeferred.
func (c *Cluster) SetClockOffset(ctx context.Context, name string, offset time.Duration) (time.Time, error) {
	if !c.cfg.ClockControl {
		return time.Time{}, fmt.Errorf("%w: cannot set the clock of %s", ErrNoClockControl, name)
	}
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return time.Time{}, err
	}
	file := ClockOffsetFile(n.Dir)
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(offset.String()+"\n"), 0o644); err != nil {
		return time.Time{}, fmt.Errorf("cluster: set the clock of %s: %w", name, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return time.Time{}, fmt.Errorf("cluster: set the clock of %s: %w", name, err)
	}
	if st := c.State(name); st != Running {
		return time.Time{}, fmt.Errorf("%w: %s is %s", ErrClockDeferred, name, st)
	}
	var last error
	for {
		got, err := c.ClockOffset(ctx, name)
		if err == nil && (got-offset).Abs() < time.Millisecond {
			return time.Now(), nil
		}
		if err == nil {
			err = fmt.Errorf("node reports offset %v", got)
		}
		last = err
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("cluster: set the clock of %s to %v: expected the node to report it, last: %v (%w)", name, offset, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ErrNoClockControl says the cluster's nodes run without the offset file:
// nothing was changed.
var ErrNoClockControl = fmt.Errorf("cluster: expected a cluster started with ClockControl, found it off")

// ErrClockDeferred says a clock offset was written for a node that is not
// running: it takes effect when the node runs again.
var ErrClockDeferred = fmt.Errorf("cluster: clock offset deferred until the node runs")

// ClockOffset is the test clock offset node name reports in effect
// (its tidal_test_clock_offset_seconds gauge).
func (c *Cluster) ClockOffset(ctx context.Context, name string) (time.Duration, error) {
	b, err := c.ObserverClient(name).Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return parseClockOffset(b)
}

func parseClockOffset(metrics []byte) (time.Duration, error) {
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, clockOffsetMetric+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: expected a number, found %q", clockOffsetMetric, rest)
		}
		return time.Duration(v * float64(time.Second)).Round(time.Microsecond), nil
	}
	return 0, fmt.Errorf("metric %s: expected it in /metrics (is the node run with --test-clock-offset-file?), found none", clockOffsetMetric)
}

// ClockBound is the --max-clock-skew the nodes run with: the last one in
// Config.Flags, else tidal-server's default (1m).
func (c *Cluster) ClockBound() time.Duration {
	bound := time.Minute
	for i, f := range c.cfg.Flags {
		var v string
		switch {
		case strings.HasPrefix(f, "--max-clock-skew="):
			v = strings.TrimPrefix(f, "--max-clock-skew=")
		case f == "--max-clock-skew" && i+1 < len(c.cfg.Flags):
			v = c.cfg.Flags[i+1]
		default:
			continue
		}
		if d, err := time.ParseDuration(v); err == nil {
			bound = d
		}
	}
	return bound
}
