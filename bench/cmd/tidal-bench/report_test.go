package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/stress"
)

const benchOutput = `goos: linux
goarch: amd64
pkg: github.com/tidaldb/tidal/tidal-server/wal
cpu: AMD EPYC
BenchmarkAppend/size=1k-2   	   10000	    120000 ns/op	  8.50 MB/s	     512 B/op	       4 allocs/op	  3.000 entries/sync
BenchmarkAppend/size=1k-2   	   10000	    100000 ns/op	  10.2 MB/s	     512 B/op	       4 allocs/op	  5.000 entries/sync
BenchmarkAppend/size=1k-2   	   10000	    110000 ns/op	  9.30 MB/s	     512 B/op	       4 allocs/op	  4.000 entries/sync
PASS
ok  	github.com/tidaldb/tidal/tidal-server/wal	3.1s
pkg: github.com/tidaldb/tidal/tcp-relay/relay
BenchmarkAppend-2   	 5000	    2000 ns/op	     0 B/op	       0 allocs/op
--- FAIL: BenchmarkBroken
FAIL	github.com/tidaldb/tidal/tcp-relay/broken [build failed]
`

func TestParseBench(t *testing.T) {
	mr := parseBench([]byte(benchOutput))
	if len(mr.Results) != 2 {
		t.Fatalf("expected 2 benchmarks, found %+v", mr.Results)
	}
	wal, relay := mr.Results[0], mr.Results[1]
	if wal.Name != "tidal-server/wal.BenchmarkAppend/size=1k" || wal.Runs != 3 {
		t.Errorf("expected the wal benchmark named by package with 3 runs, found %q with %d", wal.Name, wal.Runs)
	}
	for unit, want := range map[string]float64{"ns/op": 110000, "MB/s": 9.3, "B/op": 512, "allocs/op": 4, "entries/sync": 4} {
		if got := wal.Medians[unit]; got != want {
			t.Errorf("wal %s: expected median %g, found %g", unit, want, got)
		}
	}
	if relay.Name != "tcp-relay/relay.BenchmarkAppend" || relay.Medians["ns/op"] != 2000 {
		t.Errorf("expected the same benchmark name in another package kept apart, found %+v", relay)
	}
	if mr.CPU != "AMD EPYC" {
		t.Errorf("expected the cpu line read, found %q", mr.CPU)
	}
	if len(mr.Failures) != 2 {
		t.Errorf("expected the failing benchmark and package recorded, found %q", mr.Failures)
	}
}

func TestTrimProcsAndMedian(t *testing.T) {
	for in, want := range map[string]string{"BenchmarkX-2": "BenchmarkX", "BenchmarkX/n=1-16": "BenchmarkX/n=1", "BenchmarkX/a-b": "BenchmarkX/a-b"} {
		if got := trimProcs(in); got != want {
			t.Errorf("trimProcs(%q): expected %q, found %q", in, want, got)
		}
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("expected median 2.5, found %g", m)
	}
}

func knee(events float64, p99 time.Duration) *workloadResult {
	return &workloadResult{
		Description: "single-event quorum writes", SLOP99: 20 * time.Millisecond, Target: 10000, TargetUnit: "events/s",
		Knee: &stress.StageResult{AchievedRate: events, AchievedEvents: events, Latency: stress.Latencies{P99: p99}},
	}
}

// TestSummaryComparesWithPrevious writes two results files and checks the
// newer one's summary names the older and its ratios.
func TestSummaryComparesWithPrevious(t *testing.T) {
	dir := t.TempDir()
	old := &results{Schema: 1, Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Env: env{Commit: "aaa"},
		Cluster: &clusterResults{Nodes: 3, Workloads: map[string]*workloadResult{"single": knee(2000, 10*time.Millisecond)}},
		Micro:   &microRun{Raw: "old.bench.txt", Results: []microResult{{Name: "p.BenchmarkX", Medians: map[string]float64{"ns/op": 200}}}},
	}
	older := &results{Schema: 1, Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), Env: env{Commit: "zzz"}}
	for name, r := range map[string]*results{"2026-01-01-aaa.json": old, "2025-01-01-zzz.json": older} {
		data, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "notes.json"), []byte(`{"unrelated":true}`), 0o644)

	prev, prevPath := previousResults(dir, "2026-02-01-bbb", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC))
	if prev == nil || filepath.Base(prevPath) != "2026-01-01-aaa.json" {
		t.Fatalf("expected the newest other results file, found %q", prevPath)
	}
	cur := &results{Schema: 1, Time: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), Env: env{Commit: "bbb", Cores: 2, CPUModel: "AMD EPYC"},
		Cluster: &clusterResults{Nodes: 3, Workloads: map[string]*workloadResult{"single": knee(3000, 5*time.Millisecond)}},
		Micro:   &microRun{Raw: "new.bench.txt", Results: []microResult{{Name: "p.BenchmarkX", Medians: map[string]float64{"ns/op": 100}}}},
	}
	md := summary(cur, prev, filepath.Base(prevPath), "benchstat table\n")
	for _, want := range []string{
		"compared with: 2026-01-01-aaa.json", "AMD EPYC, 2 cores",
		"| 3,000 |", "knee ×1.50, p99 ×0.50", "(30%)", "| ×0.50 |", "benchstat table",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("expected the summary to contain %q, found:\n%s", want, md)
		}
	}
	if _, again := previousResults(dir, "2026-01-01-aaa", old.Time); filepath.Base(again) != "2025-01-01-zzz.json" {
		t.Errorf("expected a run never to compare with its own file, found %q", again)
	}
	if p, _ := previousResults(dir, "x", older.Time); p != nil {
		t.Errorf("expected nothing before the oldest file, found %s", p.Env.Commit)
	}
}

func TestFmtRate(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 150000: "150,000", 1234567.4: "1,234,567"} {
		if got := fmtRate(in); got != want {
			t.Errorf("fmtRate(%g): expected %q, found %q", in, want, got)
		}
	}
}
