package latency

import (
	"testing"
	"time"
)

func TestSummarizeEmpty(t *testing.T) {
	if s := Summarize(New(time.Minute)); s != (Summary{}) {
		t.Fatalf("expected the zero summary of an empty histogram, found %+v", s)
	}
}

// Percentiles are read at 3 significant digits; outliers are clamped into
// the range, not dropped.
func TestRecordAndSummarize(t *testing.T) {
	h := New(time.Minute)
	for i := 1; i <= 1000; i++ {
		Record(h, time.Duration(i)*time.Millisecond)
	}
	Record(h, time.Hour)    // above the top: counted at the top
	Record(h, -time.Second) // below the bottom: counted at 1µs
	s := Summarize(h)
	if s.Count != 1002 {
		t.Fatalf("expected 1002 values counted, found %d", s.Count)
	}
	near := func(name string, got, want time.Duration) {
		t.Helper()
		if d := got - want; d < -want/500 || d > want/500 {
			t.Errorf("%s: expected %s (±0.2%%), found %s", name, want, got)
		}
	}
	near("p50", s.P50, 500*time.Millisecond)
	near("p90", s.P90, 900*time.Millisecond)
	near("p99", s.P99, 990*time.Millisecond)
	near("max", s.Max, time.Minute)
	if s.Mean <= 0 {
		t.Errorf("expected a positive mean, found %s", s.Mean)
	}
}
