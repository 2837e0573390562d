package stress

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/tidaldb/tidal/harness/latency"
)

// histHighest is the histograms' top (they start at 1µs): an op is
// bounded by Config.Timeout, far below it.
const histHighest = 5 * time.Minute

func newHistogram() *hdrhistogram.Histogram { return latency.New(histHighest) }

// Latencies summarise a latency distribution (harness/latency's, as the
// closed loop's of bench/closedloop are).
type Latencies = latency.Summary

// Errors counts the ops of a stage that did not succeed, by kind. Shed ops
// were never sent: the generator's own in-flight limit was reached when
// they came due, which says the generator (or its limit) was the
// bottleneck, not the server.
type Errors struct {
	Unavailable int64         `json:"status_503"`   // overloaded or no leader
	Unknown     int64         `json:"status_504"`   // outcome unknown: commit not seen in time
	OtherStatus int64         `json:"other_status"` // any other non-2xx
	Timeout     int64         `json:"timeout"`      // no answer within Config.Timeout
	Transport   int64         `json:"transport"`    // connection refused, reset, ...
	Shed        int64         `json:"shed"`         // generator-side: never sent
	ByStatus    map[int]int64 `json:"by_status,omitempty"`
}

// Server is every failure the target caused or suffered: all but Shed.
func (e Errors) Server() int64 {
	return e.Unavailable + e.Unknown + e.OtherStatus + e.Timeout + e.Transport
}

// Total is every op that did not succeed, shed ones included.
func (e Errors) Total() int64 { return e.Server() + e.Shed }

// StageResult is what one stage measured. Every latency is measured from
// the op's intended start (its due time), so queueing anywhere — in the
// server, the network or the generator — is included.
type StageResult struct {
	Index      int           `json:"index"`
	TargetRate float64       `json:"target_rate"` // ops/s the plan asked for
	Duration   time.Duration `json:"duration_ns"` // how long ops were scheduled
	// Drain is how long after Duration the stage's last op ended: past
	// saturation the backlog takes this long to clear.
	Drain       time.Duration `json:"drain_ns"`
	EventsPerOp int           `json:"events_per_op"` // events one write carries (batch, or 1 for embeddings)

	Scheduled int64  `json:"scheduled"` // ops that came due: OK + Errors.Total()
	OK        int64  `json:"ok"`
	Events    int64  `json:"events_ok"` // events in successful writes
	Errors    Errors `json:"errors"`

	OfferedRate    float64 `json:"offered_rate"`    // Scheduled / Duration, ops/s
	AchievedRate   float64 `json:"achieved_rate"`   // OK / (Duration + Drain), ops/s
	AchievedEvents float64 `json:"achieved_events"` // Events / (Duration + Drain), events/s

	// Latency is of the ops that succeeded, FailedLatency of the ops sent
	// that did not (503, 504, timeout, other status, transport error), and
	// AllLatency of every op sent: what the clients saw. The SLO's p99
	// bound applies to Latency and to AllLatency, so leaving slow failures
	// out cannot make a stage pass.
	Latency       Latencies `json:"latency"`
	FailedLatency Latencies `json:"failed_latency"`
	AllLatency    Latencies `json:"all_latency"`
	// Reads and Writes split Latency when the mix has both.
	Reads  *Latencies `json:"reads,omitempty"`
	Writes *Latencies `json:"writes,omitempty"`
	// DispatchDelay is how late the generator handed ops to a worker after
	// they came due. It is part of Latency; when it grows, the generator is
	// the bottleneck (too few CPUs, or a scheduler that cannot keep up).
	DispatchDelay Latencies `json:"dispatch_delay"`
	// MeanInFlight is the concurrency the stage sustained (Little's law:
	// achieved rate × mean latency), the figure to compare with a closed-loop
	// benchmark's client count.
	MeanInFlight float64 `json:"mean_in_flight"`

	Pass   bool   `json:"pass"`
	Reason string `json:"reason,omitempty"` // why the stage failed the SLO
}

// ErrorRate is the share of scheduled ops that did not succeed, shed ones
// included: a stage the generator could not drive is not a measurement of
// the server.
func (s StageResult) ErrorRate() float64 {
	if s.Scheduled == 0 {
		return 0
	}
	return float64(s.Errors.Total()) / float64(s.Scheduled)
}

// SLO is what a stage must meet to count as sustained.
type SLO struct {
	P99          time.Duration // 0: no latency bound
	MaxErrorRate float64       // share of scheduled ops, shed included
}

// Judge says whether the stage met the SLO and, if not, why.
func (slo SLO) Judge(s StageResult) (bool, string) {
	var why []string
	if s.Scheduled == 0 {
		return false, "no ops scheduled"
	}
	if s.OK == 0 {
		why = append(why, "no op succeeded")
	}
	if r := s.ErrorRate(); r > slo.MaxErrorRate {
		why = append(why, fmt.Sprintf("errors %.2f%% > %.2f%%", 100*r, 100*slo.MaxErrorRate))
	}
	if slo.P99 > 0 && s.Latency.P99 > slo.P99 {
		why = append(why, fmt.Sprintf("p99 %s > %s", fmtDur(s.Latency.P99), fmtDur(slo.P99)))
	}
	if slo.P99 > 0 && s.AllLatency.P99 > slo.P99 && s.AllLatency.P99 > s.Latency.P99 {
		why = append(why, fmt.Sprintf("p99 of all ops sent (failures included) %s > %s", fmtDur(s.AllLatency.P99), fmtDur(slo.P99)))
	}
	return len(why) == 0, strings.Join(why, ", ")
}

