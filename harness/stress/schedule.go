package stress

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Stage is one step of a load plan: ops come due at a constant Rate (ops
// per second) for Duration.
type Stage struct {
	Rate     float64
	Duration time.Duration
}

// Ops is how many ops the stage schedules: op i is due at i/Rate after the
// stage starts, for every i with i/Rate < Duration.
func (s Stage) Ops() int64 {
	n := s.Rate * s.Duration.Seconds()
	if n <= 0 {
		return 0
	}
	// Due times i/Rate < Duration, so ceil(n) ops; an exact n (rate 100,
	// 2s) must not gain an op due exactly at the end.
	whole := int64(n)
	if float64(whole) < n {
		whole++
	}
	return whole
}

// Due is when op i of the stage is due, relative to the stage's start.
// It is computed from i rather than accumulated, so a long stage does not
// drift by summed rounding errors.
func (s Stage) Due(i int64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / s.Rate)
}

// Ramp is a load ramp of Stages stages of StageDuration each, the first
// at Start ops/s and each next one Step ops/s higher — or, when Factor is
// set, Factor times higher (a geometric ramp brackets an unknown knee in a
// few stages; a linear one then narrows it down).
type Ramp struct {
	Start         float64
	Step          float64
	Factor        float64 // > 1: geometric, Step unused
	Stages        int
	StageDuration time.Duration
}

// ParseRamp reads "start:step:stages:stage-duration", e.g.
// "1000:1000:10:5s", or with a step of "xF" a geometric ramp, e.g.
// "500:x2:8:3s" for 500, 1000, 2000, ... ops/s.
func ParseRamp(s string) (Ramp, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 {
		return Ramp{}, fmt.Errorf("ramp %q: expected start:step:stages:stage-duration (e.g. 1000:1000:10:5s), found %d fields", s, len(parts))
	}
	var r Ramp
	var err error
	if r.Start, err = strconv.ParseFloat(parts[0], 64); err != nil || r.Start <= 0 {
		return Ramp{}, fmt.Errorf("ramp %q: start: expected a rate > 0 ops/s, found %q", s, parts[0])
	}
	if factor, ok := strings.CutPrefix(parts[1], "x"); ok {
		if r.Factor, err = strconv.ParseFloat(factor, 64); err != nil || r.Factor <= 1 {
			return Ramp{}, fmt.Errorf("ramp %q: step: expected a factor > 1 after x, found %q", s, parts[1])
		}
	} else if r.Step, err = strconv.ParseFloat(parts[1], 64); err != nil || r.Step < 0 {
		return Ramp{}, fmt.Errorf("ramp %q: step: expected a rate >= 0 ops/s or xFACTOR, found %q", s, parts[1])
	}
	if r.Stages, err = strconv.Atoi(parts[2]); err != nil || r.Stages < 1 {
		return Ramp{}, fmt.Errorf("ramp %q: stages: expected an integer >= 1, found %q", s, parts[2])
	}
	if r.StageDuration, err = time.ParseDuration(parts[3]); err != nil || r.StageDuration <= 0 {
		return Ramp{}, fmt.Errorf("ramp %q: stage-duration: expected a duration > 0 such as 5s, found %q", s, parts[3])
	}
	return r, nil
}

// String is the form ParseRamp reads.
func (r Ramp) String() string {
	step := strconv.FormatFloat(r.Step, 'g', -1, 64)
	if r.Factor > 0 {
		step = "x" + strconv.FormatFloat(r.Factor, 'g', -1, 64)
	}
	return fmt.Sprintf("%g:%s:%d:%s", r.Start, step, r.Stages, r.StageDuration)
}

// Plan expands the ramp into its stages.
func (r Ramp) Plan() []Stage {
	stages := make([]Stage, r.Stages)
	rate := r.Start
	for i := range stages {
		stages[i] = Stage{Rate: rate, Duration: r.StageDuration}
		if r.Factor > 0 {
			rate *= r.Factor
		} else {
			rate += r.Step
		}
	}
	return stages
}
