package checker

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

func serving(nodes ...string) []NodeFinal {
	out := make([]NodeFinal, len(nodes))
	for i, n := range nodes {
		out[i] = NodeFinal{Node: n, State: "running", Alive: true, Serving: true}
	}
	return out
}

func nodesDetails(t *testing.T, r Result) NodesDetails {
	t.Helper()
	d, ok := r.Details.(NodesDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

var killed = ExitStatus{Code: -1, Signal: "killed", Text: "signal: killed"}

// A history in which the nemesis killed n1 at 1s and restarted it at 3s.
func killAndRestart(t *testing.T) *hist {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 10)
	h.at(time.Second)
	h.fault(history.FKill, history.FaultValue{Kind: "one", Targets: []string{"n1"}})
	h.at(3 * time.Second)
	h.heal(history.FKill)
	return h
}

func TestNodesKilledByTheNemesisAndRestartedIsNoCrash(t *testing.T) {
	h := killAndRestart(t)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n1", PID: 10, Time: int64(time.Second), Requested: true, Status: killed}}}
	r := Nodes(h.ops, ev)
	mustValid(t, r, Valid)
	if d := nodesDetails(t, r); d.Exits != 1 || d.Expected != 1 {
		t.Fatalf("exits %d expected %d, want 1 and 1", d.Exits, d.Expected)
	}
}

// Regression: a node that panicked after a restart and
// stayed down was listed as "not audited" and the verdict was VALID. A
// process that exits on its own — whatever its code — is a crash, with
// its exit status and the end of its log in the result.
func TestNodesCrashIsInvalid(t *testing.T) {
	h := killAndRestart(t)
	tail := []LogTail{{Path: "nodes/n1/stdout.log", Lines: []string{"=== start", "panic: apply: index 7 out of order", "goroutine 1 [running]:", "=== exit: exit status 2"}}}
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"},
		Exits: []ProcessExit{
			{Node: "n1", PID: 10, Time: int64(time.Second), Requested: true, Status: killed},
			{Node: "n1", PID: 11, Time: int64(4 * time.Second), Status: ExitStatus{Code: 2, Text: "exit status 2"}, Logs: tail},
		},
		Final: []NodeFinal{{Node: "n1", State: "running", Error: "its process is not running", Logs: tail}, serving("n2")[0], serving("n3")[0]}}
	r := Nodes(h.ops, ev)
	mustValid(t, r, Invalid)
	d := nodesDetails(t, r)
	if !reflect.DeepEqual(d.Crashed, []string{"n1"}) || len(d.Crashes) != 2 {
		t.Fatalf("crashed %v crashes %+v; want n1 twice (its exit, and down at the end)", d.Crashed, d.Crashes)
	}
	c := d.Crashes[0]
	if !c.Panic || c.Status == nil || c.Status.Code != 2 || c.PID != 11 || len(c.Logs) != 1 {
		t.Fatalf("crash %+v: want the panic, exit code 2, pid 11 and the log tail", c)
	}
	for _, want := range []string{"n1", "panicked", "exit status 2", "panic: apply: index 7 out of order"} {
		if !strings.Contains(r.Summary, want) {
			t.Errorf("summary %q does not mention %q", r.Summary, want)
		}
	}
	// What results.json will hold carries the evidence.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"crashed":["n1"]`, `"code":2`, `panic: apply`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("results JSON lacks %s: %s", want, b)
		}
	}
}

func TestNodesExitClassification(t *testing.T) {
	base := func() NodeEvidence {
		return NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3")}
	}
	for _, tc := range []struct {
		name string
		exit ProcessExit
		want Validity
	}{
		// A clean exit with nobody asking is still unexpected: the server's
		// own exit codes (removed, fenced) explain, they do not excuse.
		{"on its own, status 0", ProcessExit{Node: "n2", Status: ExitStatus{Code: 0, Text: "exit status 0"}}, Invalid},
		{"on its own, fenced code", ProcessExit{Node: "n2", Status: ExitStatus{Code: 75, Text: "exit status 75"}}, Invalid},
		{"killed behind the harness's back", ProcessExit{Node: "n2", Status: killed}, Invalid},
		{"stopped by the harness, clean", ProcessExit{Node: "n2", Requested: true, Status: ExitStatus{Code: 0, Text: "exit status 0"}}, Valid},
		{"stopped by the harness, but exited 2", ProcessExit{Node: "n2", Requested: true, Status: ExitStatus{Code: 2, Text: "exit status 2"}}, Invalid},
		{"killed by the harness after a panic", ProcessExit{Node: "n2", Requested: true, Status: killed,
			Logs: []LogTail{{Path: "x", Lines: []string{"fatal error: concurrent map writes"}}}}, Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := base()
			ev.Exits = []ProcessExit{tc.exit}
			mustValid(t, Nodes(nil, ev), tc.want)
		})
	}
}

// A node whose member the nemesis removed may exit on its own, with the
// server's own code for it: that is no crash, during the removal or after
// it (removed for good).
func TestNodesExitOfARemovedMember(t *testing.T) {
	h := newHist(t)
	h.at(time.Second)
	rm := h.invoke(history.Nemesis, history.FRemoveMember, history.FaultValue{Kind: "one", Targets: []string{"n3"}}, "")
	h.at(2 * time.Second)
	h.complete(rm, history.OK, nil)
	h.at(5 * time.Second)
	h.write(0, "w1", "n1", history.OK, 10)
	removedExit := ProcessExit{Node: "n3", Time: int64(1500 * time.Millisecond), Status: ExitStatus{Code: 3, Text: "exit status 3"}}
	final := append(serving("n1", "n2"), NodeFinal{Node: "n3", State: NodeRemoved})
	r := Nodes(h.ops, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Exits: []ProcessExit{removedExit}, Final: final})
	mustValid(t, r, Valid)
	if d := nodesDetails(t, r); !reflect.DeepEqual(d.Removed, []string{"n3"}) {
		t.Fatalf("removed %v", d.Removed)
	}
	// The same exit of n2, whose member nobody removed, is a crash.
	other := removedExit
	other.Node = "n2"
	mustValid(t, Nodes(h.ops, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Exits: []ProcessExit{other}, Final: final}), Invalid)
}

