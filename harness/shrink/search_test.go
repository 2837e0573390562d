package shrink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
)

var lost = Anomaly{Checker: "ledger", Kind: "acknowledged write lost"}

// tenEpisodes is a 60s schedule of ten 4s faults, one every 5s from 5s:
// partitions and pauses alternating (kill-minority on 5 nodes at 3 and 7).
func tenEpisodes() Candidate {
	var s nemesis.Schedule
	s.Config.Nodes = []string{"n1", "n2", "n3", "n4", "n5"}
	for i := range 10 {
		st := nemesis.Step{At: time.Duration(5+5*i) * time.Second, Duration: 4 * time.Second, Kind: "isolate-leader"}
		switch {
		case i == 3 || i == 7:
			st.Kind, st.Targets = "kill-minority", []string{"n2", "n4"}
		case i%2 == 1:
			st.Kind, st.Targets = "pause-one", []string{fmt.Sprintf("n%d", i%5+1)}
		}
		s.Steps = append(s.Steps, st)
	}
	return FromSchedule(s, 60*time.Second)
}

// fakeOracle answers by a predicate over the candidate and how many
// times this very schedule has been run before (0 on its first run), and
// counts runs per schedule hash.
type fakeOracle struct {
	fails func(c Candidate, prior int) bool
	runs  map[string]int
	total int
	tick  func() // called on every run (a fake clock's advance)
}

func (f *fakeOracle) Run(_ context.Context, c Candidate) (Verdict, error) {
	if f.runs == nil {
		f.runs = map[string]int{}
	}
	h := c.Hash()
	prior := f.runs[h]
	f.runs[h]++
	f.total++
	if f.tick != nil {
		f.tick()
	}
	if f.fails(c, prior) {
		return Verdict{Valid: checker.Invalid, Signature: Signature{lost, {Checker: "convergence", Kind: "diverged"}}}, nil
	}
	return Verdict{Valid: checker.Valid}, nil
}

func has(c Candidate, ids ...int) bool {
	for _, id := range ids {
		if !slices.Contains(c.IDs(), id) {
			return false
		}
	}
	return true
}

func episode(c Candidate, id int) Episode {
	for _, e := range c.Episodes {
		if e.ID == id {
			return e
		}
	}
	panic(fmt.Sprintf("no episode %d in %s", id, c))
}

func TestDdminFindsBothEpisodes(t *testing.T) {
	for _, n := range []int{2, 3, 8, 10, 16} {
		items := make([]int, n)
		for i := range items {
			items[i] = i
		}
		var tests int
		got := ddmin(items, func(s []int) bool {
			tests++
			return slices.Contains(s, 0) && slices.Contains(s, n-1)
		})
		if !slices.Equal(got, []int{0, n - 1}) {
			t.Errorf("ddmin over %d items, fails iff the first and last are present: expected [0 %d], found %v", n, n-1, got)
		}
		if tests > n*n {
			t.Errorf("ddmin over %d items: expected at most %d tests, found %d", n, n*n, tests)
		}
	}
	if got := ddmin([]int{4, 5, 6}, func(s []int) bool { return slices.Contains(s, 5) }); !slices.Equal(got, []int{5}) {
		t.Errorf("ddmin, fails iff 5 is present: expected [5], found %v", got)
	}
}

func TestSearchDeterministic(t *testing.T) {
	o := &fakeOracle{fails: func(c Candidate, _ int) bool { return has(c, 3, 7) }}
	var progress bytes.Buffer
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Reproduced || rep.OriginalRuns != 3 || rep.OriginalFailures != 3 || rep.Flaky {
		t.Fatalf("expected the original reproduced 3 of 3 and not flaky, found reproduced %v %d of %d flaky %v", rep.Reproduced, rep.OriginalFailures, rep.OriginalRuns, rep.Flaky)
	}
	if got := rep.Minimal.IDs(); !slices.Equal(got, []int{3, 7}) {
		t.Fatalf("expected the minimum to be episodes [3 7], found %v (%s)", got, rep.Minimal)
	}
	// Every schedule was run as often as its trial says, and no more.
	for _, tr := range rep.Trials {
		if o.runs[tr.Hash] != len(tr.Runs) {
			t.Errorf("trial %s (%s): %d runs recorded, the oracle ran it %d times", tr.Hash, tr.Schedule, len(tr.Runs), o.runs[tr.Hash])
		}
		if tr.Outcome == Passes && len(tr.Runs) != 1 {
			t.Errorf("trial %s: a deterministic failure should reject with k=1, found %d runs", tr.Hash, len(tr.Runs))
		}
		if tr.Outcome == Fails && tr.Phase != "original" && len(tr.Runs) != 2 {
			t.Errorf("trial %s: a deterministic failure should keep a candidate after 2 failing runs, found %d runs", tr.Hash, len(tr.Runs))
		}
	}
	if o.total != rep.Runs {
		t.Errorf("expected the report to count the oracle's %d runs, found %d", o.total, rep.Runs)
	}
	if !strings.Contains(progress.String(), "ddmin") || !strings.Contains(progress.String(), "ledger/acknowledged write lost, convergence/diverged (same way)") {
		t.Errorf("expected a progress line per run naming the phase and the signature, found:\n%s", progress.String())
	}
}

