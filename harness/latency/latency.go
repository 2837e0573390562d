// Package latency records op latencies in HdrHistograms and reads the
// usual percentiles off them. It is the one recorder of the load tools:
// the open-loop generator (harness/stress) and the closed loop of the
// side-by-side benchmark (bench/closedloop) both summarise with it, so
// their figures are computed alike.
//
// A histogram spans 1µs to a highest value its user picks (an op is
// bounded by the user's per-op timeout, far below it) at 3 significant
// digits (0.1% resolution). Record clamps a value into that range, so an
// outlier is counted at the top (or bottom) rather than dropped.
package latency

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

const (
	lowest = int64(time.Microsecond)
	digits = 3
)

// New returns an empty histogram of latencies from 1µs to highest.
func New(highest time.Duration) *hdrhistogram.Histogram {
	return hdrhistogram.New(lowest, max(int64(highest), 2*lowest), digits)
}

// Record adds d to h, clamped into h's range.
func Record(h *hdrhistogram.Histogram, d time.Duration) {
	v := min(max(int64(d), lowest), h.HighestTrackableValue())
	_ = h.RecordValue(v) // in range by construction
}

// Summary is a latency distribution's count, mean and percentiles.
type Summary struct {
	Count int64         `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summarize reads the usual percentiles off h; an empty h gives the zero
// Summary.
func Summarize(h *hdrhistogram.Histogram) Summary {
	if h.TotalCount() == 0 {
		return Summary{}
	}
	q := h.ValueAtPercentiles([]float64{50, 90, 99, 99.9})
	return Summary{
		Count: h.TotalCount(),
		Mean:  time.Duration(h.Mean()),
		P50:   time.Duration(q[50]),
		P90:   time.Duration(q[90]),
		P99:   time.Duration(q[99]),
		P999:  time.Duration(q[99.9]),
		Max:   time.Duration(h.Max()),
	}
}
