package runner

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
)

// Regression: the faults checker judged only the kinds
// the schedule drew. A run asked for partition-halves and isolate-one
// whose draws all fell on partition-halves (the chaos suite's verdict
// spec: seed 1616, 10 s, a fault every 3 s) came out valid although
// nothing of isolate-one ever happened. A kind named by itself must have
// cycled too, or the run is unknown naming it; a kind reached only
// through a group need not.
func TestAKindNamedButNeverDrawnIsUnknown(t *testing.T) {
	cfg := Config{Nodes: 3, Seed: 1616, Duration: Duration(10 * time.Second), Interval: Duration(3 * time.Second),
		FaultDuration: Duration(time.Second), Nemesis: []string{"partition-halves", "isolate-one"}}
	schedule := cycledRun(t, cfg)
	if slices.Contains(schedule.Kinds(), "isolate-one") || len(schedule.Kinds()) == 0 {
		t.Fatalf("expected seed %d to draw partition-halves only, found %v: pick a seed that leaves a named kind out", cfg.Seed, schedule.Kinds())
	}
	res, ok := faultsResult(schedule.run, cfg, schedule.ops)
	if !ok {
		t.Fatal("expected a faults result for a run that asked for faults")
	}
	if res.Valid != checker.Unknown || !strings.Contains(res.Summary, "isolate-one was never injected") {
		t.Fatalf("expected unknown naming isolate-one as never injected, found %s: %s", res.Valid, res.Summary)
	}

	// Through a group, the same draws are a valid run: "partition" asks
	// for some partition shape, not each.
	cfg.Nemesis = []string{"partition"}
	grouped := cycledRun(t, cfg)
	res, _ = faultsResult(grouped.run, cfg, grouped.ops)
	if res.Valid != checker.Valid {
		t.Fatalf("a group run whose drawn kinds all cycled: expected valid, found %s: %s", res.Valid, res.Summary)
	}
}

type cycled struct {
	nemesis.Schedule
	run *report.Run
	ops []history.Op
}

// cycledRun writes the store of a run of cfg whose every scheduled fault
// took effect and was healed.
func cycledRun(t *testing.T, cfg Config) cycled {
	t.Helper()
	mix, err := cfg.ParseNemesis()
	if err != nil {
		t.Fatal(err)
	}
	schedule, err := nemesis.Generate(cfg.Seed, nemesis.ScheduleConfig{Duration: cfg.Duration.D(), Interval: cfg.Interval.D(),
		FaultDuration: cfg.FaultDuration.D(), Mix: mix, Nodes: nodeNames(cfg.Nodes)})
	if err != nil {
		t.Fatal(err)
	}
	run, err := report.NewRun(t.TempDir(), "faults", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := run.WriteSchedule(schedule); err != nil {
		t.Fatal(err)
	}
	rec, err := history.Create(run.HistoryPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range schedule.Steps {
		k, ok := nemesis.LookupKind(st.Kind)
		if !ok {
			t.Fatalf("unknown kind %q", st.Kind)
		}
		r := k.Recorded()
		v := history.FaultValue{Kind: r.Kind, Targets: st.Targets, Instant: r.Instant}
		rec.Complete(rec.Invoke(history.Nemesis, r.F, v, ""), history.OK, v, nil, 0, 0)
		if !r.Instant {
			heal := rec.Invoke(history.Nemesis, history.HealOf(r.F), nil, "")
			rec.Complete(heal, history.OK, nil, nil, 0, 0)
		}
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	ops, err := run.ReadHistory()
	if err != nil {
		t.Fatal(err)
	}
	return cycled{Schedule: schedule, run: run, ops: ops}
}
