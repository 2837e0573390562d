package stress

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// stage builds a synthetic stage result.
func stage(i int, rate float64, ok, failed, shed int64, p99 time.Duration) StageResult {
	return StageResult{
		Index: i, TargetRate: rate, OfferedRate: rate, Duration: time.Second,
		Scheduled: ok + failed + shed, OK: ok,
		Errors:  Errors{Unavailable: failed, Shed: shed},
		Latency: Latencies{Count: ok, P99: p99},
	}
}

func TestKnee(t *testing.T) {
	slo := SLO{P99: 20 * time.Millisecond, MaxErrorRate: 0.01}
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		stages []StageResult
		want   int // index of the knee stage, -1 for none
	}{
		{"last passes", []StageResult{stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 2000, 0, 0, 8*ms)}, 1},
		{"p99 over SLO", []StageResult{stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 2000, 0, 0, 21*ms)}, 0},
		{"p99 exactly at SLO passes", []StageResult{stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 2000, 0, 0, 20*ms)}, 1},
		{"1% errors passes", []StageResult{stage(0, 1000, 990, 10, 0, 5*ms)}, 0},
		{"over 1% errors fails", []StageResult{stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 1979, 21, 0, 5*ms)}, 0},
		{"shed counts against the stage", []StageResult{stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 1900, 0, 100, 5*ms)}, 0},
		{"none passes", []StageResult{stage(0, 1000, 1000, 0, 0, 50*ms), stage(1, 2000, 0, 2000, 0, 0)}, -1},
		{"no ops succeeded", []StageResult{stage(0, 1000, 0, 0, 0, 0)}, -1},
		// A noisy stage in the middle does not hide a higher sustained one.
		{"highest passing, not first failure", []StageResult{
			stage(0, 1000, 1000, 0, 0, 5*ms), stage(1, 2000, 2000, 0, 0, 25*ms),
			stage(2, 3000, 3000, 0, 0, 9*ms), stage(3, 4000, 3000, 1000, 0, 90*ms),
		}, 2},
		// Plans need not be sorted by rate.
		{"unsorted plan", []StageResult{stage(0, 3000, 3000, 0, 0, 5*ms), stage(1, 1000, 1000, 0, 0, 5*ms)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, ok := Knee(tc.stages, slo)
			switch {
			case tc.want < 0 && ok:
				t.Errorf("expected no knee, found stage %d", k.Index)
			case tc.want >= 0 && !ok:
				t.Errorf("expected knee at stage %d, found none", tc.want)
			case tc.want >= 0 && k.Index != tc.want:
				t.Errorf("expected knee at stage %d, found stage %d", tc.want, k.Index)
			}
		})
	}
}

func TestKneeWithoutLatencyBound(t *testing.T) {
	stages := []StageResult{stage(0, 1000, 1000, 0, 0, time.Second), stage(1, 2000, 1000, 1000, 0, time.Second)}
	k, ok := Knee(stages, SLO{MaxErrorRate: 0.01})
	if !ok || k.Index != 0 {
		t.Errorf("expected knee at stage 0 when only errors count, found %v %v", k.Index, ok)
	}
}

func TestJudgeSaysWhy(t *testing.T) {
	pass, why := (SLO{P99: 10 * time.Millisecond, MaxErrorRate: 0.01}).Judge(stage(0, 100, 50, 50, 0, 30*time.Millisecond))
	if pass || !strings.Contains(why, "errors 50.00% > 1.00%") || !strings.Contains(why, "p99 30.0ms > 10.0ms") {
		t.Errorf("expected a failure naming both the error share and the p99, found pass=%v %q", pass, why)
	}
}

func TestResultTableAndJSON(t *testing.T) {
	r := &Result{Stages: []StageResult{stage(0, 1000, 1000, 0, 0, 5*time.Millisecond), stage(1, 2000, 1500, 500, 0, 50*time.Millisecond)}}
	r.Stages[1].Errors.ByStatus = map[int]int64{409: 3}
	slo := SLO{P99: 20 * time.Millisecond, MaxErrorRate: 0.01}
	for i := range r.Stages {
		r.Stages[i].Pass, r.Stages[i].Reason = slo.Judge(r.Stages[i])
	}
	k, _ := Knee(r.Stages, slo)
	r.Knee = &k
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"offered/s", "p999", "shed", "FAIL", "409×3", "knee: stage 1, 1000 ops/s", "drain", "failed p99", "all p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("expected the table to contain %q, found:\n%s", want, out)
		}
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Knee == nil || back.Knee.Latency.P99 != 5*time.Millisecond || back.Stages[1].Errors.Unavailable != 500 {
		t.Errorf("expected the JSON to round-trip the knee and errors, found %s", data)
	}
}

func TestParseRamp(t *testing.T) {
	r, err := ParseRamp("1000:500:4:5s")
	if err != nil {
		t.Fatal(err)
	}
	plan := r.Plan()
	want := []float64{1000, 1500, 2000, 2500}
	if len(plan) != len(want) {
		t.Fatalf("expected %d stages, found %d", len(want), len(plan))
	}
	for i, s := range plan {
		if s.Rate != want[i] || s.Duration != 5*time.Second {
			t.Errorf("stage %d: expected %g ops/s for 5s, found %g for %s", i, want[i], s.Rate, s.Duration)
		}
	}
	if back, err := ParseRamp(r.String()); err != nil || back != r {
		t.Errorf("expected String to round-trip, found %v, %v", back, err)
	}
	g, err := ParseRamp("500:x2:4:3s")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{500, 1000, 2000, 4000} {
		if got := g.Plan()[i].Rate; got != want {
			t.Errorf("geometric stage %d: expected %g ops/s, found %g", i, want, got)
		}
	}
	if back, err := ParseRamp(g.String()); err != nil || back != g {
		t.Errorf("expected String to round-trip %q, found %v, %v", g.String(), back, err)
	}
	for _, bad := range []string{"", "1:2:3", "1:x1:2:1s", "1:x:2:1s", "0:1:2:1s", "1:-1:2:1s", "1:1:0:1s", "1:1:2:0s", "a:1:2:1s", "1:1:2:soon"} {
		if _, err := ParseRamp(bad); err == nil {
			t.Errorf("ParseRamp(%q): expected an error, found none", bad)
		}
	}
}

func TestStageOps(t *testing.T) {
	for _, tc := range []struct {
		s    Stage
		want int64
	}{
		{Stage{100, 2 * time.Second}, 200},
		{Stage{3, time.Second}, 3},
		{Stage{2.5, time.Second}, 3}, // due at 0, 0.4s, 0.8s
		{Stage{1000, 1500 * time.Microsecond}, 2},
	} {
		if got := tc.s.Ops(); got != tc.want {
			t.Errorf("%+v: expected %d ops, found %d", tc.s, tc.want, got)
		}
		if last := tc.s.Due(tc.want - 1); last >= tc.s.Duration {
			t.Errorf("%+v: expected the last op due before the stage ends, found %s", tc.s, last)
		}
	}
}
