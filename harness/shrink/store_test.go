package shrink

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db/etcd"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
)

// copyRun copies a testdata run into a temporary store, as
// <store>/chaos/<timestamp>/, and returns its directory.
func copyRun(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store", "chaos", "20261206T045902.247Z")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSignatureOfStoredRuns(t *testing.T) {
	for _, tc := range []struct {
		run     string
		primary Anomaly
		sig     string
	}{
		// ack-before-commit under isolate-leader: lost writes.
		{"ledger-lost", lost, "ledger/acknowledged write lost"},
		// local-linearizable-reads: porcupine, the counter bounds and the
		// aggregates model all say false; linearizable ranks first.
		{"linearizable", Anomaly{Checker: "linearizable", Kind: "key not linearizable"},
			"linearizable/key not linearizable, counter/read outside the bounds of the adds, aggregates/aggregate outside the bounds of the adds"},
	} {
		st, err := Open(copyRun(t, tc.run))
		if err != nil {
			t.Fatalf("%s: %v", tc.run, err)
		}
		if st.Primary() != tc.primary {
			t.Errorf("%s: expected primary anomaly %s, found %s (signature %s)", tc.run, tc.primary, st.Primary(), st.Signature)
		}
		if st.Signature.String() != tc.sig {
			t.Errorf("%s: expected signature %q, found %q", tc.run, tc.sig, st.Signature)
		}
	}
}

func TestSignatureFromTypedDetails(t *testing.T) {
	// Results fresh from the checkers carry typed details; they must give
	// the signature results.json gives.
	rs := []checker.Result{
		{Name: "availability", Valid: checker.Invalid},
		{Name: "nodes", Valid: checker.Invalid, Details: checker.NodesDetails{Crashed: []string{"n2"}}},
		{Name: "ledger", Valid: checker.Invalid, Details: checker.LedgerDetails{Dup: checker.Anomalies[checker.DuplicatedID]{Count: 2}}},
		{Name: "convergence", Valid: checker.Invalid, Details: checker.ConvergenceDetails{Groups: map[uint64]map[string][]string{7: {"a": {"n1"}, "b": {"n2", "n3"}}}}},
		{Name: "responses", Valid: checker.Invalid}, // a checker this package does not know
		{Name: "lag", Valid: checker.Valid},
		{Name: "watch", Valid: checker.Invalid, Details: map[string]any{"anomalies": map[string]any{"count": 3.0, "examples": []any{map[string]any{"kind": "gap"}, map[string]any{"kind": "duplicate"}}}}},
	}
	want := "ledger/duplicated, convergence/diverged, watch/duplicate, watch/gap, nodes/crashed, responses, availability/outage"
	if got := SignatureOf(rs).String(); got != want {
		t.Errorf("expected %q, found %q", want, got)
	}
	if p, _ := SignatureOf(rs).Primary(); p != (Anomaly{"ledger", "duplicated"}) {
		t.Errorf("expected primary ledger/duplicated, found %s", p)
	}
	if _, ok := SignatureOf([]checker.Result{{Name: "ledger", Valid: checker.Valid}}).Primary(); ok {
		t.Error("expected no primary anomaly for a valid run")
	}
}

// etcd's checkers share tidal's result names where they mean the same
// (linearizable for the register, ledger and convergence for appends);
// watch is its own.
func TestSignatureOfEtcdResults(t *testing.T) {
	rs := []checker.Result{
		{Name: "linearizable", Valid: checker.Invalid, Details: etcd.RegisterDetails{Reads: "linearizable", Illegal: 1, Keys: []etcd.KeyResult{{Result: "illegal"}}}},
		{Name: "watch", Valid: checker.Invalid, Details: etcd.WatchDetails{}},
		{Name: "availability", Valid: checker.Valid},
	}
	if got, want := SignatureOf(rs).String(), "linearizable/key not linearizable, watch"; got != want {
		t.Errorf("expected %q, found %q", want, got)
	}
}

func TestOpenRefusesARunThatDidNotFail(t *testing.T) {
	for _, v := range []checker.Validity{checker.Valid, checker.Unknown} {
		dir := copyRun(t, "ledger-lost")
		run, err := report.OpenRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		rr, err := run.ReadResults()
		if err != nil {
			t.Fatal(err)
		}
		rr.Results = []checker.Result{{Name: "ledger", Valid: v}}
		if err := run.WriteResults(rr); err != nil {
			t.Fatal(err)
		}
		_, err = Open(dir)
		var nothing *NothingToShrinkError
		if !errors.As(err, &nothing) {
			t.Fatalf("expected a %s run refused with NothingToShrinkError, found %v", v, err)
		}
		want := "nothing to shrink: run " + dir + " was " + verdictWord(v)
		if err.Error() != want {
			t.Errorf("expected %q, found %q", want, err)
		}
	}
}

