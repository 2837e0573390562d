package runner

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
)

// oldStore writes a run store as runs made before the aggregates and
// embeddings checkers existed left it: a mixed history whose reads carry
// no aggregates, whose puts no duplicate flag, with no per-node final
// reads, and (oldConfig) a config.json without the counter signal's
// schema. No audits, digests or lag samples either.
func oldStore(t *testing.T, oldConfig bool) *report.Run {
	t.Helper()
	run, err := report.NewRun(t.TempDir(), "old", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Test: "old", Nodes: 3, Workload: workload.Config{Kind: workload.Mixed}, LinearizableTimeout: Duration(time.Minute)}
	var raw any = cfg
	if oldConfig {
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		w := m["workload"].(map[string]any)
		delete(w, "CounterHalfLife")
		delete(w, "CounterWindows")
		raw = m
	}
	if err := run.WriteConfig(raw); err != nil {
		t.Fatal(err)
	}
	rec, err := history.Create(run.HistoryPath())
	if err != nil {
		t.Fatal(err)
	}
	key := workload.CounterBase
	add := rec.Invoke(0, history.FAdd, history.AddValue{Key: key, Delta: 2, IDs: []string{"C0.0"}}, "n1")
	rec.Complete(add, history.OK, nil, nil, 5, 2)
	read := rec.Invoke(0, history.FRead, history.ReadValue{Key: key}, "n2")
	two := int64(2)
	rec.Complete(read, history.OK, history.ReadValue{Key: key, Value: &two}, nil, 0, 0)
	put := rec.Invoke(1, history.FPutEmbedding, history.PutEmbeddingValue{Entity: workload.EmbeddingBase, ID: "E1.0", Dim: 3, Hash: "aa"}, "n1")
	rec.Complete(put, history.OK, nil, nil, 6, 2)
	get := rec.Invoke(1, history.FGetEmbedding, history.GetEmbeddingValue{Entity: workload.EmbeddingBase}, "n3")
	rec.Complete(get, history.OK, history.GetEmbeddingValue{Entity: workload.EmbeddingBase, Hash: "aa"}, nil, 0, 0)
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	return run
}

// Regression: `tidal-chaos analyze` of a store
// written before the aggregates and embeddings checkers existed lists
// both in results.json as unknown (the data they need is not there),
// never true, and does not fail.
func TestAnalyzeOldStore(t *testing.T) {
	for _, oldConfig := range []bool{false, true} {
		run := oldStore(t, oldConfig)
		var cfg Config
		if err := run.ReadConfig(&cfg); err != nil {
			t.Fatal(err)
		}
		res, err := Analyze(run, cfg)
		if err != nil {
			t.Fatalf("old config %v: analyze: %v", oldConfig, err)
		}
		stored, err := run.ReadResults()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"aggregates", "embeddings"} {
			for where, rs := range map[string][]checker.Result{"returned": res.Results, "results.json": stored.Checker().Results} {
				r, err := named(rs, name)
				if err != nil {
					t.Fatalf("old config %v, %s: %v", oldConfig, where, err)
				}
				if r.Valid != checker.Unknown {
					t.Errorf("old config %v, %s: expected %s unknown, found %s: %s", oldConfig, where, name, r.Valid, r.Summary)
				}
			}
		}
		if res.Valid == checker.Valid {
			t.Errorf("old config %v: expected the composed verdict not valid, found %s", oldConfig, res.Valid)
		}
	}
}

func named(rs []checker.Result, name string) (checker.Result, error) {
	for _, r := range rs {
		if r.Name == name {
			return r, nil
		}
	}
	return checker.Result{}, errors.New("expected a result named " + name + ", found none")
}
