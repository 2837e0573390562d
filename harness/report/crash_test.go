package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// crashedRunResults are the results of a run in which n2 panicked and
// stayed down, and the isolate-leader faults never took effect.
func crashedRunResults() checker.Results {
	ev := checker.NodeEvidence{Nodes: []string{"n1", "n2", "n3"},
		Exits: []checker.ProcessExit{{Node: "n2", PID: 4242, Time: int64(7 * time.Second), Status: checker.ExitStatus{Code: 2, Text: "exit status 2"},
			Logs: []checker.LogTail{{Path: "nodes/n2/stdout.log", Lines: []string{"=== start", "panic: apply: index 7 out of order", "goroutine 1 [running]:"}}}}},
		Final: []checker.NodeFinal{
			{Node: "n1", State: "running", Alive: true, Serving: true},
			{Node: "n2", State: "running", Error: "its process is not running"},
			{Node: "n3", State: "running", Alive: true, Serving: true}}}
	nodes := checker.Nodes(nil, ev)
	var ops []history.Op
	add := func(typ history.Type, f, err string) {
		ops = append(ops, history.Op{Index: int64(len(ops)), Time: int64(len(ops)) * int64(time.Millisecond), Process: history.Nemesis, Type: typ, F: f,
			Value: []byte(`{"kind":"isolate-leader"}`), Error: err})
	}
	add(history.Invoke, history.FPartition, "")
	add(history.Fail, history.FPartition, "resolving the leader: no leader")
	faults := checker.Faults(ops, []checker.FaultKind{{Name: "isolate-leader", F: history.FPartition, Kind: "isolate-leader"}})
	return checker.NewResults(nodes, faults)
}

// report.html shows the crashed node
// with its exit status and the end of its log, and each requested fault
// kind with what became of it — fresh and read back from results.json.
func TestReportShowsCrashedNodesAndFaultKinds(t *testing.T) {
	run, err := NewRun(t.TempDir(), "crashed", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	res := crashedRunResults()
	if res.Valid != checker.Invalid {
		t.Fatalf("verdict %s, want false", res.Valid)
	}
	if err := run.WriteResults(run.NewResults(res, time.Now())); err != nil {
		t.Fatal(err)
	}
	stored, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	for name, rr := range map[string]RunResults{"fresh": run.NewResults(res, time.Now()), "stored": stored} {
		var b bytes.Buffer
		if err := RenderHTML(&b, Report{Results: rr, Dir: run.Dir()}); err != nil {
			t.Fatal(err)
		}
		text := parsePage(t, b.Bytes()).text
		for _, want := range []string{"Crashed nodes", "n2 panicked (exit status 2)", "pid 4242", "exit: exit status 2 , code 2",
			"panic: apply: index 7 out of order", "isolate-leader 1 0 0 1 0 resolving the leader: no leader"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s report.html: expected %q in the page, found:\n%s", name, want, text)
			}
		}
		if !strings.Contains(b.String(), `href="nodes/n2/stdout.log"`) {
			t.Errorf("%s report.html: expected a link to n2's log", name)
		}
	}

	var sum bytes.Buffer
	if err := Summary(&sum, stored.Checker(), run); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"verdict: INVALID", "crashed: n2 panicked (exit status 2) at 7.000s (pid 4242)", "    panic: apply: index 7 out of order",
		"fault kinds: isolate-leader 1 invoked/0 took effect/0 healed (first error: resolving the leader: no leader)"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary: expected %q, found:\n%s", want, sum.String())
		}
	}
}
