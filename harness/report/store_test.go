package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

func readlink(t *testing.T, path string) string {
	t.Helper()
	target, err := os.Readlink(path)
	if err != nil {
		t.Fatalf("expected %s to be a symlink: %v", path, err)
	}
	return target
}

func TestNewRunLayoutAndLatest(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2026, 11, 30, 17, 55, 2, 591_400_000, time.FixedZone("CET", 3600))
	first, err := NewRun(root, "ledger-partition", t0)
	if err != nil {
		t.Fatal(err)
	}
	// The timestamp is UTC, millisecond precision.
	wantDir := filepath.Join(root, "ledger-partition", "20261130T165502.591Z")
	if first.Dir() != wantDir {
		t.Fatalf("expected run directory %s, found %s", wantDir, first.Dir())
	}
	if st, err := os.Stat(first.NodesDir()); err != nil || !st.IsDir() {
		t.Fatalf("expected %s to exist as a directory: %v", first.NodesDir(), err)
	}
	if got := readlink(t, filepath.Join(root, "latest")); got != filepath.Join("ledger-partition", "20261130T165502.591Z") {
		t.Errorf("expected <root>/latest -> ledger-partition/20261130T165502.591Z (relative), found %s", got)
	}
	if got := readlink(t, filepath.Join(root, "ledger-partition", "latest")); got != "20261130T165502.591Z" {
		t.Errorf("expected <root>/<test>/latest -> 20261130T165502.591Z, found %s", got)
	}

	// A second run in the same millisecond gets its own directory; a run
	// of another test moves the root latest but not the first test's.
	same, err := NewRun(root, "ledger-partition", t0)
	if err != nil {
		t.Fatal(err)
	}
	if same.Dir() == first.Dir() || !strings.HasPrefix(filepath.Base(same.Dir()), "20261130T165502.591Z-") {
		t.Fatalf("expected a distinct, suffixed directory for a run in the same millisecond, found %s", same.Dir())
	}
	other, err := NewRun(root, "counter", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for link, want := range map[string]string{
		filepath.Join(root, "latest"):                     other.Dir(),
		filepath.Join(root, "ledger-partition", "latest"): same.Dir(),
		filepath.Join(root, "counter", "latest"):          other.Dir(),
	} {
		opened, err := OpenRun(link)
		if err != nil {
			t.Fatalf("opening %s: %v", link, err)
		}
		if opened.Dir() != want {
			t.Errorf("expected %s to open %s, found %s", link, want, opened.Dir())
		}
	}
	// Directory names sort chronologically; no temporary links are left.
	entries, err := os.ReadDir(filepath.Join(root, "ledger-partition"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"20261130T165502.591Z", "20261130T165502.591Z-1", "latest"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("expected entries %v, found %v", want, names)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 3 {
		t.Errorf("expected counter/, ledger-partition/ and latest in the root, found %d entries", len(entries))
	}

	// The store survives being moved: links are relative.
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(root, moved); err != nil {
		t.Fatal(err)
	}
	opened, err := OpenRun(filepath.Join(moved, "latest"))
	if err != nil {
		t.Fatalf("opening latest in a moved store: %v", err)
	}
	if opened.Test() != "counter" || !opened.Started().Equal(t0.Add(time.Minute).Truncate(time.Millisecond)) {
		t.Errorf("expected test counter started %v, found %s started %v", t0.Add(time.Minute), opened.Test(), opened.Started())
	}
}

func TestNewRunRejectsBadTestNames(t *testing.T) {
	for _, name := range []string{"", ".", "..", "latest", "a/b", `a\b`} {
		if _, err := NewRun(t.TempDir(), name, time.Now()); err == nil {
			t.Errorf("expected test name %q to be rejected", name)
		}
	}
}

func TestOpenRunRejectsNonRuns(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenRun(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("expected an error opening a missing directory")
	}
	if _, err := OpenRun(dir); err == nil || !strings.Contains(err.Error(), "history.jsonl") {
		t.Errorf("expected an error naming the missing history.jsonl, found %v", err)
	}
}

func TestResultsRoundTrip(t *testing.T) {
	run, err := NewRun(t.TempDir(), "roundtrip", time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if err := run.WriteSeed(-9071); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{"nodes": 5.0, "nemesis": []any{"partition", "kill"}}
	if err := run.WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ledger := checker.LedgerDetails{Nodes: []string{"n1", "n2"}, Outcomes: map[history.Type]int{history.OK: 2}, Acked: 2}
	ledger.Lost.Count = 1
	ledger.Lost.Examples = []checker.LostWrite{{WriteRef: checker.WriteRef{ID: "w-1", Process: 3, Node: "n1", Time: 5},
		Ack: checker.Ack{Node: "n1", Seq: 9, Term: 2, Time: 7}, MissingOn: []string{"n2"}}}
	res := checker.Results{Valid: checker.Valid, Results: []checker.Result{ // Valid deliberately wrong
		{Name: "ledger", Valid: checker.Invalid, Summary: "1 of 2 lost", Details: ledger},
		{Name: "lag", Valid: checker.Unknown, Summary: "no status samples"},
	}}
	rr := run.NewResults(res, run.Started().Add(90*time.Second))
	if err := run.WriteResults(rr); err != nil {
		t.Fatal(err)
	}

	raw, err := os.ReadFile(run.Path(ResultsFile))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"valid": "false", "test": `"roundtrip"`, "seed": "-9071", "started": `"2026-01-02T03:04:05.006Z"`, "ended": `"2026-01-02T03:05:35.006Z"`} {
		if string(top[key]) != want {
			t.Errorf("results.json %s: expected %s, found %s", key, want, top[key])
		}
	}

	got, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Valid != checker.Invalid || got.Test != "roundtrip" || got.Seed != -9071 || !got.Ended.Equal(rr.Ended) || !got.Started.Equal(rr.Started) {
		t.Errorf("read back %+v, expected the fields written: %+v", got, rr)
	}
	var gotCfg map[string]any
	if err := json.Unmarshal(got.Config, &gotCfg); err != nil || !reflect.DeepEqual(gotCfg, cfg) {
		t.Errorf("expected config %v, found %s (%v)", cfg, got.Config, err)
	}
	if len(got.Results) != 2 || got.Results[1].Valid != checker.Unknown || got.Results[1].Details != nil {
		t.Fatalf("expected both results back, the second unknown without details, found %+v", got.Results)
	}
	back, ok := detailsAs[checker.LedgerDetails](got.Results[0])
	if !ok || !reflect.DeepEqual(back, ledger) {
		t.Errorf("expected the ledger details back:\nwant %+v\nfound %+v", ledger, back)
	}

	// Atomic: nothing but the file itself is left behind.
	leftovers, _ := filepath.Glob(filepath.Join(run.Dir(), ".*"))
	if len(leftovers) > 0 {
		t.Errorf("expected no temporary files, found %v", leftovers)
	}
}

func TestWriteResultsEmptyIsUnknown(t *testing.T) {
	run, err := NewRun(t.TempDir(), "empty", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := run.WriteResults(RunResults{Valid: checker.Valid}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(run.Path(ResultsFile))
	if !strings.Contains(string(raw), `"valid": "unknown"`) || !strings.Contains(string(raw), `"results": []`) {
		t.Errorf("expected a run with no results to be unknown with an empty list, found %s", raw)
	}
}

func TestLagWriterConcurrentAndTornTail(t *testing.T) {
	run, err := NewRun(t.TempDir(), "lag", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lw, err := run.LagWriter()
	if err != nil {
		t.Fatal(err)
	}
	const perNode = 500
	var wg sync.WaitGroup
	for n := 1; n <= 3; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perNode {
				s := checker.LagSample{Time: int64(i) * 1e6, Node: fmt.Sprintf("n%d", n), ID: uint64(n), Leader: 1, Commit: uint64(i), Applied: uint64(i),
					Members: []checker.MemberMatch{{ID: 1, Match: uint64(i)}}}
				if err := lw.Append(s); err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					if err := lw.Flush(); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lw.Close(); err != nil {
		t.Errorf("expected a second Close to be a no-op, found %v", err)
	}
	if err := lw.Append(checker.LagSample{}); err == nil {
		t.Errorf("expected Append after Close to fail")
	}
	got, err := run.ReadLag()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3*perNode {
		t.Fatalf("expected %d samples, found %d", 3*perNode, len(got))
	}
	last := map[string]int64{"n1": -1, "n2": -1, "n3": -1}
	for _, s := range got {
		if s.Time <= last[s.Node] {
			t.Fatalf("node %s: samples out of order at %d", s.Node, s.Time)
		}
		last[s.Node] = s.Time
		if len(s.Members) != 1 || s.Members[0].Match != s.Commit {
			t.Fatalf("sample %+v: members not round-tripped", s)
		}
	}

	// A crash mid-line leaves a torn tail: dropped. A bad line in the
	// middle is an error naming it.
	f, err := os.OpenFile(run.Path(LagFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"time":99,"node":"n`)
	f.Close()
	if got, err := run.ReadLag(); err != nil || len(got) != 3*perNode {
		t.Errorf("expected the torn tail dropped and %d samples, found %d, %v", 3*perNode, len(got), err)
	}
	if err := os.WriteFile(run.Path(LagFile), []byte("{\"time\":1}\nnot json\n{\"time\":2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run.ReadLag(); err == nil || !strings.Contains(err.Error(), "lag.jsonl:2") {
		t.Errorf("expected an error naming lag.jsonl:2, found %v", err)
	}
}

func TestStoreFilesRoundTrip(t *testing.T) {
	run, err := NewRun(t.TempDir(), "files", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := run.ReadLag(); err != nil || got != nil {
		t.Errorf("expected no lag file to be no samples, found %v, %v", got, err)
	}
	if got, err := run.ReadAudits(); err != nil || len(got) != 0 {
		t.Errorf("expected no audits to be empty, found %v, %v", got, err)
	}

	digests := map[string]checker.DigestSample{"n1": {AppliedIndex: 7, Digest: "ab"}, "n2": {AppliedIndex: 7, Digest: "ab"}}
	if err := run.WriteDigests(digests); err != nil {
		t.Fatal(err)
	}
	if got, err := run.ReadDigests(); err != nil || !reflect.DeepEqual(got, digests) {
		t.Errorf("expected digests %v, found %v, %v", digests, got, err)
	}

	type fault struct {
		At   time.Duration `json:"at"`
		Kind string        `json:"kind"`
	}
	schedule := []fault{{At: time.Second, Kind: "partition"}, {At: 3 * time.Second, Kind: "kill"}}
	if err := run.WriteSchedule(schedule); err != nil {
		t.Fatal(err)
	}
	var gotSchedule []fault
	if err := run.ReadSchedule(&gotSchedule); err != nil || !reflect.DeepEqual(gotSchedule, schedule) {
		t.Errorf("expected schedule %v, found %v, %v", schedule, gotSchedule, err)
	}

	if err := run.WriteSeed(1<<62 + 3); err != nil {
		t.Fatal(err)
	}
	if seed, err := run.ReadSeed(); err != nil || seed != 1<<62+3 {
		t.Errorf("expected seed %d, found %d, %v", int64(1<<62+3), seed, err)
	}
	if err := os.WriteFile(run.Path(SeedFile), []byte("0x12\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run.ReadSeed(); err == nil || !strings.Contains(err.Error(), `"0x12"`) {
		t.Errorf("expected an error quoting the bad seed, found %v", err)
	}

	audit := `{"id":"e-1","index":21,"term":3,"entity":101,"signal":"like"}` + "\n" + `{"id":"e-2","index":22,"term":3,"entity":102,"signal":"like"}` + "\n"
	if err := run.WriteAudit("n1", strings.NewReader(audit)); err != nil {
		t.Fatal(err)
	}
	if err := run.WriteAudit("../n2", strings.NewReader(audit)); err == nil {
		t.Errorf("expected a node name with a separator to be rejected")
	}
	// An audit whose body fails midway leaves no file behind.
	if err := run.WriteAudit("n3", &failingReader{data: audit}); err == nil {
		t.Errorf("expected a failing body to fail the write")
	}
	audits, err := run.ReadAudits()
	if err != nil {
		t.Fatal(err)
	}
	if len(audits) != 1 || len(audits["n1"]) != 2 || audits["n1"][1].Index != 22 {
		t.Errorf("expected n1's two entries only, found %+v", audits)
	}
	if entries, _ := os.ReadDir(filepath.Join(run.Dir(), auditsDir)); len(entries) != 1 {
		t.Errorf("expected only n1.ndjson in audits/, found %d entries", len(entries))
	}

	// Node files: logs listed, data directory not.
	if err := os.MkdirAll(filepath.Join(run.NodeDir("n1"), "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node.log", "stats.jsonl"} {
		if err := os.WriteFile(filepath.Join(run.NodeDir("n1"), f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := run.NodeFiles()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string][]string{"n1": {"nodes/n1/node.log", "nodes/n1/stats.jsonl"}}; !reflect.DeepEqual(files, want) {
		t.Errorf("expected node files %v, found %v", want, files)
	}
}

type failingReader struct {
	data string
	done bool
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, fmt.Errorf("connection reset by peer")
	}
	r.done = true
	return copy(p, r.data[:len(r.data)/2]), nil
}
