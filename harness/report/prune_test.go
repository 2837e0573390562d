package report

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Regression: store/ grew to 1.5 GB with nothing to
// prune it. These tests pin `tidal-chaos prune` and the cap at the end of
// `tidal-chaos run`: the newest N runs of every test stay, and so do the
// run latest points to and any run whose owner is still running.

var pruneT0 = time.Date(2026, 11, 30, 17, 0, 0, 0, time.UTC)

// deadOwner writes an owner.json naming this process with a start time
// it does not have: what a pid reused by another process looks like, so
// the run is not live.
func deadOwner(t *testing.T, run *Run) {
	t.Helper()
	o := currentOwner()
	o.StartTicks--
	if err := run.writeJSON(OwnerFile, o); err != nil {
		t.Fatal(err)
	}
}

// prunableRun makes a finished run of test started at t0+minute with a
// file of size bytes in it.
func prunableRun(t *testing.T, root, test string, minute int, size int) *Run {
	t.Helper()
	run, err := NewRun(root, test, pruneT0.Add(time.Duration(minute)*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	deadOwner(t, run)
	if err := os.WriteFile(run.HistoryPath(), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	return run
}

func dirSizeOf(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := dirSize(dir)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func removedDirs(res PruneResult) []string {
	var out []string
	for _, r := range res.Removed {
		out = append(out, r.Dir)
	}
	slices.Sort(out)
	return out
}

func sortedDirs(runs ...*Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, r.Dir())
	}
	slices.Sort(out)
	return out
}

func TestPruneKeepsTheNewestRunsOfEveryTest(t *testing.T) {
	root := t.TempDir()
	var ledger []*Run
	for m := 1; m <= 5; m++ {
		ledger = append(ledger, prunableRun(t, root, "ledger", m, 1000*m))
	}
	counter := []*Run{prunableRun(t, root, "counter", 1, 10), prunableRun(t, root, "counter", 2, 10)}
	// A suite's store root one level down (store/chaos-suite/<test>/...).
	var suite []*Run
	for m := 1; m <= 4; m++ {
		suite = append(suite, prunableRun(t, filepath.Join(root, "chaos-suite"), "partitions", m, 100))
	}
	// Things in the store that are not runs: the pid registry, JUnit
	// reports, a suite's spec directories, a file at the top.
	notRuns := []string{
		filepath.Join(root, "pids", "1234.pid"),
		filepath.Join(root, "junit", "chaos.xml"),
		filepath.Join(root, "multiproc", "20261130T175502.591-kill-leader", "nodes", "n1", "node.log"),
		filepath.Join(root, "README"),
	}
	for _, p := range notRuns {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	want := sortedDirs(ledger[0], ledger[1], ledger[2], suite[0], suite[1])
	var wantFreed int64
	for _, d := range want {
		wantFreed += dirSizeOf(t, d)
	}

	res, err := Prune(root, PruneOptions{Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := removedDirs(res); !slices.Equal(got, want) {
		t.Fatalf("expected the 3 oldest ledger runs and the 2 oldest suite runs removed:\n  want %v\n  found %v", want, got)
	}
	if res.Freed != wantFreed {
		t.Errorf("expected %d bytes freed (the removed runs' files), found %d", wantFreed, res.Freed)
	}
	if res.Kept != 6 || len(res.Spared) != 0 {
		t.Errorf("expected 6 runs kept (2 of each test), none spared; found kept %d, spared %v", res.Kept, res.Spared)
	}
	for _, d := range want {
		if exists(d) {
			t.Errorf("expected %s removed, it is still there", d)
		}
	}
	for _, r := range []*Run{ledger[3], ledger[4], counter[0], counter[1], suite[2], suite[3]} {
		if !exists(r.Dir()) {
			t.Errorf("expected %s kept (among its test's newest 2), it was removed", r.Dir())
		}
	}
	for _, p := range notRuns {
		if !exists(p) {
			t.Errorf("expected %s untouched (not a run), it was removed", p)
		}
	}
	// The latest links still resolve.
	for _, link := range []string{filepath.Join(root, "latest"), filepath.Join(root, "ledger", "latest"), filepath.Join(root, "chaos-suite", "latest")} {
		if _, err := OpenRun(link); err != nil {
			t.Errorf("expected %s to still open a run: %v", link, err)
		}
	}
}

func TestPruneNeverRemovesTheRunLatestPointsTo(t *testing.T) {
	root := t.TempDir()
	newer := prunableRun(t, root, "ledger", 5, 10)
	// Made last, so ledger/latest and the root latest point at it,
	// although its timestamp is the oldest (a clock that stepped back).
	older := prunableRun(t, root, "ledger", 1, 10)
	res, err := Prune(root, PruneOptions{Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 0 {
		t.Fatalf("expected nothing removed (the older run is latest's target), found %v", removedDirs(res))
	}
	if len(res.Spared) != 1 || res.Spared[0].Dir != older.Dir() || !strings.Contains(res.Spared[0].Reason, "latest") {
		t.Fatalf("expected %s spared because latest points to it, found %+v", older.Dir(), res.Spared)
	}
	if !exists(newer.Dir()) || !exists(older.Dir()) {
		t.Fatal("expected both runs still in place")
	}

	// Keep 0 removes every run but latest's target.
	res, err = Prune(root, PruneOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	if got := removedDirs(res); !slices.Equal(got, []string{newer.Dir()}) || !exists(older.Dir()) {
		t.Fatalf("keep 0: expected only %s removed, found %v", newer.Dir(), got)
	}
}

func TestPruneNeverRemovesALiveRun(t *testing.T) {
	root := t.TempDir()
	// NewRun records this process as the owner: both runs are live.
	live, err := NewRun(root, "ledger", pruneT0)
	if err != nil {
		t.Fatal(err)
	}
	latest, err := NewRun(root, "ledger", pruneT0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// An owner that has exited: a child process, waited for.
	exited := prunableRun(t, root, "counter", 1, 10)
	child := exec.Command(os.Args[0], "-test.run=^$")
	if err := child.Run(); err != nil {
		t.Fatalf("running a child process to stand for an exited owner: %v", err)
	}
	if err := exited.writeJSON(OwnerFile, Owner{PID: child.Process.Pid, Started: 1, Host: currentOwner().Host}); err != nil {
		t.Fatal(err)
	}
	newerCounter := prunableRun(t, root, "counter", 2, 10)

	res, err := Prune(root, PruneOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	if got := removedDirs(res); !slices.Equal(got, []string{exited.Dir()}) {
		t.Fatalf("expected only the run whose owner exited removed (%s), found %v", exited.Dir(), got)
	}
	reasons := map[string]string{}
	for _, s := range res.Spared {
		reasons[s.Dir] = s.Reason
	}
	if !strings.Contains(reasons[live.Dir()], "live") || !strings.Contains(reasons[live.Dir()], "still running") {
		t.Errorf("expected %s spared as live, found reason %q", live.Dir(), reasons[live.Dir()])
	}
	for _, r := range []*Run{live, latest, newerCounter} {
		if !exists(r.Dir()) {
			t.Errorf("expected %s kept, it was removed", r.Dir())
		}
	}

	// An owner on another host cannot be checked: the run is kept.
	elsewhere := prunableRun(t, root, "counter", 0, 10)
	if err := elsewhere.writeJSON(OwnerFile, Owner{PID: child.Process.Pid, Started: 1, Host: "not-" + currentOwner().Host}); err != nil {
		t.Fatal(err)
	}
	prunableRun(t, root, "counter", 3, 10) // latest moves on
	res, err = Prune(root, PruneOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	if !exists(elsewhere.Dir()) {
		t.Fatalf("expected %s (owned by a process on another host) kept", elsewhere.Dir())
	}
	if i := slices.IndexFunc(res.Spared, func(k KeptRun) bool { return k.Dir == elsewhere.Dir() }); i < 0 || !strings.Contains(res.Spared[i].Reason, "live") {
		t.Errorf("expected %s spared as possibly live, found %+v", elsewhere.Dir(), res.Spared)
	}
}

func TestNewRunRecordsItsOwner(t *testing.T) {
	run, err := NewRun(t.TempDir(), "ledger", pruneT0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(run.Path(OwnerFile))
	if err != nil {
		t.Fatalf("expected NewRun to write %s: %v", OwnerFile, err)
	}
	var o Owner
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	if o.PID != os.Getpid() || o.Started == 0 || !o.alive() {
		t.Fatalf("expected this process (pid %d) as a live owner, found %+v (alive %v)", os.Getpid(), o, o.alive())
	}
}

func TestPruneOrdersSameMillisecondRunsBySuffixNumber(t *testing.T) {
	root := t.TempDir()
	var runs []*Run
	for range 11 { // stamp, stamp-1 ... stamp-10
		runs = append(runs, prunableRun(t, root, "ledger", 0, 10))
	}
	if filepath.Base(runs[10].Dir()) != "20261130T170000.000Z-10" {
		t.Fatalf("expected the 11th run of one millisecond to be ...-10, found %s", runs[10].Dir())
	}
	res, err := Prune(root, PruneOptions{Keep: 3})
	if err != nil {
		t.Fatal(err)
	}
	// -10, -9 and -8 are the newest; a lexical sort would keep -9, -8
	// and -7 (it puts -10 between -2 and -1).
	want := sortedDirs(runs[:8]...)
	if got := removedDirs(res); !slices.Equal(got, want) {
		t.Fatalf("expected all but ...-8, -9, -10 removed:\n  want %v\n  found %v", want, got)
	}
}

func TestPruneDryRunRemovesNothing(t *testing.T) {
	root := t.TempDir()
	a := prunableRun(t, root, "ledger", 1, 4096)
	prunableRun(t, root, "ledger", 2, 10)
	res, err := Prune(root, PruneOptions{Keep: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := removedDirs(res); !slices.Equal(got, []string{a.Dir()}) || res.Freed != dirSizeOf(t, a.Dir()) {
		t.Fatalf("dry run: expected to report %s (%d bytes), found %v (%d bytes)", a.Dir(), dirSizeOf(t, a.Dir()), got, res.Freed)
	}
	if !exists(a.Dir()) {
		t.Fatal("dry run: expected nothing removed")
	}
}

func TestPruneOfOneTestDirectory(t *testing.T) {
	root := t.TempDir()
	a := prunableRun(t, root, "ledger", 1, 10)
	b := prunableRun(t, root, "ledger", 2, 10)
	other := prunableRun(t, root, "counter", 1, 10)
	prunableRun(t, root, "counter", 2, 10)
	res, err := Prune(filepath.Join(root, "ledger"), PruneOptions{Keep: 0})
	if err != nil {
		t.Fatal(err)
	}
	// b is ledger/latest's target; the other test is outside the root.
	if got := removedDirs(res); !slices.Equal(got, []string{a.Dir()}) || !exists(b.Dir()) || !exists(other.Dir()) {
		t.Fatalf("expected only %s removed, found %v", a.Dir(), got)
	}
}

func TestPruneRefusesBadArguments(t *testing.T) {
	root := t.TempDir()
	if _, err := Prune(root, PruneOptions{Keep: -1}); err == nil || !strings.Contains(err.Error(), "-1") {
		t.Errorf("expected an error naming keep -1, found %v", err)
	}
	if _, err := Prune(filepath.Join(root, "absent"), PruneOptions{Keep: 1}); err == nil {
		t.Error("expected an error for a store root that does not exist")
	}
	file := filepath.Join(root, "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := Prune(file, PruneOptions{Keep: 1}); err == nil || !strings.Contains(err.Error(), "expected a directory") {
		t.Errorf("expected an error for a store root that is a file, found %v", err)
	}
}
