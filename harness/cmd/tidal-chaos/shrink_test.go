package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/shrink"
	"github.com/tidaldb/tidal/usage"
)

// storedRun copies the shrink package's ledger-lost run into a temporary
// store with its verdict set to v.
func storedRun(t *testing.T, v checker.Validity) string {
	t.Helper()
	src := filepath.Join("..", "..", "shrink", "testdata", "ledger-lost")
	dir := filepath.Join(t.TempDir(), "store", "chaos", "20261206T045902.247Z")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run, err := report.OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	if v != checker.Invalid {
		rr.Results = []checker.Result{{Name: "ledger", Valid: v}}
	}
	if err := run.WriteResults(rr); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestShrinkRefusesARunThatDidNotFail(t *testing.T) {
	for _, v := range []checker.Validity{checker.Valid, checker.Unknown} {
		dir := storedRun(t, v)
		root := newRoot()
		var stdout, stderr bytes.Buffer
		root.SetOut(&stdout)
		root.SetErr(&stderr)
		root.SetArgs([]string{"shrink", dir})
		err := root.Execute()
		if got := exitCode(err); got != 2 {
			t.Errorf("shrink of a %s run: expected exit status 2, found %d (%v)", v, got, err)
		}
		word := map[checker.Validity]string{checker.Valid: "VALID", checker.Unknown: "UNKNOWN"}[v]
		if want := "nothing to shrink: run " + dir + " was " + word; !strings.Contains(stderr.String(), want) {
			t.Errorf("expected stderr to say %q, found %q", want, stderr.String())
		}
		// Nothing was made in the store for it.
		if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(dir)), "chaos-shrink")); err == nil {
			t.Errorf("expected no shrink directory for a %s run", v)
		}
	}
}

func TestShrinkUsageErrors(t *testing.T) {
	dir := storedRun(t, checker.Invalid)
	for _, args := range [][]string{
		{"shrink"},
		{"shrink", dir, "--runs", "0"},
		{"shrink", dir, "--budget", "-1m"},
		{"shrink", dir, "--budget", "soon"},
	} {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(args)
		err := root.Execute()
		if got := exitCode(err); got != usage.Code {
			t.Errorf("tidal-chaos %s: exit status %d (%v), expected %d", strings.Join(args, " "), got, err, usage.Code)
		}
	}
}

func TestShrinkSaysWhenTheFailureDidNotReproduce(t *testing.T) {
	dir := storedRun(t, checker.Invalid)
	st, err := shrink.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := newShrinkCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	printShrink(cmd, st, &shrink.Outcome{Dir: "store/chaos-shrink/x", Report: &shrink.Report{OriginalRuns: 3}})
	want := "the failure did not reproduce in 3 runs of the original schedule; nothing to shrink"
	if !strings.Contains(out.String(), want) {
		t.Errorf("expected %q, found %q", want, out.String())
	}
	if strings.Contains(out.String(), "replay:") {
		t.Errorf("expected no replay command without a minimum, found %q", out.String())
	}
}