// Knee picks the sustained stage with the highest offered rate: the most
// load the target took while meeting the SLO. ok is false when no stage
// passed. Stages are compared by offered rate, not position, so a plan need
// not be sorted.
func Knee(stages []StageResult, slo SLO) (knee StageResult, ok bool) {
	for _, s := range stages {
		if pass, _ := slo.Judge(s); pass && (!ok || s.OfferedRate > knee.OfferedRate) {
			knee, ok = s, true
		}
	}
	return knee, ok
}

// Result is a whole run.
type Result struct {
	RunID   string        `json:"run_id"`
	Config  RunConfig     `json:"config"`
	Started time.Time     `json:"started"`
	Stages  []StageResult `json:"stages"`
	// Knee is the highest sustained stage; nil when none sustained the SLO.
	Knee *StageResult `json:"knee,omitempty"`
	// Lag is the follower lag sampled during the run, when asked for.
	Lag *LagReport `json:"lag,omitempty"`
}

// RunConfig is the part of Config worth recording with the results.
type RunConfig struct {
	Targets      []string      `json:"targets"`
	Mix          Mix           `json:"mix"`
	ReadFraction float64       `json:"read_fraction,omitempty"`
	Batch        int           `json:"batch"`
	EmbeddingDim int           `json:"embedding_dim,omitempty"`
	Entities     uint64        `json:"entities"`
	Consistency  string        `json:"consistency,omitempty"`
	MaxInFlight  int           `json:"max_in_flight"`
	Connections  int           `json:"connections"`
	Timeout      time.Duration `json:"timeout_ns"`
	SLOP99       time.Duration `json:"slo_p99_ns"`
	MaxErrorRate float64       `json:"max_error_rate"`
	// Protocol is what the requests asked for: "http/1.1" (plaintext),
	// "https h2" or "https http/1.1".
	Protocol string `json:"protocol"`
}

// WriteTable prints the stages as the final table: offered against achieved
// rate, latency percentiles and errors by kind.
func (r *Result) WriteTable(out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "stage\toffered/s\tachieved/s\tevents/s\tdrain\tp50\tp90\tp99\tp999\tmax\tfailed p99\tall p99\tin-flight\tdispatch p99\t503\t504\tother\ttimeout\ttransport\tshed\tSLO\t")
	for _, s := range r.Stages {
		verdict := "ok"
		if !s.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			s.Index+1, s.OfferedRate, s.AchievedRate, s.AchievedEvents, fmtDur(s.Drain),
			fmtDur(s.Latency.P50), fmtDur(s.Latency.P90), fmtDur(s.Latency.P99), fmtDur(s.Latency.P999), fmtDur(s.Latency.Max),
			fmtDur(s.FailedLatency.P99), fmtDur(s.AllLatency.P99),
			s.MeanInFlight, fmtDur(s.DispatchDelay.P99),
			s.Errors.Unavailable, s.Errors.Unknown, s.Errors.OtherStatus, s.Errors.Timeout, s.Errors.Transport, s.Errors.Shed,
			verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Stages {
		if len(s.Errors.ByStatus) > 0 {
			codes := make([]int, 0, len(s.Errors.ByStatus))
			for c := range s.Errors.ByStatus {
				codes = append(codes, c)
			}
			sort.Ints(codes)
			var parts []string
			for _, c := range codes {
				parts = append(parts, fmt.Sprintf("%d×%d", c, s.Errors.ByStatus[c]))
			}
			fmt.Fprintf(out, "stage %d statuses: %s\n", s.Index+1, strings.Join(parts, " "))
		}
		if !s.Pass && s.Reason != "" {
			fmt.Fprintf(out, "stage %d failed: %s\n", s.Index+1, s.Reason)
		}
		if s.Reads != nil && s.Writes != nil {
			fmt.Fprintf(out, "stage %d reads  p50 %s p99 %s max %s (%d)\n", s.Index+1, fmtDur(s.Reads.P50), fmtDur(s.Reads.P99), fmtDur(s.Reads.Max), s.Reads.Count)
			fmt.Fprintf(out, "stage %d writes p50 %s p99 %s max %s (%d)\n", s.Index+1, fmtDur(s.Writes.P50), fmtDur(s.Writes.P99), fmtDur(s.Writes.Max), s.Writes.Count)
		}
	}
	if len(r.Stages) > 1 {
		if r.Knee != nil {
			fmt.Fprintf(out, "knee: stage %d, %.0f ops/s offered, %.0f ops/s (%.0f events/s) achieved, p99 %s\n",
				r.Knee.Index+1, r.Knee.OfferedRate, r.Knee.AchievedRate, r.Knee.AchievedEvents, fmtDur(r.Knee.Latency.P99))
		} else {
			fmt.Fprintln(out, "knee: no stage met the SLO")
		}
	}
	if r.Lag != nil {
		r.Lag.WriteTable(out)
	}
	return nil
}

// fmtDur prints a latency with three significant digits in a fitting unit.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}
