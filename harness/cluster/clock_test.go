package cluster

import (
	"errors"
	"testing"
	"time"
)

// What the clock nemesis reads of a cluster: the offset
// a node reports in effect, and the bound the nodes run with.
func TestClockOffsetAndBound(t *testing.T) {
	metrics := []byte("# HELP tidal_test_clock_offset_seconds TEST ONLY\n# TYPE tidal_test_clock_offset_seconds gauge\ntidal_test_clock_offset_seconds -180\ntidal_clock_in_bounds 0\n")
	if d, err := parseClockOffset(metrics); err != nil || d != -3*time.Minute {
		t.Errorf("parseClockOffset = %v, %v; expected -3m", d, err)
	}
	if _, err := parseClockOffset([]byte("tidal_clock_in_bounds 1\n")); err == nil {
		t.Error("a node without the gauge reported an offset; expected an error")
	}
	for _, tc := range []struct {
		flags []string
		want  time.Duration
	}{
		{nil, time.Minute},
		{[]string{"--max-clock-skew=10s"}, 10 * time.Second},
		{[]string{"--max-clock-skew", "2m", "--snapshot-every=10"}, 2 * time.Minute},
	} {
		c := &Cluster{cfg: Config{Flags: tc.flags}}
		if got := c.ClockBound(); got != tc.want {
			t.Errorf("flags %v: ClockBound %v, expected %v", tc.flags, got, tc.want)
		}
	}
}

// A cluster started without ClockControl changes nothing and says so.
func TestSetClockOffsetWithoutClockControl(t *testing.T) {
	c := &Cluster{cfg: Config{}}
	if _, err := c.SetClockOffset(t.Context(), "n1", time.Minute); !errors.Is(err, ErrNoClockControl) {
		t.Fatalf("expected ErrNoClockControl, found %v", err)
	}
}