func TestOpenRefusesAFailureWithoutFaults(t *testing.T) {
	dir := copyRun(t, "ledger-lost")
	if err := (nemesis.Schedule{}).WriteFile(filepath.Join(dir, report.ScheduleFile)); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir)
	var nothing *NothingToShrinkError
	if !errors.As(err, &nothing) || !strings.Contains(err.Error(), "without any fault") {
		t.Errorf("expected a run with an empty schedule refused, found %v", err)
	}
}

func TestRunOracleConfig(t *testing.T) {
	st, err := Open(copyRun(t, "ledger-lost"))
	if err != nil {
		t.Fatal(err)
	}
	o := &RunOracle{Base: st.Config, Schedule: st.Schedule, Store: "/s/candidates", Test: "chaos"}
	c := FromSchedule(st.Schedule, st.Config.Duration.D()).Keep([]int{2})
	c.Duration = 12 * time.Second
	cfg := o.Config(c)
	if cfg.Duration.D() != 12*time.Second || cfg.Seed != 7001 || cfg.Workload.Seed != 7001 || cfg.Store != "/s/candidates" {
		t.Errorf("expected the stored seed, the candidate's duration and the oracle's store, found duration %s seed %d workload seed %d store %s",
			cfg.Duration.D(), cfg.Seed, cfg.Workload.Seed, cfg.Store)
	}
	if !slices.Equal(cfg.Nemesis, []string{"pause-one"}) {
		t.Errorf("expected --nemesis to be the candidate's kinds [pause-one], found %v", cfg.Nemesis)
	}
	s := c.Schedule(st.Schedule)
	if err := s.Validate(); err != nil || s.Seed != st.Schedule.Seed || s.Config.Duration != 12*time.Second || len(s.Steps) != 1 {
		t.Errorf("expected a valid one-step schedule with the stored seed, found %+v (%v)", s, err)
	}
}

// A shrink whose original never fails again ends with that finding and
// writes no minimum (no schedule.json to replay).
func TestShrinkNotReproducedWritesNoMinimum(t *testing.T) {
	st, err := Open(copyRun(t, "ledger-lost"))
	if err != nil {
		t.Fatal(err)
	}
	st.Config.Store = filepath.Join(t.TempDir(), "store")
	// Shrink's own oracle runs real clusters; this checks only what it
	// writes around Search, by giving it a search that cannot reproduce.
	var runs int
	o := OracleFunc(func(context.Context, Candidate) (Verdict, error) { runs++; return Verdict{Valid: checker.Valid}, nil })
	dir, err := report.NewRun(st.Config.Store, "chaos-shrink", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Search(context.Background(), FromSchedule(st.Schedule, st.Config.Duration.D()),
		Options{Oracle: o, Primary: st.Primary(), Record: func(r *Report) error { return writeJSON(dir.Path(ReportFile), r) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reproduced || runs != 3 {
		t.Fatalf("expected 3 runs and no reproduction, found %d runs, reproduced %v", runs, rep.Reproduced)
	}
	b, err := os.ReadFile(dir.Path(ReportFile))
	if err != nil || !strings.Contains(string(b), `"reproduced": false`) {
		t.Errorf("expected shrink.json to record the failed reproduction, found %s (%v)", b, err)
	}
}

func TestCompareSectionInReport(t *testing.T) {
	st, err := Open(copyRun(t, "ledger-lost"))
	if err != nil {
		t.Fatal(err)
	}
	orig := FromSchedule(st.Schedule, 30*time.Second)
	min := orig.Keep([]int{0})
	min.Duration = 10 * time.Second
	rep := &Report{Primary: lost, Original: orig, Minimal: min, Runs: 12, Elapsed: "6m0s"}
	sec := CompareSection(st.Run.Dir(), rep)
	if len(sec.Rows) != 10 || sec.Rows[9][0] != "minimal (10s run)" || sec.Rows[9][2] != "isolate-leader" {
		t.Fatalf("expected 9 original rows and 1 minimal (isolate-leader), found %v", sec.Rows)
	}
	if err := st.Run.WriteSection("shrink", sec); err != nil {
		t.Fatal(err)
	}
	if err := st.Run.WriteReport(st.Results); err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(st.Run.Path(report.ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<h2>Shrunk schedule</h2>", "1 of 9 fault episodes", "<td>minimal (10s run)</td>"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("expected report.html to contain %q", want)
		}
	}
}
