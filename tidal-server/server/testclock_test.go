package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The test clock's offset file. Read at start (a node
// started while shifted stamps shifted from the first write), re-read by
// poll; missing or empty means --test-clock-offset; bad contents keep the
// offset in effect; the gauge shows the offset in effect.
func TestTestClockOffsetFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "clock-offset")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("90s\n")
	c, err := NewTestClock(time.Second, file)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Offset(); got != 90*time.Second {
		t.Fatalf("offset at start %v; expected the file's 90s", got)
	}
	if d := c.Now().Sub(time.Now()); d < 89*time.Second || d > 91*time.Second {
		t.Fatalf("Now() is %v ahead of the wall clock; expected about 90s", d)
	}
	reg := prometheus.NewRegistry()
	gauge := newTestClockGauge(reg)
	gaugeValue := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathering the gauge: %v (%d families)", err, len(mfs))
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		contents string // "" with remove: the file is gone
		remove   bool
		want     time.Duration
	}{
		{contents: "-5m", want: -5 * time.Minute},
		{contents: "not a duration", want: -5 * time.Minute}, // kept
		{contents: "  \n", want: time.Second},                // empty: the flag's
		{contents: "2h", want: 2 * time.Hour},
		{remove: true, want: time.Second},
	} {
		if tc.remove {
			os.Remove(file)
		} else {
			write(tc.contents)
		}
		c.poll(log, gauge)
		if got := c.Offset(); got != tc.want {
			t.Errorf("file %q (removed %v): offset %v, expected %v", tc.contents, tc.remove, got, tc.want)
		}
		if g := gaugeValue(); g != tc.want.Seconds() {
			t.Errorf("file %q: gauge %v, expected %v", tc.contents, g, tc.want.Seconds())
		}
	}
	write("soon")
	if _, err := NewTestClock(0, file); err == nil {
		t.Error("a node started with a bad offset file started; expected an error naming the file")
	}
}
