package report

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// mustContainLines checks that each pattern matches some line of out.
func mustContainLines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for _, p := range patterns {
		re := regexp.MustCompile(p)
		found := false
		for _, l := range lines {
			if re.MatchString(l) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("expected a line matching %q in:\n%s", p, out)
		}
	}
}

func TestSummaryOfTestdataRun(t *testing.T) {
	run := testdataRun(t)
	res := checkRun(t, run)
	var b bytes.Buffer
	if err := Summary(&b, res, run); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	mustContainLines(t, out,
		`^verdict: INVALID  test ledger-partition$`,
		`^  ledger +false +1 of 3 acknowledged ids lost`,
		`^  stats +true +write 3 ok/1 fail/1 info$`,
		`^lost writes: 1 of 3 acknowledged ids$`,
		`^  e-3  acked by n1 seq 22 term 3 at 0\.900s; sent to n1 by process 0 at 0\.750s$`,
		`^      missing on n3, present on n1,n2$`,
		`^      fault: partition\(isolate-one\) 0\.300s\.\.1\.650s on n3$`,
		`^follower lag \(ok/OVER SLO judges the p99 outside faults against 2s; every catch-up after a heal must take ≤ 2s\):$`,
		`^  n3 +p99 .*outside faults: p99 `,
		`^ops: write 3 ok/1 fail/1 info$`,
		`^  \(one op is one request; a write op may carry many event ids.*info: outcome unknown`,
		`^faults: partition ×1$`,
		`^store: `+regexp.QuoteMeta(run.Dir())+`$`,
	)
	if strings.Contains(out, "\x1b[") {
		t.Errorf("expected no terminal colour codes")
	}
	if n := strings.Count(out, "\n"); n > 40 {
		t.Errorf("expected a compact summary, found %d lines", n)
	}
}

// The summary reads the same from fresh results and from results.json.
func TestSummaryFromStoredResults(t *testing.T) {
	run := testdataRun(t)
	res := checkRun(t, run)
	if err := run.WriteResults(run.NewResults(res, time.Now())); err != nil {
		t.Fatal(err)
	}
	stored, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	var fresh, again bytes.Buffer
	if err := Summary(&fresh, res, run); err != nil {
		t.Fatal(err)
	}
	if err := Summary(&again, stored.Checker(), run); err != nil {
		t.Fatal(err)
	}
	if fresh.String() != again.String() {
		t.Errorf("expected the same summary;\nfresh:\n%s\nstored:\n%s", fresh.String(), again.String())
	}
}

func TestSummaryListsFirstFewAnomalies(t *testing.T) {
	var d checker.LedgerDetails
	d.Acked = 100
	for i := range 12 {
		d.Lost.Count++
		d.Lost.Examples = append(d.Lost.Examples, checker.LostWrite{
			WriteRef:  checker.WriteRef{ID: "w-" + string(rune('a'+i)), Process: history.Process(i), Node: "n2", Time: int64(i) * 1e9},
			Ack:       checker.Ack{Node: "n2", Seq: uint64(40 + i), Term: 4, Time: int64(i)*1e9 + 5e6},
			MissingOn: []string{"n1", "n3"},
		})
	}
	d.Dup = checker.Anomalies[checker.DuplicatedID]{Count: 1, Examples: []checker.DuplicatedID{{ID: "w-z", Reason: "twice-on-node", Indexes: map[string][]uint64{"n1": {7, 9}}}}}
	d.FailedApp = checker.Anomalies[checker.LandedWrite]{Count: 1, Examples: []checker.LandedWrite{{WriteRef: checker.WriteRef{ID: "w-f", Node: "n1"}, Outcome: history.Fail, Index: 77, PresentOn: []string{"n1"}}}}
	counter := checker.CounterDetails{Reads: 50}
	counter.Violations = checker.Anomalies[checker.CounterViolation]{Count: 1, Examples: []checker.CounterViolation{{Key: 3, Value: 5, Lower: 6, Upper: 9, Node: "n3", Start: 2e9, End: 3e9}}}
	lin := checker.LinearizableDetails{Illegal: 1, Keys: []checker.KeyLinearizability{{Key: 3, Ops: 40, Result: "illegal", Visualization: "/nowhere/linearizable-3.html"}, {Key: 4, Result: "ok"}}}
	conv := checker.ConvergenceDetails{Groups: map[uint64]map[string][]string{10: {"aaaa": {"n1", "n2"}, "bbbb": {"n3"}}}}
	lag := checker.LagDetails{SLO: checker.DefaultSLO(),
		Followers: []checker.FollowerLag{{Node: "n2", P99OK: true, Overall: checker.LagStats{P99Ms: 80, MaxMs: 300}}, {Node: "n3", Overall: checker.LagStats{P99Ms: 2500, MaxMs: 9000}, Outside: checker.LagStats{P99Ms: 2500, Samples: 90}}},
		CatchUps:  []checker.CatchUp{{Node: "n3", Fault: "kill(one)", HealedAt: 5e9, CaughtUpAt: -1, Ms: -1}, {Node: "n2", Fault: "kill(one)", HealedAt: 5e9, CaughtUpAt: 5.4e9, Ms: 400, OK: true}}}
	res := checker.NewResults(
		checker.Result{Name: "ledger", Valid: checker.Invalid, Summary: "12 lost", Details: d},
		checker.Result{Name: "counter", Valid: checker.Invalid, Summary: "1 bad read", Details: counter},
		checker.Result{Name: "linearizable", Valid: checker.Invalid, Summary: "key 3", Details: lin},
		checker.Result{Name: "convergence", Valid: checker.Invalid, Summary: "diverged", Details: conv},
		checker.Result{Name: "lag", Valid: checker.Invalid, Summary: "slow\nfollower", Details: lag},
	)
	var b bytes.Buffer
	if err := Summary(&b, res, nil); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	mustContainLines(t, out,
		`^verdict: INVALID$`,
		`^  lag +false +slow follower$`,
		`^lost writes: 12 of 100 acknowledged ids \(first 5\)$`,
		`^  w-e  acked by n2 seq 44 term 4 at 4\.005s`,
		`^      faults within 5s: none$`,
		`^duplicated ids: 1$`,
		`^  w-z  twice-on-node  n1 at \[7 9\]$`,
		`^failed writes that were applied: 1$`,
		`^  w-f  fail write sent to n1 .* index 77 on n1$`,
		`^counter reads out of bounds: 1 of 50$`,
		`^  key 3 read 5, allowed 6\.\.9; process 0 on n3, 2\.000s\.\.3\.000s$`,
		`^  key 3 not linearizable \(40 ops\); see /nowhere/linearizable-3\.html$`,
		`^  n1,n2 at index 10: aaaa$`,
		`^  n3 at index 10: bbbb$`,
		`^  n3 +p99 2\.5s +max 9s .*OVER SLO$`,
		`^  n2 +p99 80ms .* ok$`,
		`^  n3 never caught up after the heal of kill\(one\) at 5\.000s$`,
		`^  slowest catch-up within the SLO: n2, 400ms after the heal of kill\(one\) at 5\.000s$`,
	)
	if strings.Contains(out, "w-f  acked") || strings.Count(out, "acked by") != 5 {
		t.Errorf("expected exactly 5 lost writes listed, found %d", strings.Count(out, "acked by"))
	}
	if strings.Contains(out, "store:") {
		t.Errorf("expected no store line without a run")
	}
}