func TestSearchShorteningPasses(t *testing.T) {
	// Fails iff episodes 3 and 7 are both present, 3 lasts at least 1s,
	// n4 is among 7's targets and 7 starts at 20s or later.
	o := &fakeOracle{fails: func(c Candidate, _ int) bool {
		if !has(c, 3, 7) {
			return false
		}
		e3, e7 := episode(c, 3), episode(c, 7)
		return e3.Step.Duration >= time.Second && slices.Contains(e7.Step.Targets, "n4") && e7.Step.At >= 20*time.Second
	}}
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost, Granularity: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Minimal
	if !slices.Equal(m.IDs(), []int{3, 7}) {
		t.Fatalf("expected episodes [3 7], found %s", m)
	}
	e3, e7 := episode(m, 3), episode(m, 7)
	if e3.Step.Duration != time.Second {
		t.Errorf("durations pass: expected episode 3 halved from 4s to 1s (500ms passes), found %s", e3.Step.Duration)
	}
	if !slices.Equal(e3.Step.Targets, []string{"n2"}) && !slices.Equal(e3.Step.Targets, []string{"n4"}) {
		t.Errorf("targets pass: expected episode 3 (kill-minority, any target) down to one target, found %v", e3.Step.Targets)
	}
	if !slices.Equal(e7.Step.Targets, []string{"n4"}) {
		t.Errorf("targets pass: expected episode 7 down to its one needed target n4, found %v", e7.Step.Targets)
	}
	if e7.Step.Duration != 500*time.Millisecond {
		t.Errorf("durations pass: expected episode 7 at the 500ms floor, found %s", e7.Step.Duration)
	}
	if e7.Step.At < 20*time.Second || e7.Step.At >= 20*time.Second+250*time.Millisecond {
		t.Errorf("offsets pass: expected episode 7 moved to within 250ms of 20s, found %s", e7.Step.At)
	}
	if e3.Step.At != 2*time.Second {
		t.Errorf("offsets pass: expected episode 3 moved to the 2s floor, found %s", e3.Step.At)
	}
	if want := (e7.End() + 5*time.Second + time.Second - 1).Truncate(time.Second); m.Duration != want {
		t.Errorf("length pass: expected the run cut to the last heal + 5s, rounded up (%s), found %s", want, m.Duration)
	}
	// The original's steps are untouched by the passes.
	if orig := episode(rep.Original, 7); orig.Step.At != 40*time.Second || len(orig.Step.Targets) != 2 {
		t.Errorf("expected the original episode 7 unchanged (40s, 2 targets), found %s", orig)
	}
}

func TestSearchFlakyMinimumIsKept(t *testing.T) {
	// Any schedule with 3 and 7 fails every other run: the minimum itself
	// passes first (worst case), larger ones fail first. The original's
	// three runs (fail, pass, fail) show the failure flaky, so a
	// candidate is rejected only after three passing runs.
	o := &fakeOracle{fails: func(c Candidate, prior int) bool {
		if !has(c, 3, 7) {
			return false
		}
		if len(c.Episodes) == 2 {
			return prior%2 == 1
		}
		return prior%2 == 0
	}}
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Flaky || rep.OriginalFailures != 2 || rep.OriginalRuns != 3 {
		t.Fatalf("expected the original to fail 2 of 3 runs and the failure marked flaky, found %d of %d, flaky %v", rep.OriginalFailures, rep.OriginalRuns, rep.Flaky)
	}
	if got := rep.Minimal.IDs(); !slices.Equal(got, []int{3, 7}) {
		t.Fatalf("expected the flaky minimum [3 7] kept, found %v", got)
	}
	for _, tr := range rep.Trials {
		if tr.Outcome == Passes && len(tr.Runs) != 3 {
			t.Errorf("trial %s (%s): a flaky failure should reject only after 3 runs, found %d", tr.Hash, tr.Schedule, len(tr.Runs))
		}
	}
}

// Regression: a flaky shortening kept on one failing run. The shrink of
// a planted ack-before-commit run kept isolate-leader@3s+750ms after one
// failure and the minimum then failed 2 of 3 repros.
func TestSearchKeepsOnlyAsReliableWhenDeterministic(t *testing.T) {
	t.Run("Regression: a flaky shortening kept on one failing run", testKeepsOnlyAsReliable)
}

