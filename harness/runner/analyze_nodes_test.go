package runner

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
)

// storedRun writes a 3-node ledger run into a fresh store: two acknowledged
// writes, and the audits and digests of the nodes in audited only.
func storedRun(t *testing.T, audited ...string) (*report.Run, Config) {
	t.Helper()
	run, err := report.NewRun(t.TempDir(), "analyze", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := history.Create(run.HistoryPath())
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"w1", "w2"} {
		inv := rec.Invoke(history.Process(i), history.FWrite, history.WriteValue{Events: []history.Event{{ID: id, Entity: 1, Signal: "view"}}}, "n1")
		rec.Complete(inv, history.OK, nil, nil, uint64(10+i), 2)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	digests := map[string]checker.DigestSample{}
	for _, n := range audited {
		if err := run.WriteAudit(n, strings.NewReader(`{"id":"w1","index":10,"term":2,"entity":1,"signal":"view"}`+"\n"+
			`{"id":"w2","index":11,"term":2,"entity":1,"signal":"view"}`+"\n")); err != nil {
			t.Fatal(err)
		}
		digests[n] = checker.DigestSample{AppliedIndex: 11, Digest: "ab"}
	}
	if err := run.WriteDigests(digests); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Test: "analyze", Nodes: 3, Workload: workload.Config{Kind: workload.Ledger}}
	if err := run.WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return run, cfg
}

func resultNamed(t *testing.T, res checker.Results, name string) checker.Result {
	t.Helper()
	for _, r := range res.Results {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no %s result among %v", name, res.Results)
	return checker.Result{}
}

func running(nodes ...string) []checker.NodeFinal {
	out := make([]checker.NodeFinal, len(nodes))
	for i, n := range nodes {
		out[i] = checker.NodeFinal{Node: n, State: "running", Alive: true, Serving: true}
	}
	return out
}

// Regression: when n3's audit could not be read, the
// runner filed n3 under "down", the ledger judged n1 and n2 only and
// convergence passed on their digests: VALID. 3 nodes with 2 audits is
// unknown — whether the store says why (nodes.json) or not.
func TestAnalyzeUnreadableAuditIsUnknown(t *testing.T) {
	run, cfg := storedRun(t, "n1", "n2")
	res, err := Analyze(run, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ledger", "convergence"} {
		if r := resultNamed(t, res, name); r.Valid != checker.Unknown || !strings.Contains(r.Summary, "n3") {
			t.Errorf("%s with n3's sample missing: expected unknown naming n3, found %s: %s", name, r.Valid, r.Summary)
		}
	}
	if res.Valid == checker.Valid {
		t.Fatalf("verdict %s with one node of three unaudited", res.Valid)
	}

	// With the runner's record: n3 ran and served, but its audit and
	// digest answered 500.
	why := "GET /v1/audit/events: 500 Internal Server Error"
	ev := checker.NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: running("n1", "n2", "n3"),
		AuditErrors: map[string]string{"n3": why}, DigestErrors: map[string]string{"n3": "GET /v1/audit/digest: 500 Internal Server Error"}}
	if err := run.WriteNodeEvidence(ev); err != nil {
		t.Fatal(err)
	}
	if res, err = Analyze(run, cfg); err != nil {
		t.Fatal(err)
	}
	if r := resultNamed(t, res, "ledger"); r.Valid != checker.Unknown || !strings.Contains(r.Summary, why) {
		t.Fatalf("ledger: expected unknown saying why n3 is missing, found %s: %s", r.Valid, r.Summary)
	}
	if r := resultNamed(t, res, "nodes"); r.Valid != checker.Valid {
		t.Fatalf("nodes: every node ran and served, found %s: %s", r.Valid, r.Summary)
	}
}

// A node that crashed makes its missing audit a failure, and one removed
// for good is the only node that may be left out.
func TestAnalyzeCrashedAndRemovedNodes(t *testing.T) {
	run, cfg := storedRun(t, "n1", "n2")
	crashed := checker.NodeEvidence{Nodes: []string{"n1", "n2", "n3"},
		Exits: []checker.ProcessExit{{Node: "n3", PID: 42, Time: int64(time.Second), Status: checker.ExitStatus{Code: 2, Text: "exit status 2"},
			Logs: []checker.LogTail{{Path: "nodes/n3/stdout.log", Lines: []string{"panic: boom"}}}}},
		Final:       append(running("n1", "n2"), checker.NodeFinal{Node: "n3", State: "running", Error: "its process is not running"}),
		AuditErrors: map[string]string{"n3": "not running after the final heal"}}
	if err := run.WriteNodeEvidence(crashed); err != nil {
		t.Fatal(err)
	}
	res, err := Analyze(run, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Valid != checker.Invalid {
		t.Fatalf("verdict with n3 crashed: expected false, found %s", res.Valid)
	}
	for _, name := range []string{"nodes", "ledger", "convergence"} {
		if r := resultNamed(t, res, name); r.Valid != checker.Invalid || !strings.Contains(r.Summary, "n3") {
			t.Errorf("%s: expected false naming n3, found %s: %s", name, r.Valid, r.Summary)
		}
	}
	// results.json and report.html carry the crash: node, exit status, log.
	rr, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	if rr.Valid != checker.Invalid {
		t.Fatalf("results.json valid %s", rr.Valid)
	}

	removed := checker.NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: append(running("n1", "n2"), checker.NodeFinal{Node: "n3", State: checker.NodeRemoved})}
	if err := run.WriteNodeEvidence(removed); err != nil {
		t.Fatal(err)
	}
	if res, err = Analyze(run, cfg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nodes", "ledger", "convergence"} {
		if r := resultNamed(t, res, name); r.Valid != checker.Valid {
			t.Errorf("%s with n3 removed for good: expected true, found %s: %s", name, r.Valid, r.Summary)
		}
	}
}
