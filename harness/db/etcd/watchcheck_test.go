package etcd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
)

func watchRun(t *testing.T, files map[string]string) *report.Run {
	t.Helper()
	run, err := report.NewRun(t.TempDir(), "watch", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for node, body := range files {
		dir := run.NodeDir(node)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, WatchFile), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return run
}

// The watch checker says true of watchers that
// saw every append once in order across a reconnect, and false of a gap,
// a duplicate, an event out of order and a phantom.
func TestCheckWatch(t *testing.T) {
	audits := map[string][]checker.AuditEntry{"n1": {{ID: "a", Index: 2}, {ID: "b", Index: 3}, {ID: "c", Index: 3}, {ID: "d", Index: 5}}}
	// b and c share revision 3 (one txn); the watcher resumes at 4 after a cut.
	good := `{"start":1}
{"key":"tidal/append/a","rev":2}
{"key":"tidal/append/b","rev":3}
{"key":"tidal/append/c","rev":3}
{"error":"cut"}
{"start":4}
{"key":"tidal/append/d","rev":5}
{"end":5}
`
	if r := CheckWatch(watchRun(t, map[string]string{"n1": good, "n2": good}), audits); r.Valid != checker.Valid {
		t.Fatalf("expected valid, found %s: %s", r.Valid, r.Summary)
	}
	cases := map[string]string{
		"missed": `{"start":1}
{"key":"tidal/append/a","rev":2}
{"key":"tidal/append/d","rev":5}
{"end":5}
`,
		"duplicated": good[:len(good)-len("{\"end\":5}\n")] + `{"key":"tidal/append/d","rev":5}
{"end":5}
`,
		"out-of-order": `{"start":1}
{"key":"tidal/append/b","rev":3}
{"key":"tidal/append/c","rev":3}
{"key":"tidal/append/a","rev":2}
{"key":"tidal/append/d","rev":5}
{"end":5}
`,
		"phantom": good[:len(good)-len("{\"end\":5}\n")] + `{"key":"tidal/append/zz","rev":6}
{"end":6}
`,
	}
	for kind, body := range cases {
		r := CheckWatch(watchRun(t, map[string]string{"n1": good, "n2": body}), audits)
		if r.Valid != checker.Invalid {
			t.Errorf("%s: expected invalid, found %s: %s", kind, r.Valid, r.Summary)
			continue
		}
		d := r.Details.(WatchDetails)
		found := false
		for _, a := range d.Anomalies.Examples {
			found = found || a.Kind == kind && a.Node == "n2"
		}
		if !found {
			t.Errorf("%s: expected an anomaly of that kind on n2, found %+v", kind, d.Anomalies)
		}
	}
	// A watcher that never reached the final revision: unknown.
	unfinished := `{"start":1}
{"key":"tidal/append/a","rev":2}
`
	if r := CheckWatch(watchRun(t, map[string]string{"n1": good, "n2": unfinished}), audits); r.Valid != checker.Unknown {
		t.Fatalf("expected unknown, found %s: %s", r.Valid, r.Summary)
	}
}