func TestNodesDownOrNotServingAfterTheFinalHeal(t *testing.T) {
	for _, f := range []NodeFinal{
		{Node: "n3", State: "killed", Error: "the final heal left it killed"},
		{Node: "n3", State: "paused", Alive: true, Error: "the final heal left it paused"},
		{Node: "n3", State: "running", Alive: true, Error: "GET /cluster/status: context deadline exceeded"},
	} {
		ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: append(serving("n1", "n2"), f)}
		r := Nodes(nil, ev)
		mustValid(t, r, Invalid)
		if !strings.Contains(r.Summary, "n3") {
			t.Errorf("%+v: summary %q does not name n3", f, r.Summary)
		}
	}
}

func TestNodesWithoutAFinalCheckIsUnknown(t *testing.T) {
	mustValid(t, Nodes(nil, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}}), Unknown)
	mustValid(t, Nodes(nil, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2")}), Unknown)
	mustValid(t, Nodes(nil, NodeEvidence{}), Unknown)
}

// Regression: when a running node's audit could not be
// read, the runner filed it under "down" and the ledger judged the other
// nodes only. Only nodes removed for good may be left out: 3 nodes with
// 2 audits is unknown, or invalid when the third crashed.
func TestLedgerMissingAuditIsNotValid(t *testing.T) {
	h, audits := ledgerRun(t)
	delete(audits, "n3")
	all := []string{"n1", "n2", "n3"}
	why := map[string]string{"n3": "GET /v1/audit/events: 500 Internal Server Error"}

	r := LedgerCovering(h.ops, audits, nil, Coverage{Nodes: all, Why: why})
	mustValid(t, r, Unknown)
	d := ledgerDetails(t, r)
	if !reflect.DeepEqual(d.Nodes, []string{"n1", "n2"}) || len(d.Missing) != 1 || d.Missing[0].Node != "n3" || d.Missing[0].Crashed {
		t.Fatalf("nodes %v missing %+v", d.Nodes, d.Missing)
	}
	if !strings.Contains(r.Summary, "n3") || !strings.Contains(r.Summary, "500 Internal Server Error") {
		t.Fatalf("summary %q: want the node and why its audit is missing", r.Summary)
	}

	mustValid(t, LedgerCovering(h.ops, audits, nil, Coverage{Nodes: all, Crashed: []string{"n3"}, Why: why}), Invalid)
	mustValid(t, LedgerCovering(h.ops, audits, nil, Coverage{Nodes: all, Removed: []string{"n3"}}), Valid)
	// A removed node's stale audit is ignored, not judged.
	audits["n3"] = []AuditEntry{entry("w1", 10)}
	mustValid(t, LedgerCovering(h.ops, audits, nil, Coverage{Nodes: all, Removed: []string{"n3"}}), Valid)
	// A lost write on the audited nodes is invalid whatever is missing.
	delete(audits, "n3")
	audits["n2"] = []AuditEntry{entry("w1", 10), entry("w3", 12)}
	mustValid(t, LedgerCovering(h.ops, audits, nil, Coverage{Nodes: all, Why: why}), Invalid)
	// No audit at all.
	mustValid(t, LedgerCovering(h.ops, nil, nil, Coverage{Nodes: all}), Unknown)
	mustValid(t, LedgerCovering(h.ops, nil, nil, Coverage{Nodes: all, Crashed: []string{"n1"}}), Invalid)
}

// Regression: convergence passed on a single digest.
func TestConvergenceMissingDigestIsNotValid(t *testing.T) {
	s := DigestSample{AppliedIndex: 10, Digest: "ab"}
	all := []string{"n1", "n2", "n3"}
	why := map[string]string{"n2": "GET /v1/audit/digest: timeout", "n3": "GET /v1/audit/digest: timeout"}

	r := ConvergenceCovering(map[string]DigestSample{"n1": s}, Coverage{Nodes: all, Why: why})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "n2") || !strings.Contains(r.Summary, "n3") {
		t.Fatalf("summary %q: want the nodes without a digest", r.Summary)
	}
	mustValid(t, ConvergenceCovering(map[string]DigestSample{"n1": s, "n2": s}, Coverage{Nodes: all, Crashed: []string{"n3"}}), Invalid)
	mustValid(t, ConvergenceCovering(map[string]DigestSample{"n1": s, "n2": s}, Coverage{Nodes: all, Removed: []string{"n3"}}), Valid)
	// A removed node's digest is not compared.
	mustValid(t, ConvergenceCovering(map[string]DigestSample{"n1": s, "n2": s, "n3": {AppliedIndex: 10, Digest: "old"}},
		Coverage{Nodes: all, Removed: []string{"n3"}}), Valid)
	// Divergence among what was read is invalid whatever is missing.
	mustValid(t, ConvergenceCovering(map[string]DigestSample{"n1": s, "n2": {AppliedIndex: 10, Digest: "cd"}}, Coverage{Nodes: all, Why: why}), Invalid)
	mustValid(t, ConvergenceCovering(nil, Coverage{Nodes: all}), Unknown)
}