func testKeepsOnlyAsReliable(t *testing.T) {
	// The original always fails; smaller schedules with 3 and 7 fail only
	// on their first run. Their confirming runs pass, so none is kept:
	// a reliable failure is never traded for a flaky one.
	o := &fakeOracle{fails: func(c Candidate, prior int) bool {
		if len(c.Episodes) == 10 {
			return true
		}
		return has(c, 3, 7) && prior == 0
	}}
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Flaky {
		t.Error("expected the failure judged deterministic from the original's 3 of 3")
	}
	if got := len(rep.Minimal.Episodes); got != 10 {
		t.Errorf("expected no candidate kept (each failed once, then passed), found %s", rep.Minimal)
	}
	for _, tr := range rep.Trials {
		if tr.Outcome == Fails && tr.Phase == "ddmin" {
			t.Errorf("trial %s (%s): expected rejected, found %s after %d runs", tr.Hash, tr.Schedule, tr.Outcome, len(tr.Runs))
		}
	}
}

func TestSearchCache(t *testing.T) {
	o := &fakeOracle{fails: func(c Candidate, _ int) bool { return has(c, 3) }}
	s := &search{o: Options{Oracle: o, Primary: lost}, cache: map[string]*Trial{}, rep: &Report{}}
	s.o.defaults()
	s.start = s.o.Now()
	c := tenEpisodes().Keep([]int{1, 2})
	same := tenEpisodes().Keep([]int{2, 1, 2}) // the same schedule reached another way
	if s.test(context.Background(), c) || s.test(context.Background(), same) {
		t.Fatal("expected a schedule without episode 3 to pass")
	}
	if o.total != 1 || s.rep.CacheHits != 1 || len(s.rep.Trials) != 1 {
		t.Errorf("expected one run and one cache hit for one schedule tested twice, found %d runs, %d hits, %d trials", o.total, s.rep.CacheHits, len(s.rep.Trials))
	}
	// A different duration is a different schedule.
	longer := c
	longer.Duration += time.Second
	s.test(context.Background(), longer)
	if o.total != 2 {
		t.Errorf("expected a run of the same faults with another duration, found %d runs in all", o.total)
	}
}

func TestSearchBudget(t *testing.T) {
	now := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	o := &fakeOracle{fails: func(c Candidate, _ int) bool { return has(c, 3, 7) }, tick: func() { now = now.Add(time.Minute) }}
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost, Budget: 12 * time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.BudgetExhausted || rep.Runs != 12 || o.total != 12 {
		t.Fatalf("expected the search to stop after 12 one-minute runs of a 12m budget, found exhausted %v, %d runs (oracle %d)", rep.BudgetExhausted, rep.Runs, o.total)
	}
	if !has(rep.Minimal, 3, 7) {
		t.Errorf("expected the best so far to still fail (hold 3 and 7), found %s", rep.Minimal)
	}
	if len(rep.Minimal.Episodes) >= 10 {
		t.Errorf("expected ddmin's runs within the budget to have found a smaller failing schedule, found %s", rep.Minimal)
	}
	if rep.Elapsed != "12m0s" {
		t.Errorf("expected elapsed 12m0s on the fake clock, found %s", rep.Elapsed)
	}
}

func TestSearchNotReproduced(t *testing.T) {
	o := &fakeOracle{fails: func(Candidate, int) bool { return false }}
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reproduced || rep.OriginalRuns != 3 || o.total != 3 {
		t.Fatalf("expected 3 runs of the original and no reproduction, found reproduced %v after %d runs", rep.Reproduced, o.total)
	}
	if len(rep.Minimal.Episodes) != 10 {
		t.Errorf("expected no minimum other than the original, found %s", rep.Minimal)
	}
}

func TestSearchOtherAnomalyIsNotTheSameWay(t *testing.T) {
	// Every run is INVALID, but only schedules with 3 and 7 lose writes;
	// the rest only have an outage. An outage is not the failure kept.
	o := OracleFunc(func(_ context.Context, c Candidate) (Verdict, error) {
		sig := Signature{{Checker: "availability", Kind: "outage"}}
		if has(c, 3, 7) {
			sig = append(Signature{lost}, sig...)
		}
		return Verdict{Valid: checker.Invalid, Signature: sig}, nil
	})
	rep, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Minimal.IDs(); !slices.Equal(got, []int{3, 7}) {
		t.Errorf("expected [3 7], found %v", got)
	}
}

func TestSearchOracleError(t *testing.T) {
	boom := errors.New("cluster never came up")
	o := OracleFunc(func(context.Context, Candidate) (Verdict, error) { return Verdict{}, boom })
	if _, err := Search(context.Background(), tenEpisodes(), Options{Oracle: o, Primary: lost}); !errors.Is(err, boom) {
		t.Errorf("expected the oracle's error, found %v", err)
	}
}
